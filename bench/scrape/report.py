"""The exporter scrape bench's report: the setup, then each figure with its target or note."""

from __future__ import annotations

from scrape.measure import Result
from scrape.settings import BENCH_CORE, CONTENDED_SHARE, EXPORTER_CORE, MAX_P99_MS, MAX_RSS_MB


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def contention(share: float) -> str:
    return "contended: latencies inflated" if share >= CONTENDED_SHARE else ""


def report(result: Result) -> str:
    r = result
    rows = [
        ("scrape latency p50 (ms)", f"{r.p50_ms:.1f}", ""),
        ("scrape latency p99 (ms)", f"{r.p99_ms:.1f}", f"{verdict(r.p99_ok)} (target <= {MAX_P99_MS:.0f} ms)"),
        ("scrape latency max (ms)", f"{r.max_ms:.1f}", ""),
        ("exporter CPU per scrape (ms)", f"{r.cpu_ms_per_scrape:.1f}", "all threads"),
        ("vLLM fetch + parse, p50 (ms)", f"{r.upstream_vllm_p50_ms:.1f}", "exporter's own scrape_duration, wall"),
        ("loadgen fetch + parse, p50 (ms)", f"{r.upstream_loadgen_p50_ms:.1f}",
         "exporter's own scrape_duration, wall"),
        ("exporter VmRSS, max sampled (MB)", f"{r.rss_mb:.1f}", f"{verdict(r.rss_ok)} (target <= {MAX_RSS_MB:.0f} MB)"),
        ("exporter VmHWM (MB)", f"{r.hwm_mb:.1f}", ""),
        (f"other load on core {EXPORTER_CORE} (exporter)", f"{r.other_load_exporter_core:.0%}",
         contention(r.other_load_exporter_core)),
        (f"other load on core {BENCH_CORE} (bench)", f"{r.other_load_bench_core:.0%}",
         contention(r.other_load_bench_core)),
    ]
    width = max(len(name) for name, _, _ in rows)
    value_width = max(len(value) for _, value, _ in rows)
    lines = [
        f"batchscope exporter scrape benchmark: exporter alone on core {EXPORTER_CORE}, bench + stubs on core "
        f"{BENCH_CORE}",
        f"  vLLM stub      {r.vllm_series} series ({r.vllm_prefixed_series} vllm:*, {r.engines} DP engines), "
        f"{r.vllm_kb:.0f} KB",
        f"  loadgen stub   {r.client_series} series",
        f"  exporter       {r.exporter_series} series, {r.exporter_kb:.0f} KB per scrape; {r.scrapes} timed scrapes",
        f"  sanity         {r.sanity}",
        "",
    ]
    lines += [f"  {name:<{width}}  {value:>{value_width}}  {note}".rstrip() for name, value, note in rows]
    lines += ["", f"  bench duration {r.duration_s:.1f} s"]
    return "\n".join(lines)
