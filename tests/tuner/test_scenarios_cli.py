"""`batchscope tune --scenario server|offline`: MLPerf's scenarios per setting, here on the virtual clock."""

from __future__ import annotations

import json

import pytest

from batchscope.cli import main
from tests.tuner.support import tune, write_plan

PLAN = {
    "name": "mlperf",
    "workload": {"input_tokens": 1024, "output_tokens": 128, "load": {"mode": "concurrency", "concurrency": 8}},
    "baseline": {"model": "m", "max_model_len": 4096},
    "variations": [{"name": "mns-8", "set": {"max_num_seqs": 8}}],
    "warmup_s": 5,
    "window_s": 20,
    "slos": {"ttft_p99_s": 0.5, "tpot_p99_s": 0.05},
}


@pytest.mark.e2e
@pytest.mark.slow
def test_the_server_scenario_brackets_a_rate_per_setting(tmp_path):
    result = tune(tmp_path, write_plan(tmp_path, PLAN), "--scenario", "server", "--what-if", "--start-rps", "4")
    assert result.returncode == 0, result.stderr
    out = tmp_path / "results" / "mlperf.what-if" / "mlperf-server"
    for setting in ("baseline", "mns-8"):
        search = json.loads((out / f"{setting}.json").read_text())
        low, high = search["bracket_low_rps"], search["bracket_high_rps"]
        assert 0 < low < high <= low * 1.2 and search["slos"] == PLAN["slos"]
        # every point ran in its own folder and is the run the search judged
        assert len(list((out / setting).glob("rate-*/run.json"))) == len(search["points"])
        assert f"server {setting}: highest rate meeting p99 TTFT/TPOT bounds in [{low:g}, {high:g}]" in result.stdout
    # eight sequences at a time cannot sustain the baseline's rate within the TTFT bound
    assert json.loads((out / "mns-8.json").read_text())["bracket_high_rps"] <= json.loads(
        (out / "baseline.json").read_text())["bracket_low_rps"]


@pytest.mark.e2e
def test_the_offline_scenario_reports_throughput(tmp_path):
    result = tune(tmp_path, write_plan(tmp_path, PLAN), "--scenario", "offline", "--what-if", "--requests", "200")
    assert result.returncode == 0, result.stderr
    offline = json.loads((tmp_path / "results" / "mlperf.what-if" / "mlperf-offline" / "baseline.json").read_text())
    assert offline["status"] == "ok" and offline["completed"] == 200
    assert offline["requests_per_s"] == offline["completed"] / offline["duration_s"] > 0


@pytest.mark.parametrize(("flags", "field"), [(["--scenario", "server", "--start-rps", "0"], "--start-rps"),
                                              (["--scenario", "offline", "--requests", "0"], "--requests")])
def test_scenario_bounds_are_one_line_errors(tmp_path, capsys, flags, field):
    plan = write_plan(tmp_path, PLAN)
    code = main(["tune", str(plan), "--results", str(tmp_path / "results"), *flags, "--what-if"])
    err = capsys.readouterr().err
    assert code == 2 and field in err and len(err.splitlines()) == 1
