"""Bad input to `batchscope exporter`: one short line naming the flag or variable, exit status 2, no traceback,
no secret echoed. A malformed BATCHSCOPE_* variable stops only the exporter: `--help` and the other subcommands
never read it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

SECRET = "sk-never-echo-4242"
NO_SERVER = "http://127.0.0.1:9"  # never contacted: the input is refused first

# name: (arguments, environment, what the error line must name)
CASES = {
    "port -1": (["--port", "-1"], {}, "--port"),
    "port 70000": (["--port", "70000"], {}, "--port"),
    "port busy": (["--port", "BUSY"], {}, "--port"),
    "port not a number": (["--port", "abc"], {}, "--port"),
    "unresolvable host": (["--host", "no-such-host.invalid"], {}, "--host"),
    "vllm url without a scheme": (["--vllm-url", "127.0.0.1:8000"], {}, "--vllm-url"),
    "vllm url of another scheme": (["--vllm-url", "ftp://127.0.0.1:8000"], {}, "--vllm-url"),
    "vllm url not parseable": (["--vllm-url", "http://[::1"], {}, "--vllm-url"),
    "loadgen url without a scheme": (["--loadgen-url", "localhost:9646"], {}, "--loadgen-url"),
    "grafana url without a scheme": (["--grafana-url", "grafana:3000"], {}, "--grafana-url"),
    "scrape timeout 0": (["--scrape-timeout-s", "0"], {}, "--scrape-timeout-s"),
    "scrape timeout negative": (["--scrape-timeout-s", "-1"], {}, "--scrape-timeout-s"),
    "scrape timeout nan": (["--scrape-timeout-s", "nan"], {}, "--scrape-timeout-s"),
    "missing command file": (["--vllm-command-file", "MISSING"], {}, "--vllm-command-file"),
    "command file is a folder": (["--vllm-command-file", "."], {}, "--vllm-command-file"),
    "command with an open quote": (["--vllm-command", f'vllm serve "m --api-key {SECRET}'], {}, "--vllm-command"),
    "env port not a number": ([], {"BATCHSCOPE_PORT": "abc"}, "BATCHSCOPE_PORT: invalid int value 'abc'"),
    "env port out of range": ([], {"BATCHSCOPE_PORT": "70000"}, "BATCHSCOPE_PORT"),
    "env timeout not a number": ([], {"BATCHSCOPE_SCRAPE_TIMEOUT_S": "x"}, "BATCHSCOPE_SCRAPE_TIMEOUT_S"),
    "env timeout 0": ([], {"BATCHSCOPE_SCRAPE_TIMEOUT_S": "0"}, "BATCHSCOPE_SCRAPE_TIMEOUT_S"),
    "env vllm url without a scheme": ([], {"BATCHSCOPE_VLLM_URL": "vllm:8000"}, "BATCHSCOPE_VLLM_URL"),
    "env command file missing": ([], {"BATCHSCOPE_VLLM_COMMAND_FILE": "MISSING"}, "BATCHSCOPE_VLLM_COMMAND_FILE"),
}
# secrets set beside every case: none may appear in an error line
SECRETS_ENV = {"BATCHSCOPE_VLLM_API_KEY": SECRET, "BATCHSCOPE_GRAFANA_TOKEN": SECRET,
               "BATCHSCOPE_GRAFANA_PASSWORD": SECRET}


def run(args: list[str], env: dict[str, str], cwd) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSCOPE_")}
    return subprocess.run([sys.executable, "-m", "batchscope.cli", *args], capture_output=True, text=True,
                          timeout=30, env={**environ, **env}, cwd=cwd)


@pytest.mark.parametrize("case", CASES)
def test_bad_input_gets_one_line_naming_the_flag_or_variable(tmp_path, case):
    args, env, name = CASES[case]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        replace = {"BUSY": str(busy.getsockname()[1]), "MISSING": str(tmp_path / "no-such-file")}
        args = [replace.get(a, a) for a in args]
        env = {k: replace.get(v, v) for k, v in env.items()}
        if "--vllm-url" not in args and "BATCHSCOPE_VLLM_URL" not in env:
            args += ["--vllm-url", NO_SERVER]
        if "--port" not in args and "BATCHSCOPE_PORT" not in env:
            args += ["--port", "0"]
        result = run(["exporter", *args], {**SECRETS_ENV, **env}, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output
    lines = output.strip().splitlines()
    assert 1 <= len(lines) <= 2 and all(len(line) <= 200 for line in lines), lines
    assert lines[0].startswith(f"batchscope exporter: error: {name}") or "argument " + name in lines[0], lines
    assert SECRET not in output


@pytest.mark.parametrize("command", [["--help"], ["sim", "serve", "--help"], ["load", "--help"],
                                     ["exporter", "--help"], ["tune", "--help"]])
def test_a_malformed_variable_leaves_help_and_the_other_subcommands_alone(tmp_path, command):
    result = run(command, {"BATCHSCOPE_PORT": "abc", "BATCHSCOPE_SCRAPE_TIMEOUT_S": "x"}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: batchscope") and not result.stderr


def test_a_malformed_variable_leaves_another_subcommands_errors_its_own(tmp_path):
    result = run(["sim", "serve", "m", "--seed", "-1"], {"BATCHSCOPE_PORT": "abc"}, tmp_path)
    assert result.returncode == 2 and "BATCHSCOPE_PORT" not in result.stderr
    assert result.stderr.startswith("batchscope sim serve: error:")
