"""`batchscope tune` and `batchscope report` on bad input: one line naming the field, exit status 2."""

from __future__ import annotations

import pytest

from batchscope.cli import main
from tests.tuner.support import tiny_plan, write_plan


@pytest.mark.parametrize(("change", "field"), [
    ({"variations": [{"name": "two", "set": {"max_num_seqs": 64, "max_num_batched_tokens": 4096}}]},
     "variations.0: changes 2 parameters"),
    ({"variations": [{"name": "odd", "set": {"max_num_sequences": 64}}]}, "max_num_sequences"),
    ({"variations": [{"name": "high", "set": {"gpu_memory_utilization": 1.5}}]}, "variations.high"),
    ({"baseline": {"max_model_len": 1024}}, "baseline.model"),
    ({"warmup_s": -1}, "warmup_s"),
    ({"backend": {"kind": "kubernetes"}}, "backend"),
    # <plan>-<variation>-r<repeat> is the load run's --run-id, at most 128 characters
    ({"name": "p" * 64, "variations": [{"name": "v" * 64, "set": {"max_num_seqs": 2}}]}, "name and variation names"),
])
def test_a_bad_plan_is_one_line_naming_the_field(tmp_path, capsys, change, field):
    plan = write_plan(tmp_path, tiny_plan(**change))
    assert main(["tune", str(plan), "--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("batchscope tune: error: plan: ") and field in err
    assert "Traceback" not in err and not (tmp_path / "results").exists()


def test_two_parameters_are_allowed_when_marked_as_a_combination(tmp_path):
    from tuner.plan import load_plan

    plan = tiny_plan(variations=[{"name": "both", "combination": True,
                                  "set": {"max_num_seqs": 64, "max_num_batched_tokens": 4096}}])
    assert [name for name, _ in load_plan(write_plan(tmp_path, plan)).settings()] == ["baseline", "both"]


def test_a_missing_plan_file_and_a_results_path_that_is_a_file_are_bad_input(tmp_path, capsys):
    assert main(["tune", str(tmp_path / "absent.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "results").write_text("not a folder")
    assert main(["tune", str(write_plan(tmp_path, tiny_plan())), "--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--results" in err and "is a file" in err


def test_report_of_a_folder_without_a_plan_is_bad_input(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_report_of_a_plan_without_finished_runs_is_one_line(tmp_path, capsys):
    (tmp_path / "plan.json").write_text("{}")
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no finished runs" in err
