"""The `batchscope` console script: a command imports only its own module (not the other commands' stacks),
and its help lines are the components' own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from batchscope.cli import COMMANDS, build_parser, main


def test_the_top_level_help_lists_each_command_with_its_modules_own_line():
    # without argv every module builds its own parser: the lazy table must say the same, in the same order
    assert build_parser([]).format_help() == build_parser().format_help()


def test_an_unknown_command_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["bogus"])
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("batchscope: error: argument command: invalid choice: 'bogus'")


# which commands' modules a fresh interpreter has imported once the parser for one command is built
PROBE = """
import json, sys
from batchscope.cli import build_parser
build_parser([sys.argv[1]])
print(json.dumps(sorted(set(sys.modules) & set(json.loads(sys.argv[2])))))
"""


@pytest.mark.e2e
def test_a_command_imports_its_own_module_and_no_other_commands():
    modules = sorted({module for module, _ in COMMANDS.values()})
    for command, (module, _) in COMMANDS.items():
        out = subprocess.run([sys.executable, "-c", PROBE, command, json.dumps(modules)],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        assert json.loads(out) == [module], command
