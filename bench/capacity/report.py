"""The capacity bench's report: the clients' table, the bias table, notes and warnings, the targets, and JSON."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from batchscope.testkit.report import table, targets_table
from capacity.phases import Results
from capacity.settings import (
    CLIENT_CORE,
    CONTENDED_CPU,
    MAX_RSS_MB,
    MAX_TTFT_BIAS_P99_MS,
    MIN_RATIO,
    SERVER_CORE,
    SERVER_FLAGS,
)
from capacity.spread import figures, spread_table
from capacity.truth import BURST_S, Bias
from capacity.windows import Window


def client_rows(results: Results) -> list[Window]:
    """Each run, then the pooled figures of clients that ran more than once."""
    rows = [w for runs in results.runs.values() for w in runs]
    return rows + [results.window(key) for key, runs in results.runs.items() if len(runs) > 1]


def clients_table(windows: list[Window]) -> str:
    header = ["client", "load", "run", "in flight", "tok/s client", "tok/s server", "client CPU", "tok/s per core",
              "server CPU", "step ms", "others c0/c1", "errors", "bound by"]
    rows = [[w.client, w.load, w.run, f"{w.in_flight:.0f}", f"{w.tokens_per_s:,.0f}", f"{w.server_tokens_per_s:,.0f}",
             f"{w.client_cpu:.0%}", f"{w.tokens_per_cpu_s:,.0f}", f"{w.server_cpu:.0%}", f"{w.step_ms:.2f}",
             f"{w.core0_other:.0%}/{w.core1_other:.0%}", str(w.errors), w.bound] for w in windows]
    return table(header, rows)


def bias_table(biases: list[Bias]) -> str:
    header = ["client, load", "requests", f"burst/{BURST_S * 1e3:g}ms", "TTFT p50 ms", "TTFT p99 ms", "TTFT max ms",
              "E2E p50 ms", "E2E p99 ms", "E2E max ms", "send->arrival p99 ms", "1st-token read p99 ms"]
    rows = [[b.label, f"{b.matched}" + (f" (+{b.unmatched} unmatched)" if b.unmatched else ""), str(b.burst),
             f"{b.ttft.p50:.2f}", f"{b.ttft.p99:.2f}", f"{b.ttft.max:.2f}", f"{b.e2e.p50:.2f}", f"{b.e2e.p99:.2f}",
             f"{b.e2e.max:.2f}", f"{b.send.p99:.2f}", f"{b.first_read.p99:.2f}"] for b in biases]
    return table(header, rows)


def checks(results: Results) -> list[tuple[str, str, bool]]:
    """(target, measured, passed) for each target of the issue, on the medians of the runs."""
    gen, memory, spread = results.window("gen"), results.memory_run(), figures(results)
    ratio = spread["gen"]["ratio_to_reference"]
    out = [(f"tokens/s per core >= {MIN_RATIO:.1f}x the reference, median ({gen.streams_label})",
            ratio.text(".2f", "x"), ratio.median >= MIN_RATIO)]
    for key in ("gen", "gen_poisson"):
        if key in results.runs:
            window, p99 = results.window(key), spread[key]["ttft_bias_p99_ms"]
            view = window.streams_label if key == "gen" else f"{window.load}, ~{window.in_flight:.0f} in flight"
            out.append((f"TTFT bias p99 <= {MAX_TTFT_BIAS_P99_MS:g} ms, median ({view})", p99.text(".2f", " ms"),
                        p99.median <= MAX_TTFT_BIAS_P99_MS))
    out.append((f"RSS per worker <= {MAX_RSS_MB:.0f} MB at {memory.streams:,} in-flight streams",
                f"{memory.peak_mb:.0f} MB", memory.peak_mb <= MAX_RSS_MB))
    return out


def loadgen_notes(window: Window) -> str:
    n = window.notes
    rss0, rss1 = n["rss_window_mb"]
    per_token = (rss1 - rss0) * 2**20 / max(window.client_tokens, 1)
    return (f"batchscope load, {window.load}, run {window.run}: summary.json output_tokens_per_s "
            f"{n['summary_tokens_per_s']:,.0f} over {n['summary_window_s']:.1f} s ({n['summary_completed']} requests "
            "scheduled and finished inside its window; outcomes "
            + ", ".join(f"{k} {v}" for k, v in n["summary_outcomes"].items() if v)
            + f"; exit status {n['exit_status']}); Locust RSS {rss0:.0f} -> {rss1:.0f} MB over the window "
            f"({(rss1 - rss0) / window.seconds * 60:+.1f} MB/min, {per_token:.0f} bytes per streamed token).")


def notes(results: Results) -> list[str]:
    ref, gen, memory = results.window("ref"), results.window("gen"), results.memory_run()
    lines = [
        "tok/s client: token events the client received in the window (reference: its own count; batchscope load: "
        "chunk times in records.jsonl). tok/s server: /sim/stats over the same window. tok/s per core: tok/s client "
        "/ client CPU. step ms: wall time per engine step. others c0/c1: CPU other processes took on core 0 / 1.",
        *(loadgen_notes(w) for key in ("gen", "gen_poisson") for w in results.runs.get(key, [])),
        "Reference CPU by getrusage: " + ", ".join(f"{w.notes['own_cpu']:.0%}" for w in results.runs["ref"])
        + " (by /proc: " + ", ".join(f"{w.client_cpu:.0%}" for w in results.runs["ref"]) + ").",
        f"Memory run: {memory.client_in_flight} in flight at the client at the end, >= {memory.server_open_min} open "
        f"at the server throughout {memory.sample_s:g} s of sampling ({memory.tokens_per_stream:.0f} tokens "
        f"streamed per stream meanwhile): VmRSS max {memory.rss_max_mb:.0f} MB, VmHWM {memory.hwm_mb:.0f} MB "
        f"(plus the `batchscope load` CLI wrapper process: {memory.wrapper_rss_mb:.0f} MB).",
    ]
    lines += growth_warning(results)
    for w in client_rows(results):
        if w.notes.get("records_missing"):
            lines.append(f"WARNING: {w.notes['records_missing']} requests of '{w.label}' sent before the window's "
                         "end were aborted without chunk times: its tok/s client is a lower bound (raise --tail).")
    if ref.bound == "server CPU" and gen.bound == "server CPU":
        lines.append("WARNING: the server saturated core 0 under both clients: both ran below capacity at the rate "
                     "the server set, so the ratio compares CPU per token at that rate, not saturated capacities.")
    elif "client CPU" not in (ref.bound, gen.bound):
        lines.append("Neither client saturated core 1: the ratio compares CPU per token at the rate the server "
                     "set, not saturated capacities.")
    contended = [f"{w.label} run {w.run} ({w.core0_other:.0%}/{w.core1_other:.0%})" for w in client_rows(results)
                 if w.run != "all" and max(w.core0_other, w.core1_other) >= CONTENDED_CPU]
    if contended:
        lines.append(f"WARNING: other processes took >= {CONTENDED_CPU:.0%} of core {SERVER_CORE} or {CLIENT_CORE} "
                     f"during {', '.join(contended)}: their rates and latencies are suspect (CPU per token less so).")
    return lines


def growth_warning(results: Results) -> list[str]:
    """RSS that grows with the tokens streamed reaches the limit after a while, whatever the streams in flight."""
    runs = results.runs["gen"]
    mb_per_min = sum((w.notes["rss_window_mb"][1] - w.notes["rss_window_mb"][0]) / w.seconds * 60 for w in runs)
    mb_per_min /= len(runs)
    if mb_per_min < 1.0:
        return []
    minutes = (MAX_RSS_MB - results.memory_run().peak_mb) / mb_per_min
    return [f"WARNING: the Locust process grew {mb_per_min:.0f} MB/min while streaming "
            f"{results.window('gen').tokens_per_s:,.0f} tok/s: at that rate it passes {MAX_RSS_MB:.0f} MB after "
            f"about {minutes:.1f} min, whatever the number of streams in flight."]


def report(results: Results, args: argparse.Namespace) -> str:
    biases = [results.bias(key) for key in results.runs]
    return "\n".join([
        f"Workload: prompt {args.input_tokens} token ids, max_tokens {args.output_tokens}, ignore_eos, stream + "
        f"include_usage; simulator --profile {args.profile} {' '.join(SERVER_FLAGS)} alone on core {SERVER_CORE}, "
        f"each client on core {CLIENT_CORE}; window {args.duration:g} s after a warm-up of {args.warmup:g} s "
        "(Poisson: plus one request's duration).",
        "",
        clients_table(client_rows(results)),
        "",
        "Median (min-max) over the runs:",
        spread_table(results),
        "",
        "Bias against the server's ground truth, client minus server (requests sent in the windows, completed):",
        bias_table(biases),
        f"burst: most server arrivals within {BURST_S * 1e3:g} ms. send->arrival: server arrival - client send. "
        "1st-token read: client first token - server first token written.",
        f"Closed loop: users started over {args.ramp_s:g} s (0: at once, in lockstep: TTFTs taken in bursts of "
        "sends the server queues). Poisson: the reference's closed-loop request rate, arrivals spread (fewer in "
        "flight: the server's steps are shorter with fewer streams).",
        "",
        *notes(results),
        "",
        targets_table(checks(results)),
    ])


def to_json(results: Results) -> dict:
    def window_json(w: Window) -> dict:
        return {**asdict(w), "tokens_per_s": w.tokens_per_s, "server_tokens_per_s": w.server_tokens_per_s,
                "tokens_per_cpu_s": w.tokens_per_cpu_s, "step_ms": w.step_ms, "bound": w.bound}

    return {
        "runs": {key: [window_json(w) for w in runs] for key, runs in results.runs.items()},
        "pooled": {key: window_json(results.window(key)) for key in results.runs},
        "bias_ms": {key: asdict(results.bias(key)) for key in results.runs},
        "medians": {key: {name: asdict(s) for name, s in spreads.items()} for key, spreads in figures(results).items()},
        "memory": asdict(results.memory_run()),
        "targets": [{"target": t, "measured": m, "pass": ok} for t, m, ok in checks(results)],
    }
