"""Bad input to `batchscope exporter`: one short line naming the flag or variable, exit status 2, no traceback,
no secret echoed. A malformed BATCHSCOPE_* variable stops only the exporter: `--help` and the other subcommands
never read it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from batchscope.cli import main
from batchscope.inputs.validation import INPUT_MAX_BYTES

SECRET = "sk-never-echo-4242"
NO_SERVER = "http://127.0.0.1:9"  # never contacted: the input is refused first

# SLO targets: a number of seconds in (0, a day]; the line names the range
SLO_CASES = {
    "slo ttft 0": (["--slo-ttft-seconds", "0"], {}, "--slo-ttft-seconds"),
    "slo tpot negative": (["--slo-tpot-seconds", "-0.2"], {}, "--slo-tpot-seconds"),
    "slo ttft nan": (["--slo-ttft-seconds", "nan"], {}, "--slo-ttft-seconds"),
    "slo tpot inf": (["--slo-tpot-seconds", "inf"], {}, "--slo-tpot-seconds"),
    "slo ttft beyond a day": (["--slo-ttft-seconds", "100000"], {}, "--slo-ttft-seconds"),
    "env slo ttft 0": ([], {"BATCHSCOPE_SLO_TTFT_SECONDS": "0"}, "BATCHSCOPE_SLO_TTFT_SECONDS"),
}
SLO_ALLOWED = "must be a number of seconds in (0, 86400]"
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
    "command file too large": (["--vllm-command-file", "HUGE"], {}, "--vllm-command-file"),
    "live file to follow is a folder": (["--follow", "."], {}, "--follow"),
    "env live file to follow is a folder": ([], {"BATCHSCOPE_FOLLOW": "."}, "BATCHSCOPE_FOLLOW"),
    "command with an open quote": (["--vllm-command", f'vllm serve "m --api-key {SECRET}'], {}, "--vllm-command"),
    "env port not a number": ([], {"BATCHSCOPE_PORT": "abc"}, "BATCHSCOPE_PORT: invalid int value 'abc'"),
    "env port out of range": ([], {"BATCHSCOPE_PORT": "70000"}, "BATCHSCOPE_PORT"),
    "env timeout not a number": ([], {"BATCHSCOPE_SCRAPE_TIMEOUT_S": "x"}, "BATCHSCOPE_SCRAPE_TIMEOUT_S"),
    "env timeout 0": ([], {"BATCHSCOPE_SCRAPE_TIMEOUT_S": "0"}, "BATCHSCOPE_SCRAPE_TIMEOUT_S"),
    "env vllm url without a scheme": ([], {"BATCHSCOPE_VLLM_URL": "vllm:8000"}, "BATCHSCOPE_VLLM_URL"),
    "env command file missing": ([], {"BATCHSCOPE_VLLM_COMMAND_FILE": "MISSING"}, "BATCHSCOPE_VLLM_COMMAND_FILE"),
    "process source neither auto nor off": (["--vllm-process", "on"], {}, "--vllm-process: must be one of auto, off"),
    "env process source neither auto nor off": ([], {"BATCHSCOPE_VLLM_PROCESS": "yes"}, "BATCHSCOPE_VLLM_PROCESS"),
    **SLO_CASES,
}
# secrets set beside every case: none may appear in an error line
SECRETS_ENV = {"BATCHSCOPE_VLLM_API_KEY": SECRET, "BATCHSCOPE_GRAFANA_TOKEN": SECRET,
               "BATCHSCOPE_GRAFANA_PASSWORD": SECRET}


def run(args: list[str], env: dict[str, str], cwd) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSCOPE_")}
    return subprocess.run([sys.executable, "-m", "batchscope.cli", *args], capture_output=True, text=True,
                          timeout=30, env={**environ, **env}, cwd=cwd)


def run_in_process(args: list[str], env: dict[str, str], cwd, monkeypatch, capsys) -> tuple[int, str]:
    """The console script's main in this process (no interpreter start per case): exit status and output."""
    for name in [k for k in os.environ if k.startswith("BATCHSCOPE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(cwd)
    try:
        code = main(args)
    except SystemExit as stopped:  # argparse's own errors
        code = stopped.code if isinstance(stopped.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def arguments(case: str, tmp_path, busy_port: int) -> tuple[list[str], dict[str, str], str]:
    args, env, name = CASES[case]
    huge = tmp_path / "huge-command"
    huge.write_bytes(b"vllm serve m " * (INPUT_MAX_BYTES // 13 + 1))  # read within the cap, refused past it
    replace = {"BUSY": str(busy_port), "MISSING": str(tmp_path / "no-such-file"), "HUGE": str(huge)}
    args = [replace.get(a, a) for a in args]
    env = {k: replace.get(v, v) for k, v in env.items()}
    if "--vllm-url" not in args and "BATCHSCOPE_VLLM_URL" not in env:
        args += ["--vllm-url", NO_SERVER]
    if "--port" not in args and "BATCHSCOPE_PORT" not in env:
        args += ["--port", "0"]
    return ["exporter", *args], {**SECRETS_ENV, **env}, name


def assert_one_line_naming(code: int, output: str, name: str) -> None:
    assert code == 2, output
    assert "Traceback" not in output
    lines = output.strip().splitlines()
    assert 1 <= len(lines) <= 2 and all(len(line) <= 200 for line in lines), lines
    assert lines[0].startswith(f"batchscope exporter: error: {name}") or "argument " + name in lines[0], lines
    assert SECRET not in output


@pytest.fixture
def busy_port():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield busy.getsockname()[1]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_gets_one_line_naming_the_flag_or_variable(tmp_path, busy_port, monkeypatch, capsys, case):
    args, env, name = arguments(case, tmp_path, busy_port)
    assert_one_line_naming(*run_in_process(args, env, tmp_path, monkeypatch, capsys), name)


@pytest.mark.parametrize("case", SLO_CASES)
def test_a_bad_slo_target_names_the_values_allowed(tmp_path, busy_port, monkeypatch, capsys, case):
    args, env, name = arguments(case, tmp_path, busy_port)
    code, output = run_in_process(args, env, tmp_path, monkeypatch, capsys)
    assert code == 2 and output.strip().startswith(f"batchscope exporter: error: {name}: {SLO_ALLOWED}, not "), output


@pytest.mark.e2e
@pytest.mark.parametrize("case", ["port busy", "env port not a number"])
def test_the_console_script_reports_bad_input_the_same_way(tmp_path, busy_port, case):
    args, env, name = arguments(case, tmp_path, busy_port)
    result = run(args, env, tmp_path)
    assert_one_line_naming(result.returncode, result.stdout + result.stderr, name)


@pytest.mark.parametrize("command", [["--help"], ["sim", "serve", "--help"], ["load", "--help"],
                                     ["exporter", "--help"], ["tune", "--help"]])
def test_a_malformed_variable_leaves_help_and_the_other_subcommands_alone(tmp_path, monkeypatch, capsys, command):
    code, output = run_in_process(command, {"BATCHSCOPE_PORT": "abc", "BATCHSCOPE_SCRAPE_TIMEOUT_S": "x"},
                                  tmp_path, monkeypatch, capsys)
    assert code == 0, output
    assert output.startswith("usage: batchscope")


@pytest.mark.e2e
def test_the_console_scripts_help_ignores_a_malformed_variable(tmp_path):
    result = run(["exporter", "--help"], {"BATCHSCOPE_PORT": "abc", "BATCHSCOPE_SCRAPE_TIMEOUT_S": "x"}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: batchscope") and not result.stderr


def test_a_malformed_variable_leaves_another_subcommands_errors_its_own(tmp_path, monkeypatch, capsys):
    code, output = run_in_process(["sim", "serve", "m", "--seed", "-1"], {"BATCHSCOPE_PORT": "abc"}, tmp_path,
                                  monkeypatch, capsys)
    assert code == 2 and "BATCHSCOPE_PORT" not in output
    assert output.startswith("batchscope sim serve: error:")
