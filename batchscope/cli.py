"""The `batchscope` console script: one entry point, one subcommand per component."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# command: (the module whose add_parser builds it, its line in `batchscope --help`). Only the chosen command's
# module is imported: each pulls in its own stack (aiohttp, Locust, matplotlib...), and a command starts in the
# time its own imports take. tests/batchscope/test_cli.py checks these lines against the modules' own.
COMMANDS = {
    "sim": ("batchscope.simulator.cli", "the vLLM-compatible simulator"),
    "load": ("batchscope.loadgen.cli",
             "send the fixed streaming load of a workload spec (Locust, headless or in its web UI)"),
    "exporter": ("batchscope.exporter.cli", "serve vLLM + client metrics + serving config as one target"),
    "tune": ("batchscope.tuner.cli", "run a tuning plan: one serving parameter changed at a time"),
    "report": ("batchscope.tuner.cli", "write the comparison report of a plan's results (with its MLPerf scenarios' "
                          "results), or of a scenario's alone"),
}


class OneLineParser(argparse.ArgumentParser):
    """Bad input gets one line naming the problem (no usage dump) and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: the chosen command in full, the others by name and help line only. Without
    ``argv``, every command in full."""
    parser = OneLineParser(prog="batchscope", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    # the top level takes no option with a value, so the first word that is not an option names the command
    chosen = None if argv is None else next((arg for arg in argv if not arg.startswith("-")), "")
    chosen_module = COMMANDS.get(chosen, ("",))[0] if chosen is not None else None
    for name, (module, help_text) in COMMANDS.items():
        if name in commands.choices:
            continue  # built with another command of its module (tune and report)
        if chosen_module is None or module == chosen_module:
            importlib.import_module(module).add_parser(commands)
        else:
            commands.add_parser(name, help=help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
