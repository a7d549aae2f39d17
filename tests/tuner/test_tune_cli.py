"""`batchscope tune` and `batchscope report` on bad input: one line naming the field, exit status 2."""

from __future__ import annotations

import pytest

from batchscope.cli import main
from tests.tuner.support import tiny_plan, write_plan


@pytest.mark.parametrize(("change", "field"), [
    ({"variations": [{"name": "two", "set": {"max_num_seqs": 64, "max_num_batched_tokens": 4096}}]},
     "variations.0: changes 2 parameters"),
    ({"variations": [{"name": "odd", "set": {"max_num_sequences": 64}}]}, "max_num_sequences"),
    # a variation's path is the plan file's own (its index and `set`), as every other field's
    ({"variations": [{"name": "ok", "set": {"max_num_seqs": 2}},
                     {"name": "high", "set": {"gpu_memory_utilization": 1.5}}]},
     "variations.1.set.gpu_memory_utilization: Input should be less than or equal to 1"),
    ({"baseline": {"max_model_len": 1024}}, "baseline.model"),
    ({"warmup_s": -1}, "warmup_s"),
    ({"backend": {"kind": "kubernetes"}}, "backend"),
    # run without a shell but split as one would; the field's path is what the plan says, not pydantic's tags
    ({"backend": {"kind": "command", "command": "vllm serve '{model} {flags}"}},
     "backend.command: does not split like a shell command line (No closing quotation)"),
    ({"backend": {"kind": "command", "command": " "}}, "backend.command: is empty"),
    ({"workload": {"input_tokens": 8, "output_tokens": 8, "load": {"mode": "concurrency", "concurrency": 0}}},
     "workload.load.concurrency: Input should be greater than 0"),
    # <plan>-<variation>-r<repeat> is the load run's --run-id, at most 128 characters
    ({"name": "p" * 64, "variations": [{"name": "v" * 64, "set": {"max_num_seqs": 2}}]}, "name and variation names"),
])
def test_a_bad_plan_is_one_line_naming_the_field(tmp_path, capsys, change, field):
    plan = write_plan(tmp_path, tiny_plan(**change))
    assert main(["tune", str(plan), "--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("batchscope tune: error: plan: ") and field in err
    assert "Traceback" not in err and not (tmp_path / "results").exists()


@pytest.mark.parametrize(("text", "where"), [
    ("name: x\nbaseline: {max_num_seqs: [1\n", "line 3, column 1: expected ',' or ']'"),
    ("name: x\n  repeats: 2\n", "line 2, column 10: mapping values are not allowed here"),
])
def test_a_plan_that_is_not_yaml_names_the_line_and_column(tmp_path, capsys, text, where):
    plan = tmp_path / "plan.yaml"
    plan.write_text(text)
    assert main(["tune", str(plan), "--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"is not valid YAML ({where}" in err, err


def test_two_parameters_are_allowed_when_marked_as_a_combination(tmp_path):
    from batchscope.tuner.plan import load_plan

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


@pytest.mark.parametrize(("make", "problem"), [
    (lambda path: None, "does not exist"),
    (lambda path: path.write_text("name: tiny\n"), "is a file"),  # e.g. the plan file given for its results
    (lambda path: (path / "notes").mkdir(parents=True), "has no results (no plan.json, */run.json or mlperf-*/)"),
])
def test_report_of_a_path_that_is_no_results_folder_says_what_it_is_and_what_was_expected(tmp_path, capsys, make,
                                                                                         problem):
    path = tmp_path / "results" / "tiny"
    path.parent.mkdir()
    make(path)
    assert main(["report", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (f"batchscope report: error: plan_dir: {path} {problem}; expected a results folder "
                                 "(results/<plan> or results/<plan>/mlperf-<scenario>)\n")


def test_report_of_a_plan_without_finished_runs_is_one_line(tmp_path, capsys):
    (tmp_path / "plan.json").write_text("{}")
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("batchscope report: error: no finished runs under ")


@pytest.mark.parametrize("flags", [[], ["--what-if"], ["--scenario", "offline", "--what-if"]])
def test_a_results_folder_that_cannot_be_created_is_one_line_naming_the_flag(tmp_path, capsys, flags):
    (tmp_path / "file.txt").write_text("a file where a folder should be")  # root may write anywhere else
    results = tmp_path / "file.txt" / "sub"
    assert main(["tune", str(write_plan(tmp_path, tiny_plan())), "--results", str(results), *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith("batchscope tune: error: --results: ") and err.rstrip().endswith(": Not a directory")
    assert str(results) in err


def test_a_live_file_that_cannot_be_written_is_refused_before_any_run(tmp_path, capsys):
    (tmp_path / "file.txt").write_text("a file where a folder should be")
    live_file = tmp_path / "file.txt" / "live.json"
    assert main(["tune", str(write_plan(tmp_path, tiny_plan())), "--results", str(tmp_path / "results"),
                 "--live-file", str(live_file)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith("batchscope tune: error: --live-file: ") and err.rstrip().endswith(": Not a directory")
    assert not (tmp_path / "results").exists()


def test_report_in_a_folder_it_cannot_write_is_one_line(tmp_path, capsys):
    assert main(["tune", str(write_plan(tmp_path, tiny_plan())), "--results", str(tmp_path), "--what-if"]) == 0
    plan_dir = tmp_path / "tiny.what-if"
    (plan_dir / "report.md").unlink()
    (plan_dir / "report.md").mkdir()  # a folder where the report goes: root cannot write it either
    (plan_dir / "report.md" / "notes.txt").write_text("kept")
    capsys.readouterr()
    assert main(["report", str(plan_dir)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith(f"batchscope report: error: cannot write {plan_dir / 'report.md'}: ")
    assert err.rstrip().endswith(": Is a directory")
    assert not list(plan_dir.glob(".*.tmp"))  # no temporary left beside it
