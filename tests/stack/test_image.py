"""The batchscope image (Dockerfile, .dockerignore), checked without a Docker engine: it builds offline and
holds every package any `batchscope` subcommand imports."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from batchscope.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
# what a subcommand imports of this checkout: its parser built (`--help`), then every file of the repository it
# loaded
IMPORTED = """
import json, sys
from pathlib import Path
from batchscope.cli import main
try:
    main([sys.argv[1], "--help"])
except SystemExit:
    pass
root = Path(sys.argv[2])
files = [Path(module.__file__) for module in list(sys.modules.values()) if getattr(module, "__file__", None)]
loaded = [file.relative_to(root) for file in files if file.is_relative_to(root)]
print(json.dumps(sorted(str(file) for file in loaded if not file.parts[0].startswith("."))))  # not .venv's
"""


@functools.cache
def image_sources() -> tuple[frozenset[str], frozenset[str]]:
    """The paths the Dockerfile copies from what .dockerignore lets into the build context, and those
    .dockerignore then leaves out again."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = {source.rstrip("/") for sources in re.findall(r"^COPY\s+(.+?)\s+\S+$", dockerfile, re.MULTILINE)
              for source in sources.split()}
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    left_out = {line.rstrip("/") for line in lines if line and line[0] not in "!#*"}
    return frozenset(copied & allowed), frozenset(left_out)


def in_image(path: str) -> bool:
    """Whether the image holds ``path`` (relative to the checkout)."""
    copied, left_out = image_sources()
    under = Path(path).is_relative_to
    return any(map(under, copied)) and not any(map(under, left_out))


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_module_a_subcommand_imports_is_in_the_image(command):
    """`batchscope tune` and `report` failed in the image: tuner/ was not copied."""
    out = subprocess.run([sys.executable, "-c", IMPORTED, command, str(ROOT)], capture_output=True, text=True,
                         timeout=120, check=True, cwd=ROOT).stdout
    loaded = json.loads(out.splitlines()[-1])  # after the help text
    component = Path(*COMMANDS[command][0].split(".")[:2])
    assert any(Path(path).is_relative_to(component) for path in loaded), f"{component} was not seen"
    assert [path for path in loaded if not in_image(path)] == [], f"batchscope {command} imports what the image lacks"


def test_the_test_support_stays_out_of_the_image():
    assert not in_image("batchscope/testkit/processes.py") and in_image("batchscope/tuner/plan/file.py")


def test_the_dockerfile_needs_no_frontend_from_docker_hub():
    """A `# syntax=` line makes BuildKit pull that frontend image at every build: offline, the build fails."""
    first_lines = (ROOT / "Dockerfile").read_text().splitlines()
    assert not any(re.match(r"#\s*syntax\s*=", line) for line in first_lines)
