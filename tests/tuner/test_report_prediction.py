"""The report's prediction error: a plan run in real time (on `batchscope sim serve`) and as a what-if, the report
of either folder showing each setting's preview against its measured figures."""

from __future__ import annotations

import json

import pytest

from batchscope.tuner.report.files import write_report
from batchscope.tuner.report.prediction import prediction_rows
from tests.tuner.support import run_files, tiny_plan, tune, write_plan


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("prediction")
    plan_path = write_plan(tmp_path, tiny_plan(window_s=3))
    real = tune(tmp_path, plan_path)
    assert real.returncode == 0, real.stderr
    previews = tune(tmp_path, plan_path, "--what-if")
    assert previews.returncode == 0, previews.stderr
    return tmp_path / "results"


def test_each_setting_shows_predicted_against_measured_with_the_error(both):
    real_dir = both / "tiny"
    rows = {(r.setting, r.figure): r for r in prediction_rows(real_dir)}
    assert {setting for setting, _ in rows} == {"baseline", "mns-2"}
    assert {figure for _, figure in rows} == {"TTFT mean", "TPOT mean", "output tokens/s", "preemptions"}
    measured = run_files(real_dir)["mns-2-r0"]["client"]["ttft"]["mean"]
    predicted = run_files(both / "tiny.what-if")["mns-2-r0"]["client"]["ttft"]["mean"]
    row = rows[("mns-2", "TTFT mean")]
    assert (row.predicted, row.measured) == (predicted, measured)
    assert row.error == pytest.approx(predicted / measured - 1)
    # two of four users at a time: both the preview and the real runs queue the others, TTFT up in both
    assert row.same_direction is True
    assert rows[("baseline", "TTFT mean")].same_direction is None
    assert rows[("baseline", "preemptions")].error == 0


def test_the_report_of_either_folder_has_the_section(both):
    for folder in ("tiny", "tiny.what-if"):
        write_report(both / folder)
        text = (both / folder / "report.md").read_text()
        assert "## Prediction error: what-if against real time" in text
        assert "| mns-2 | TPOT mean |" in text and "| baseline | output tokens/s |" in text
        assert "Prediction error" in (both / folder / "report.html").read_text()
    json.loads((both / "tiny" / "comparison.json").read_text())  # the machines' file is untouched by the section


def test_a_plan_without_previews_has_no_section(tmp_path):
    plan_path = write_plan(tmp_path, tiny_plan(variations=[]))
    assert tune(tmp_path, plan_path).returncode == 0
    assert "Prediction error" not in (tmp_path / "results" / "tiny" / "report.md").read_text()
    assert prediction_rows(tmp_path / "results" / "tiny") == []
