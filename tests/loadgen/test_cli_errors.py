"""Bad input to `batchscope load` (and to `locust -f batchscope/loadgen/adapter/locustfile.py`): one short line naming
the field, exit status 2, no traceback, and no output folder left behind. Nothing here needs a server: every case is
refused before a request is sent (or by the server's pre-flight)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from batchscope.loadgen.cli import LOCUSTFILE
from batchscope.loadgen.figures import DEFAULT_METRICS_PORT
from tests.conftest import free_port

GOOD_SPEC = "input_tokens: 16\noutput_tokens: 8\nload: {mode: concurrency, concurrency: 2}\n"
POISSON = "load.mode=poisson", "load.concurrency=null"
NO_SERVER = "http://127.0.0.1:9"  # never contacted: the input is refused first

# name: (spec file text or bytes, extra arguments, what the error line must name)
CASES = {
    "set without a value": (GOOD_SPEC, ["--set", "load="], "load"),
    "set without =": (GOOD_SPEC, ["--set", "foo"], "--set"),
    "set not an integer": (GOOD_SPEC, ["--set", "load.concurrency=abc"], "load.concurrency"),
    "binary spec file": (bytes(range(256)) * 4, [], "spec"),
    "infinite rate": (GOOD_SPEC, ["--set", POISSON[0], "--set", POISSON[1], "--set", "load.rate=.inf"], "load.rate"),
    "nan rate": (GOOD_SPEC, ["--set", POISSON[0], "--set", POISSON[1], "--set", "load.rate=.nan"], "load.rate"),
    "absurd rate": (GOOD_SPEC, ["--set", POISSON[0], "--set", POISSON[1], "--set", "load.rate=1e9"],
                    "load.rate: Input should be less than or equal to 1000000"),
    "absurd input_tokens": (GOOD_SPEC.replace("16", "1e12"), [],
                            "input_tokens: Input should be less than or equal to 10000000"),
    "absurd concurrency": (GOOD_SPEC, ["--set", "load.concurrency=1e6"],
                           "load.concurrency: Input should be less than or equal to 100000"),
    "zero concurrency": (GOOD_SPEC, ["--set", "load.concurrency=0"], "load.concurrency"),
    "negative metrics port": (GOOD_SPEC, ["--metrics-port", "-1"], "--metrics-port"),
    "metrics port too big": (GOOD_SPEC, ["--metrics-port", "70000"], "--metrics-port"),
    "metrics port busy": (GOOD_SPEC, ["--metrics-port", "BUSY"], "--metrics-port"),
    "out is a file": (GOOD_SPEC, ["--out", "FILE"], "--out"),
    "run id going up": (GOOD_SPEC, ["--run-id", "../x"], "--run-id"),
    "run id with a slash": (GOOD_SPEC, ["--run-id", "a/b"], "--run-id"),
    "absolute run id": (GOOD_SPEC, ["--run-id", "/tmp/x"], "--run-id"),
}
# `locust -f` spells some flags its own way
LOCUST_FLAGS = {"--set": "--spec-set"}

# `batchscope load --workers N` only: the master's worker port and address
WORKER_CASES = {
    "master port 0": (["--workers", "2", "--master-port", "0"], "--master-port"),
    "unresolvable master bind host": (["--workers", "2", "--master-bind-host", "nohost.invalid"], "--master-bind-host"),
}


def command(via: str, spec: Path, args: list[str], tmp_path: Path) -> list[str]:
    if via == "batchscope":
        return [sys.executable, "-m", "batchscope.cli", "load", "--spec", str(spec), "--host", NO_SERVER, *args]
    args = [LOCUST_FLAGS.get(a, a) for a in args]
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary", "--spec",
            str(spec), "--host", NO_SERVER, "--out", str(tmp_path / "out"), *args]


@pytest.mark.parametrize("via", ["batchscope", "locust"])
@pytest.mark.parametrize("case", CASES)
def test_bad_input_gets_one_line_naming_the_field(tmp_path, case, via):
    text, args, field = CASES[case]
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(text if isinstance(text, bytes) else text.encode())
    (tmp_path / "a-file").write_text("")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        replace = {"BUSY": str(busy.getsockname()[1]), "FILE": str(tmp_path / "a-file")}
        args = [replace.get(a, a) for a in args]
        if "--metrics-port" not in args:
            args += ["--metrics-port", str(free_port())]
        result = subprocess.run(command(via, spec, args, tmp_path), capture_output=True, text=True, timeout=60,
                                cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert "Traceback" not in output
    if via == "batchscope":
        errors = result.stderr.strip().splitlines()
        assert 1 <= len(errors) <= 2
    else:  # Locust logs its own start-up lines around ours
        errors = [line for line in result.stderr.splitlines() if "/ERROR/batchscope.loadgen:" in line]
        errors = [line.split("/ERROR/batchscope.loadgen: ", 1)[1] for line in errors]
        assert len(errors) == 1, output[-3000:]
    assert all(len(line) <= 200 for line in errors)
    assert field in errors[0]
    assert not (tmp_path / "out").exists(), "a refused run leaves no output folder"


@pytest.mark.parametrize("case", WORKER_CASES)
def test_bad_worker_flags_get_one_line_naming_the_flag(tmp_path, case):
    args, flag = WORKER_CASES[case]
    spec = tmp_path / "spec.yaml"
    spec.write_text(GOOD_SPEC)
    result = subprocess.run(command("batchscope", spec, args, tmp_path), capture_output=True, text=True, timeout=30,
                            cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and flag in lines[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_default_metrics_port_taken_names_the_flag_and_the_way_out(tmp_path):
    """`docker compose up` publishes the client metrics on the same port as `batchscope load`'s default."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(GOOD_SPEC)
    with socket.socket() as taken:
        with contextlib.suppress(OSError):  # already taken (a compose stack?): the same case
            taken.bind(("127.0.0.1", DEFAULT_METRICS_PORT))
            taken.listen()
        result = subprocess.run([sys.executable, "-m", "batchscope.cli", "load", "--spec", str(spec), "--host",
                                 NO_SERVER], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"batchscope load: error: --metrics-port: 127.0.0.1:{DEFAULT_METRICS_PORT} is in use; it is the default, "
        "which `docker compose up` publishes too: pass --metrics-port a free port, or 0 for none"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("host", "cause"), [
    ("127.0.0.1:8000", "--host: '127.0.0.1:8000' is not an http:// or https:// URL of the server: write "
                       "http://127.0.0.1:8000"),
    ("ftp://127.0.0.1:8000", "--host: 'ftp://127.0.0.1:8000' is not an http:// or https:// URL of the server"),
    ("http://127.0.0.1:70000", "--host: 'http://127.0.0.1:70000' has no valid port (1-65535)"),
    ("DOWN", "server: cannot connect to DOWN: connection refused"),
])
def test_a_host_that_is_no_server_url_or_a_server_that_is_down_is_one_line_before_locust(tmp_path, host, cause):
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    host, cause = host.replace("DOWN", down), cause.replace("DOWN", down)
    spec = tmp_path / "spec.yaml"
    spec.write_text(GOOD_SPEC)
    result = subprocess.run([sys.executable, "-m", "batchscope.cli", "load", "--spec", str(spec), "--host", host,
                             "--metrics-port", str(free_port())], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert (result.stdout, result.stderr.splitlines()) == ("", [f"batchscope load: error: {cause}"])
    assert not (tmp_path / "out").exists(), "no out/<run id> folder, empty or with empty CSV files"


def test_a_refusal_keeps_an_output_folder_that_was_there_and_removes_the_ones_it_made(tmp_path):
    spec, kept = tmp_path / "spec.yaml", tmp_path / "kept"
    spec.write_text(GOOD_SPEC)
    kept.mkdir()
    for out in (kept, kept / "new" / "deeper"):
        result = subprocess.run([sys.executable, "-m", "batchscope.cli", "load", "--spec", str(spec), "--host",
                                 f"http://127.0.0.1:{free_port()}", "--out", str(out), "--metrics-port", "0"],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and "cannot connect" in result.stderr, result.stderr[-3000:]
    assert kept.is_dir() and not list(kept.iterdir())


@pytest.mark.e2e
def test_a_server_that_wants_a_key_the_spec_lacks_is_named_with_its_status_before_locust(simulator, tmp_path):
    sim = simulator("--profile", "tiny", "--api-key", "right-key")
    spec = tmp_path / "spec.yaml"
    spec.write_text(GOOD_SPEC)
    result = subprocess.run([sys.executable, "-m", "batchscope.cli", "load", "--spec", str(spec), "--host", sim.url,
                             "--metrics-port", str(free_port())],
                            capture_output=True, text=True, timeout=60, env=without_keys(), cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.splitlines() == [
        f"batchscope load: error: model: 'auto' could not read {sim.url}/v1/models (HTTP 401: the server wants an "
        "API key; set api_key in the spec or $BATCHSCOPE_API_KEY)"]
    assert not (tmp_path / "out").exists()


def without_keys() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name not in ("BATCHSCOPE_API_KEY", "OPENAI_API_KEY")}
