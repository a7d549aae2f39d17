"""The batchscope image (Dockerfile, .dockerignore), checked without a Docker engine: it builds offline and
holds every package any `batchscope` subcommand imports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from batchscope.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
# what a subcommand imports of this checkout: its parser built (`--help`), then the top-level folder of every
# module it loaded from the repository
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
tops = {file.relative_to(root).parts[0] for file in files if file.is_relative_to(root)}
print(json.dumps(sorted(top for top in tops if not top.startswith("."))))  # not .venv's site-packages
"""


def copied_into_image() -> set[str]:
    """Top-level paths the Dockerfile copies that .dockerignore lets into the build context."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = {path.rstrip("/") for sources in re.findall(r"^COPY\s+(.+?)\s+\S+$", dockerfile, re.MULTILINE)
              for path in sources.split()}
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    return copied & allowed


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_package_a_subcommand_imports_is_in_the_image(command):
    """`batchscope tune` and `report` failed in the image: tuner/ was not copied."""
    out = subprocess.run([sys.executable, "-c", IMPORTED, command, str(ROOT)], capture_output=True, text=True,
                         timeout=120, check=True, cwd=ROOT).stdout
    imported = set(json.loads(out.splitlines()[-1]))  # after the help text
    assert imported - {"batchscope"}, "the subcommand's own package was not seen"
    assert not imported - copied_into_image(), f"batchscope {command} imports packages the image lacks"


def test_the_dockerfile_needs_no_frontend_from_docker_hub():
    """A `# syntax=` line makes BuildKit pull that frontend image at every build: offline, the build fails."""
    first_lines = (ROOT / "Dockerfile").read_text().splitlines()
    assert not any(re.match(r"#\s*syntax\s*=", line) for line in first_lines)
