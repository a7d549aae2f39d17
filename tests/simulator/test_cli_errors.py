"""`batchscope sim serve` on bad input: one short line naming the flag, exit 2, no traceback, nothing served.

Each case runs the real CLI in a subprocess with a deadline. Files are made per case under tmp_path; the tests
run as root, so an unreadable profile is a directory or a binary file rather than a chmod 000 one.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

DEADLINE_S = 30  # generous: a bad input must fail at once, long before this


@contextmanager
def busy_port() -> Iterator[str]:
    """A loopback port another socket is bound and listening on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield str(sock.getsockname()[1])


def profile_file(name: str, content: bytes) -> Callable[[Path], list[str]]:
    def make(tmp_path: Path) -> list[str]:
        path = tmp_path / name
        path.write_bytes(content)
        return ["--profile", str(path)]
    return make


def profile_directory(tmp_path: Path) -> list[str]:
    folder = tmp_path / "profile.yaml"
    folder.mkdir()
    return ["--profile", str(folder)]


# (case id, flags or a function of tmp_path returning them, the flag the message must name)
CASES = [
    ("port-out-of-range", ["--port", "70000"], "--port"),
    ("port-negative", ["--port", "-1"], "--port"),
    ("host-unresolvable", ["--host", "no.such.host.invalid"], "--host"),
    ("seed-negative", ["--seed", "-1"], "--seed"),
    ("max-num-seqs-zero", ["--max-num-seqs", "0"], "--max-num-seqs"),
    ("block-size-zero", ["--block-size", "0"], "--block-size"),
    ("ground-truth-log-missing-folder", lambda tmp: ["--ground-truth-log", str(tmp / "no" / "truth.jsonl")],
     "--ground-truth-log"),
    ("ground-truth-log-is-a-folder", lambda tmp: ["--ground-truth-log", str(tmp)], "--ground-truth-log"),
    ("ground-truth-log-not-writable", lambda tmp: ["--ground-truth-log", "/proc/truth.jsonl"], "--ground-truth-log"),
    ("profile-missing", lambda tmp: ["--profile", str(tmp / "absent.yaml")], "--profile"),
    ("profile-yaml-syntax", profile_file("syntax.yaml", b"name: x\nsizes: [1, 2\n  bad: 3: 4\n"), "--profile"),
    ("profile-is-a-directory", profile_directory, "--profile"),
    ("profile-binary", profile_file("binary.yaml", b"\x00\xff\xfe\x80\x81"), "--profile"),
    ("profile-bad-field", profile_file("field.yaml", b"name: x\nmax_model_len: -5\n"), "--profile"),
    ("profile-not-a-mapping", profile_file("list.yaml", b"- a\n- b\n"), "--profile"),
    ("max-num-queued-reqs-negative", ["--max-num-queued-reqs", "-1"], "--max-num-queued-reqs"),
    ("max-num-queued-tokens-not-a-number", ["--max-num-queued-tokens", "x"], "--max-num-queued-tokens"),
    ("max-num-active-seqs-zero", ["--max-num-active-seqs", "0"], "--max-num-active-seqs"),
    # vLLM's rules across knobs, in vLLM's words (they name the fields)
    ("max-num-active-seqs-above-max-num-seqs", ["--max-num-active-seqs", "200"], "max_num_active_seqs (200)"),
    ("long-prefill-threshold-above-the-context", ["--long-prefill-token-threshold", "5000", "--profile", "tiny"],
     "long_prefill_token_threshold (5000)"),
]


def serve(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batchscope.cli", "sim", "serve", "m", *flags],
                          capture_output=True, text=True, timeout=DEADLINE_S)


def assert_one_short_line_naming(result: subprocess.CompletedProcess, flag: str) -> None:
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 2, output
    assert "Traceback" not in output
    assert len(output.splitlines()) <= 2 and len(output) <= 200, output
    assert flag in output, output
    assert "Starting vLLM API server" not in output


@pytest.mark.parametrize(("flags", "flag"), [pytest.param(flags, flag, id=case) for case, flags, flag in CASES])
def test_bad_input_exits_2_with_one_line_naming_the_flag(tmp_path, flags, flag):
    assert_one_short_line_naming(serve(*(flags(tmp_path) if callable(flags) else flags)), flag)


def test_a_busy_port_exits_2_naming_the_port():
    with busy_port() as port:
        assert_one_short_line_naming(serve("--port", port), "--port")
