"""Stopping a plan part-way: a SIGKILLed tuner, or Ctrl-C, then `--resume` finishes it with every setting ×
repeat run exactly once and no server left behind."""

from __future__ import annotations

import json
import signal
import socket

import pytest

from batchscope.cli import main
from batchscope.tuner.plan import load_plan
from batchscope.tuner.run.runner import prepare_plan_dir
from tests.conftest import wait_until
from tests.tuner.support import kill_group, run_files, server_ports, start_tune, tiny_plan, tune, write_plan

EXPECTED = {"baseline-r0", "mns-2-r0", "baseline-r1", "mns-2-r1"}


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.e2e
def test_a_sigkilled_plan_resumes_with_no_run_lost_or_duplicated(tmp_path):
    plan_path = write_plan(tmp_path, tiny_plan(repeats=2))
    plan_dir = tmp_path / "results" / "tiny"
    tuner = start_tune(tmp_path, plan_path)
    try:
        wait_until(lambda: run_files(plan_dir), timeout_s=60, interval_s=0.05, message="the first run.json")
    finally:
        kill_group(tuner)  # the tuner, its server and its load generator, with no chance to clean up
    first = set(run_files(plan_dir))
    assert first and first < EXPECTED
    killed_ports = server_ports(plan_dir)

    resumed = tune(tmp_path, plan_path, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    runs = run_files(plan_dir)
    assert set(runs) == EXPECTED and all(run["status"] == "ok" for run in runs.values())
    assert sorted((run["setting"], run["repeat"]) for run in runs.values()) == sorted(
        (name.rsplit("-r", 1)[0], int(name.rsplit("-r", 1)[1])) for name in EXPECTED)
    assert all(f"{name}: done before, skipped" in resumed.stderr for name in first)
    assert len([d for d in plan_dir.iterdir() if d.is_dir()]) == len(EXPECTED)
    assert not [port for port in killed_ports | server_ports(plan_dir) if listening(port)]


@pytest.mark.e2e
def test_ctrl_c_stops_the_run_cleanly_and_resume_completes_the_plan(tmp_path):
    plan_path = write_plan(tmp_path, tiny_plan(window_s=4))
    plan_dir = tmp_path / "results" / "tiny"
    tuner = start_tune(tmp_path, plan_path)
    log = tmp_path / "tune.log"
    try:
        wait_until(lambda: "baseline-r0: window" in log.read_text(), timeout_s=60, interval_s=0.05,
                   message="the first run's window")
        tuner.send_signal(signal.SIGINT)  # to the tuner alone: it must stop the server and the load itself
        assert tuner.wait(timeout=60) == 130
    finally:
        kill_group(tuner)
    last = log.read_text().strip().splitlines()[-1]
    assert "interrupted" in last and "--resume" in last
    assert run_files(plan_dir) == {} and (plan_dir / "baseline-r0").is_dir()
    assert not [port for port in server_ports(plan_dir) if listening(port)]

    resumed = tune(tmp_path, plan_path, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert set(run_files(plan_dir)) == {"baseline-r0", "mns-2-r0"}


def test_a_second_tune_without_resume_refuses_to_mix_results(tmp_path, capsys):
    plan_path = write_plan(tmp_path, tiny_plan())
    finished = tmp_path / "results" / "tiny" / "baseline-r0" / "run.json"
    finished.parent.mkdir(parents=True)
    finished.write_text("{}")
    assert main(["tune", str(plan_path), "--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and err.count("\n") == 1 and finished.read_text() == "{}"


@pytest.mark.parametrize(("change", "named"), [
    ({"workload": {**tiny_plan()["workload"], "load": {"mode": "concurrency", "concurrency": 5}}},
     "workload.load.concurrency is 4 in "),
    ({"variations": [{"name": "mns-2", "set": {"max_num_seqs": 3}}]}, "variations.0.set.max_num_seqs is 2 in "),
])
def test_a_refused_resume_names_the_field_that_changed(tmp_path, capsys, change, named):
    results = tmp_path / "results"
    prepare_plan_dir(load_plan(write_plan(tmp_path, tiny_plan())), results / "tiny", resume=False)
    changed = write_plan(tmp_path, tiny_plan(**change), name="changed.yaml")
    assert main(["tune", str(changed), "--results", str(results), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resume needs the same plan, but " + named in err, err


def test_a_resume_accepts_a_plan_json_written_before_a_field_existed_at_its_default(tmp_path):
    plan = load_plan(write_plan(tmp_path, tiny_plan()))
    plan_dir = tmp_path / "results" / "tiny"
    prepare_plan_dir(plan, plan_dir, resume=False)
    older = json.loads((plan_dir / "plan.json").read_text())
    del older["objective"]  # what an earlier release wrote
    (plan_dir / "plan.json").write_text(json.dumps(older))
    prepare_plan_dir(plan, plan_dir, resume=True)
    assert json.loads((plan_dir / "plan.json").read_text())["objective"] == "goodput"
