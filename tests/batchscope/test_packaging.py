"""The wheel: one installed name (batchscope, the components its subpackages), its data files in, its test
support (batchscope/testkit) out. Built offline from the files the image builds from, then installed into a
folder of its own and imported from there, without this checkout's editable install."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("simulator", "loadgen", "exporter", "tuner")
# imported from the installed wheel alone: -S leaves out the .pth files, the editable install's finder among them
IMPORTS = """
import sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import importlib.util
import batchscope, batchscope.cli
from batchscope.simulator.profile import load_profile
assert batchscope.__file__.startswith(sys.argv[1]), batchscope.__file__
profiles = [load_profile(name) for name in ("tiny", "h100-llama-3.1-8b")]  # the bundled files, as data
print(len(profiles), importlib.util.find_spec("batchscope.testkit"),
      [importlib.util.find_spec(name) for name in ("simulator", "loadgen", "exporter", "tuner")])
"""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of what the Dockerfile copies before `pip install .`."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source)
    shutil.copytree(ROOT / "batchscope", source / "batchscope", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "--wheel-dir", str(out), str(source)], check=True, capture_output=True, timeout=180)
    return next(out.glob("batchscope-*.whl"))


def test_the_wheel_installs_one_name_and_every_module_but_the_test_support(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"batchscope", wheel.name.split("-py3")[0] + ".dist-info"}
    shipped = {name for name in names if name.endswith(".py")}
    modules = {str(path.relative_to(ROOT)) for path in (ROOT / "batchscope").rglob("*.py")}
    assert shipped == {name for name in modules if not name.startswith("batchscope/testkit/")}
    assert {f"batchscope/{component}/cli.py" for component in COMPONENTS} <= shipped
    assert {"batchscope/simulator/profiles/tiny.yaml", "batchscope/loadgen/adapter/static/llm_tab.js"} <= set(names)
    entry_points = zipfile.ZipFile(wheel).read(f"{wheel.name.split('-py3')[0]}.dist-info/entry_points.txt")
    assert b"batchscope = batchscope.cli:main" in entry_points


def test_the_installed_wheel_serves_its_profiles_and_no_test_support(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(target),
                    str(wheel)], check=True, capture_output=True, timeout=120)
    done = subprocess.run([sys.executable, "-S", "-c", IMPORTS, str(target), sysconfig.get_paths()["purelib"]],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["2", "None", "[None,", "None,", "None,", "None]"]
