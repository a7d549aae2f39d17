"""Exporter hostile-upstream benchmark: what `batchscope exporter` costs in memory and scrape time in front of a
vLLM /metrics that is huge, endless, hanging, dripping or without a charset (batchscope.testkit.hostile).

The hostile server runs on a thread of the bench process (pinned to core 1); `batchscope exporter --vllm-url
<it> --scrape-timeout-s 2` runs as a child pinned to core 0. For each mode, for --duration seconds:

* metrics-huge (200 MB with Content-Length), metrics-endless (chunked, never ends), metrics-drip (1 byte per
  100 ms), metrics-no-charset: one scraper scraping back to back;
* metrics-hang (never answers): 10 concurrent scrapers, each back to back.

Every scrape is a new connection with Prometheus' Accept header, timed client-side, its batchscope_up and
batchscope_scrape_error_info read. The exporter's VmRSS is sampled every 20 ms (/proc/PID/status), VmHWM read
at the end; "growth" is the largest RSS of the last quarter of the window minus that of the first quarter.
Targets: every scrape <= the scrape timeout + 1 s (3 s, under the 5 s scrape timeout of prometheus.yml) with
up 0 and the mode's reason (up 1 and the label "modèle" for metrics-no-charset); VmHWM <= 100 MB; RSS growth
<= 5 MB. Also shown: the /metrics requests the hostile server saw (concurrent scrapes share one collection).
Exit status 0 whatever the figures; non-zero when the exporter does not start or answers wrongly.

    .venv/bin/python bench/exporter_hostile.py [--duration S] [--json FILE]
"""

from __future__ import annotations

import http.client
import os
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from scrape.exporter import claim_bench_core, scrape, wait_ready
from scrape.settings import EXPORTER_CORE, REPO, STOP_TIMEOUT_S

from batchscope.testkit.hostile import HostileServer
from batchscope.testkit.processes import Child, SetupError
from batchscope.testkit.procfs import status_mb
from batchscope.testkit.report import add_json_option, argument_parser, table, targets_table, write_json
from batchscope.vllm import catalogue
from batchscope.wire.listen import free_port

SCRAPE_TIMEOUT_S = 2.0  # the exporter's --scrape-timeout-s (its default)
MAX_SCRAPE_S = SCRAPE_TIMEOUT_S + 1.0
MAX_HWM_MB = 100.0
MAX_GROWTH_MB = 5.0
CONCURRENT = 10
SAMPLE_S = 0.02
# mode -> (concurrent scrapers, expected up, expected reason)
MODES = {"metrics-huge": (1, 0, "too_large"), "metrics-endless": (1, 0, "too_large"),
         "metrics-hang": (CONCURRENT, 0, "timeout"), "metrics-drip": (1, 0, "timeout"),
         "metrics-no-charset": (1, 1, "")}


@dataclass
class ModeResult:
    mode: str
    scrapers: int
    scrapes: int
    upstream_requests: int
    latency_p50_s: float
    latency_max_s: float
    ups: list[int]
    reasons: list[str]
    labels_ok: bool
    hwm_mb: float
    rss_max_mb: float
    growth_mb: float
    rss_series_mb: list[float] = field(repr=False)


def answer(body: bytes) -> tuple[int, str, bool]:
    """(batchscope_up of vllm, its reason or '', whether vllm:* labels read back as UTF-8) of one scrape."""
    up, reason, labels_ok = -1, "", True
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if family.name == "batchscope_up" and sample.labels.get("target") == "vllm":
                up = int(sample.value)
            elif family.name == "batchscope_scrape_error_info" and sample.labels.get("target") == "vllm":
                reason = sample.labels["reason"]
            elif family.name.startswith(catalogue.PREFIX) and "model_name" in sample.labels:
                labels_ok &= sample.labels["model_name"] in ("modèle", "hostile-model")
    return up, reason, labels_ok


def start_exporter(vllm_url: str, port: int, log_path: Path) -> Child:
    env = {key: value for key, value in os.environ.items() if not key.startswith("BATCHSCOPE_")}
    args = [sys.executable, "-m", "batchscope.cli", "exporter", "--vllm-url", vllm_url, "--host", "127.0.0.1",
            "--port", str(port), "--scrape-timeout-s", str(SCRAPE_TIMEOUT_S)]
    return Child("exporter", args, log_path, core=EXPORTER_CORE, new_session=True, cwd=REPO, env=env)


def sample_rss(pid: int, stop: threading.Event, series: list[float]) -> None:
    """VmRSS every SAMPLE_S until ``stop`` (the window is bounded by the caller)."""
    while not stop.wait(SAMPLE_S):
        try:
            series.append(status_mb(pid, "VmRSS"))
        except (OSError, ProcessLookupError):
            return


def scrape_loop(port: int, until: float, out: list[tuple[float, bytes]]) -> None:
    while time.monotonic() < until:
        out.append(scrape(port))


def run_scrapers(port: int, count: int, duration_s: float) -> list[tuple[float, bytes]]:
    until = time.monotonic() + duration_s
    results: list[list[tuple[float, bytes]]] = [[] for _ in range(count)]
    threads = [threading.Thread(target=scrape_loop, args=(port, until, out)) for out in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(duration_s + 30)
    return [item for out in results for item in out]


def quarter_growth(series: list[float]) -> float:
    quarter = max(len(series) // 4, 1)
    return max(series[-quarter:]) - max(series[:quarter]) if series else float("nan")


def measure(mode: str, duration_s: float, workdir: Path) -> ModeResult:
    scrapers = MODES[mode][0]
    with HostileServer(mode) as server:
        port = free_port()
        exporter = start_exporter(server.url, port, workdir / f"exporter-{mode}.log")
        try:
            wait_ready(exporter, port)
            seen_before = server.seen["/metrics"]
            stop, series = threading.Event(), list[float]()
            sampler = threading.Thread(target=sample_rss, args=(exporter.pid, stop, series), daemon=True)
            sampler.start()
            scrapes = run_scrapers(port, scrapers, duration_s)
            stop.set()
            sampler.join(5)
            hwm = status_mb(exporter.pid, "VmHWM")
            upstream = server.seen["/metrics"] - seen_before
        finally:
            exporter.stop(STOP_TIMEOUT_S)
    latencies = sorted(elapsed for elapsed, _ in scrapes)
    answers = [answer(body) for _, body in scrapes]
    return ModeResult(mode=mode, scrapers=scrapers, scrapes=len(scrapes), upstream_requests=upstream,
                      latency_p50_s=latencies[len(latencies) // 2], latency_max_s=latencies[-1],
                      ups=sorted({up for up, _, _ in answers}), reasons=sorted({reason for _, reason, _ in answers}),
                      labels_ok=all(ok for _, _, ok in answers), hwm_mb=hwm, rss_max_mb=max(series, default=hwm),
                      growth_mb=quarter_growth(series), rss_series_mb=series)


def checks(result: ModeResult) -> list[tuple[str, str, bool]]:
    _, up, reason = MODES[result.mode]
    said = f"up {','.join(map(str, result.ups))}, reason {','.join(result.reasons) or '-'}"
    expected = f"up {up}, reason {reason or '-'}"
    rows = [(f"{result.mode}: every scrape {expected}", said,
             result.ups == [up] and result.reasons == [reason] and result.labels_ok),
            (f"{result.mode}: every scrape <= {MAX_SCRAPE_S:g} s", f"max {result.latency_max_s:.2f} s",
             result.latency_max_s <= MAX_SCRAPE_S),
            (f"{result.mode}: VmHWM <= {MAX_HWM_MB:g} MB", f"{result.hwm_mb:.1f} MB", result.hwm_mb <= MAX_HWM_MB)]
    if result.mode in ("metrics-huge", "metrics-endless"):
        rows.append((f"{result.mode}: RSS growth <= {MAX_GROWTH_MB:g} MB", f"{result.growth_mb:+.1f} MB",
                     result.growth_mb <= MAX_GROWTH_MB))
    return rows


def outcome_table(results: list[ModeResult]) -> str:
    header = ["mode", "scrapers", "scrapes", "upstream GETs", "up", "reason", "p50 s", "max s", "VmHWM MB",
              "RSS growth MB"]
    rows = [[r.mode, str(r.scrapers), str(r.scrapes), str(r.upstream_requests), ",".join(map(str, r.ups)),
             ",".join(r.reasons) or "-", f"{r.latency_p50_s:.2f}", f"{r.latency_max_s:.2f}", f"{r.hwm_mb:.1f}",
             f"{r.growth_mb:+.1f}"] for r in results]
    return table(header, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of scrapes per mode (default 10)")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES), help="modes to run")
    add_json_option(parser)
    args = parser.parse_args(argv)
    if not args.duration > 0:
        parser.error("--duration must be > 0")
    if not claim_bench_core("exporter_hostile"):
        return 2
    with tempfile.TemporaryDirectory(prefix="exporter-hostile-") as workdir:
        try:
            results = [measure(mode, args.duration, Path(workdir)) for mode in args.modes]
        except (SetupError, OSError, http.client.HTTPException) as exc:
            print(f"exporter_hostile: setup failed: {exc}", file=sys.stderr)
            return 1
    print(f"batchscope exporter against a hostile vLLM /metrics: exporter on core {EXPORTER_CORE}, "
          f"--scrape-timeout-s {SCRAPE_TIMEOUT_S:g}, {args.duration:g} s per mode\n")
    print(outcome_table(results))
    print()
    print(targets_table([check for result in results for check in checks(result)]))
    if args.json:
        write_json(args.json, [asdict(result) for result in results])
    return 0


if __name__ == "__main__":
    sys.exit(main())
