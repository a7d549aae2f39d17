"""tuner.report: the three files from a plan directory of synthetic runs; the HTML page in headless Chromium."""

from __future__ import annotations

import base64
import csv
import json
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.image
import pytest

from batchscope.cli import main
from batchscope.tuner.compare.metrics import METRICS
from batchscope.tuner.plan import Plan
from batchscope.tuner.report.files import CSV_COLUMNS, PLOTS, write_report
from batchscope.tuner.results.record import ServerReport, load_results, save
from tests.tuner.test_compare import BASE_PARAMS, WORKLOAD, make_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHROMIUM = "/usr/bin/chromium"


def make_plan_dir(directory: Path) -> Path:
    """A one-knob plan's results: baseline, three variations, one failed setting; plan.json beside them."""
    runs = [
        make_run(ttft=0.5, tpot=0.020, completed=1200),
        make_run("tokens-8192", ttft=0.31, tpot=0.0224, completed=1200, params={"max_num_batched_tokens": 8192},
                 server={"tokens_per_step_mean": 7400}),
        make_run("seqs-32", ttft=0.93, completed=1200, params={"max_num_seqs": 32},
                 server={"max_waiting": 48, "queue_time_mean_s": 0.9, "max_running": 32}),
        make_run("low-util", ttft=0.9, completed=960, params={"gpu_memory_utilization": 0.3},
                 server={"preemptions": 1200, "kv_usage_peak": 1.0, "kv_capacity_tokens": 60_000}),
        make_run("tiny-kv", status="failed", params={"gpu_memory_utilization": 0.05},
                 failure="KV cache cannot hold one request of 4096 tokens"),
    ]
    for run in runs:
        save(run, directory)
    plan = Plan(name="one-knob", workload=WORKLOAD, baseline=BASE_PARAMS,
                variations=[{"name": "tokens-8192", "set": {"max_num_batched_tokens": 8192}},
                            {"name": "seqs-32", "set": {"max_num_seqs": 32}},
                            {"name": "low-util", "set": {"gpu_memory_utilization": 0.3}},
                            {"name": "tiny-kv", "set": {"gpu_memory_utilization": 0.05}}],
                slos={"ttft_p99_s": 1.0, "tpot_p99_s": 0.1})
    (directory / "plan.json").write_text(plan.model_dump_json(indent=2))
    return directory


@pytest.fixture
def plan_dir(tmp_path: Path) -> Path:
    return make_plan_dir(tmp_path / "one-knob")


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The report of make_plan_dir's runs, written once for the tests that only read it."""
    directory = make_plan_dir(tmp_path_factory.mktemp("report") / "one-knob")
    return {path.name: path for path in write_report(directory)}


def test_the_report_files_are_written(written):
    assert {"report.md", "report.html", "report.csv", "comparison.json"} <= set(written)
    assert all(path.stat().st_size > 0 for path in written.values())


def test_csv_has_one_row_per_setting_and_metric(written):
    with open(written["report.csv"], newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == CSV_COLUMNS
    settings = ["baseline", "tokens-8192", "seqs-32", "low-util", "tiny-kv"]
    assert [(r["setting"], r["metric"]) for r in rows] == [(s, m.key) for s in settings for m in METRICS]
    ttft = next(r for r in rows if r["setting"] == "tokens-8192" and r["metric"] == "ttft_p99")
    # one repeat: indicative, never significant
    assert ttft["unit"] == "s" and (ttft["significant"], ttft["evidence"]) == ("false", "indicative")
    assert float(ttft["ci_low"]) <= float(ttft["delta"]) <= float(ttft["ci_high"]) < 0
    assert float(ttft["value"]) - float(ttft["baseline"]) == pytest.approx(float(ttft["delta"]))
    failed = [r for r in rows if r["setting"] == "tiny-kv"]
    assert all(r["value"] == "" and r["significant"] == "" for r in failed)


def test_markdown_has_the_tables(written):
    text = written["report.md"].read_text()
    assert "Mode: **real-time**" in text
    assert "fewer than 3 ok runs per setting, so no delta is called significant" in text
    assert "which ignores run-to-run variance: 'indicative' = it excludes 0" in text
    for heading in ("## Locked conditions", "## Settings", "## Verdicts", "## Failed runs",
                    "## tokens-8192: max_num_batched_tokens 2048 → 8192", "## seqs-32: max_num_seqs 128 → 32"):
        assert heading in text
    assert "| condition | value |" in text and "| input tokens | 512 |" in text
    assert "| load level | concurrency 64, ramp_up_s 0.64 |" in text  # the default ramp: 10 ms per user
    assert "| setting | changed | KV capacity (tokens) |" in text  # the knobs the plan changes: in 'changed'
    assert "Baseline: max_num_seqs 128, max_num_batched_tokens 2,048" in text
    assert "| KV capacity (tokens) |" in text and "| 500,000 |" in text and "| 60,000 |" in text
    assert "| metric | unit | baseline | value | delta | delta % | 95% CI of delta | significant |" in text
    assert re.search(r"\| TTFT p99 \| ms \| [\d.,]+ \| [\d.,]+ \| −[\d.,]+ \| −\d+\.\d% \| \[−.*\] \| indicative \|",
                     text)
    assert "| tiny-kv-r0 | KV cache cannot hold one request of 4096 tokens |" in text
    assert "max_num_seqs 32 caps the running batch" in text
    assert "1,200 preemptions (baseline 0), KV peak 100%" in text
    assert "Met the SLOs (p99 TTFT ≤ 1,000 ms, p99 TPOT ≤ 100 ms): baseline, tokens-8192\n" in text


def test_without_plan_json_the_runs_conditions_and_default_slos_are_used(plan_dir, capsys):
    (plan_dir / "plan.json").unlink()
    assert main(["report", str(plan_dir)]) == 0  # its runs are results: `batchscope report` takes the folder
    assert f"report: {plan_dir / 'report.md'}" in capsys.readouterr().out
    text = (plan_dir / "report.md").read_text()
    assert "SLOs: p99 TTFT ≤ 2,000 ms, p99 TPOT ≤ 200 ms." in text and "| output tokens | 128 |" in text


def test_an_empty_plan_directory_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no finished runs"):
        write_report(tmp_path)


def test_runs_written_in_schema_1_still_load_for_the_report_beside_schema_2_ones(tmp_path):
    old = make_run().model_dump(mode="json", exclude={"reported"}) | {"schema_version": 1}  # every knob passed
    (tmp_path / "baseline-r0").mkdir()
    (tmp_path / "baseline-r0" / "run.json").write_text(json.dumps(old))
    save(make_run("bs-32", params={"block_size": 32}).model_copy(update={"reported": ServerReport(block_size=32)}),
         tmp_path)
    assert [run.schema_version for run in load_results(tmp_path)] == [1, 2]
    text = {p.name: p for p in write_report(tmp_path)}["report.md"].read_text()
    assert "## bs-32: block_size vLLM default → 32" in text and "| bs-32 | block_size vLLM default → 32 |" in text


def test_what_if_mode_is_stated(tmp_path):
    for run in (make_run(mode="what-if"), make_run("x", mode="what-if", params={"max_num_seqs": 64})):
        save(run, tmp_path)
    paths = {p.name: p for p in write_report(tmp_path)}
    assert "Mode: **what-if**" in paths["report.md"].read_text()
    assert "<strong>what-if</strong>" in paths["report.html"].read_text()


def embedded_plots(page: str) -> dict[str, bytes]:
    images = re.findall(r"<img class='plot' id='plot-([\w-]+)' alt='[^']*' src='data:image/png;base64,([^']*)'>",
                        page)
    return {plot_id: base64.b64decode(data, validate=True) for plot_id, data in images}


def test_html_is_self_contained_with_every_plot(written):
    page = written["report.html"].read_text()
    assert "<style>" in page and "<script" not in page
    assert not re.search(r"(src|href)=['\"](https?:|//|file:)", page)  # nothing fetched from elsewhere
    plots = embedded_plots(page)
    assert set(plots) == {plot_id for plot_id, _, _ in PLOTS}
    for plot_id, data in plots.items():
        assert data.startswith(PNG_SIGNATURE), plot_id
        assert len(data) > 2048, plot_id


@pytest.mark.e2e
def test_html_report_renders_in_headless_chromium(written, tmp_path):
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.skip("Chromium is not installed (scripts/ensure-debian-packages chromium)")
    browser = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    shot = tmp_path / "report.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'chromium-profile'}", f"--screenshot={shot}",
                    "--window-size=1400,3000", written["report.html"].resolve().as_uri()],
                   check=True, timeout=120, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert shot.exists() and shot.stat().st_size > 20_000
    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[0] >= 2000 and pixels.shape[1] >= 1000
    assert pixels[..., :3].var() > 0.001  # not a blank page: text, tables and plots drawn
    # the plots' region (below the tables) is not blank either
    assert pixels[1000:, :, :3].var() > 0.001
