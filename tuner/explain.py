"""One or two sentences per variation saying what changed and why, from vLLM's own signals.

Pure rules over the comparison's numbers. The effects named are only the significant ones (TTFT, TPOT/ITL,
throughput: their CI excludes 0); the causes cited are server signals that moved past a threshold, always with
their before -> after values, and the parameter that changed says which cause is attributed to the knob. What
the numbers do not show is not claimed: without a significant effect the sentence says "no significant change".

Thresholds (server signals have no CI with one repeat, so a change must be large to be cited):
- tokens per step moved by >= 20% (ratio outside [1/1.2, 1.2]);
- queueing: mean queue time rose >= 2x and by >= 50 ms, or max waiting rose by >= max(4, its baseline);
- preemptions appeared (0 -> > 0), rose >= 2x and by >= 10, or disappeared (> 0 -> 0);
- KV full: peak usage >= 0.99;
- the running batch is capped when max running >= 90% of max_num_seqs.
"""

from __future__ import annotations

from tuner.comparison import MetricDelta, SettingSummary, VariationComparison

STEP_RATIO = 1.2
QUEUE_RATIO, QUEUE_MIN_S = 2.0, 0.05
WAITING_MIN = 4
PREEMPT_RATIO, PREEMPT_MIN = 2.0, 10
KV_FULL = 0.99
CAP_FRACTION = 0.9


def explain(variation: VariationComparison, baseline: SettingSummary | None, setting: SettingSummary) -> str:
    """The explanation of one variation (see the module docstring for the rules)."""
    if baseline is None or not baseline.runs_ok:
        return "no baseline run finished, so nothing to compare with"
    if not setting.runs_ok:
        return "every run of this setting failed (see the failed runs)"
    facts = _Facts(variation, baseline, setting)
    # throughput claims its causes first (preemptions explain lost throughput best), then shown in reading order
    throughput = facts.throughput()
    clauses = [clause for clause in (facts.ttft(), facts.latency_per_token(), throughput) if clause]
    tail = facts.leftovers()
    if not clauses:
        sentence = "no significant change in TTFT, TPOT, ITL or throughput"
        return f"{sentence} ({'; '.join(tail)})" if tail else sentence
    text = "; ".join([*clauses, *tail])
    advice = facts.advice()
    return f"{text}. {advice}" if advice else text


def pct(relative: float | None) -> str:
    """+12% / −38% (a real minus sign, as in the report's tables)."""
    if relative is None:
        return "n/a"
    return f"{'+' if relative >= 0 else '−'}{abs(relative) * 100:.0f}%"


def num(value: float | None, unit: str = "") -> str:
    """A signal value for a sentence: thousands separated, seconds to 2 decimals, ratios as %."""
    if value is None:
        return "n/a"
    if unit == "s":
        return f"{value:.2f} s" if value >= 0.1 else f"{value * 1000:.0f} ms"
    if unit == "ratio":
        return f"{value * 100:.0f}%"
    return f"{value:,.0f}"


class _Facts:
    """The signals of a baseline and a variation, and which of them a clause has already cited."""

    def __init__(self, variation: VariationComparison, baseline: SettingSummary, setting: SettingSummary):
        self.v, self.a, self.b = variation, baseline.signals, setting.signals
        self.params = setting.params
        self.base_params = baseline.params
        self.changed = {c.name: c for c in variation.changed}
        self.capacity = (baseline.kv_capacity_tokens, setting.kv_capacity_tokens)
        self.cited: set[str] = set()

    # --- effects: one clause each, only when significant -------------------------------------------------
    # Each cause is cited only in the direction that explains the effect (more queueing makes TTFT worse,
    # never better), and once: a later clause does not repeat it.

    def ttft(self) -> str | None:
        found = self._significant("ttft_p99", "ttft_p50")
        if found is None:
            return None
        metric, delta = found
        up = delta > 0
        return self._clause(metric, [self._steps(more=not up, prefill=True), self._queue(up), self._preempt(up)],
                            ": ")

    def latency_per_token(self) -> str | None:
        found = self._significant("itl_p50", "tpot_p50", "itl_p99", "tpot_p99")
        if found is None:
            return None
        metric, delta = found
        up = delta > 0
        return self._clause(metric, [self._steps(more=up, prefill=False), self._running(up), self._preempt(up)],
                            " ")

    def throughput(self) -> str | None:
        found = self._significant("completion_throughput_rps", "output_tokens_per_s")
        if found is None:
            return None
        metric, delta = found
        label = "throughput" if metric.metric == "completion_throughput_rps" else metric.label
        down = delta < 0
        return self._clause(metric, [self._preempt(down), self._running(not down)], ": ", label)

    def _significant(self, *keys: str) -> tuple[MetricDelta, float] | None:
        """The first of the metrics whose delta is significant, with that delta."""
        return next(((m, m.delta) for m in map(self.v.metric, keys) if m.significant and m.delta is not None), None)

    def _clause(self, metric: MetricDelta, reasons: list[str | None], joiner: str, label: str | None = None) -> str:
        head = f"{label or metric.label} {pct(metric.relative)}"
        found = [r for r in reasons if r]
        return f"{head}{joiner}{', and '.join(found)}" if found else head

    # --- causes: each cited once, with its numbers ----------------------------------------------------

    def _moved(self, field: str, up: bool) -> tuple[float, float] | None:
        """(before, after) when the signal moved by >= STEP_RATIO in the asked direction."""
        a, b = self.a.get(field), self.b.get(field)
        if not a or not b or not (b / a >= STEP_RATIO if up else b / a <= 1 / STEP_RATIO):
            return None
        return a, b

    def _steps(self, more: bool, prefill: bool) -> str | None:
        # cited once per effect kind: the same longer steps admit prompts sooner and space tokens wider
        kind = "steps-prefill" if prefill else "steps-length"
        moved = self._moved("tokens_per_step_mean", more)
        if kind in self.cited or moved is None:
            return None
        a, b = moved
        numbers = "" if self.cited & {"steps-prefill", "steps-length"} else f" (tokens per step {num(a)} → {num(b)})"
        self.cited.add(kind)
        if prefill:
            ratio = b / a if more else a / b
            # "fit" only when the token budget was the knob; otherwise the steps just carried fewer tokens
            what = "prefill tokens fit" if "max_num_batched_tokens" in self.changed else "tokens scheduled"
            return f"{ratio:.1f}× {'more' if more else 'fewer'} {what} per step{numbers}"
        return f"as steps got {'longer' if more else 'shorter'}{numbers}"

    def _queue(self, up: bool) -> str | None:
        qa, qb = self.a.get("queue_time_mean_s"), self.b.get("queue_time_mean_s")
        wa, wb = self.a.get("max_waiting") or 0, self.b.get("max_waiting") or 0
        queue_up = qa is not None and qb is not None and qb >= QUEUE_RATIO * qa and qb - qa >= QUEUE_MIN_S
        queue_down = qa is not None and qb is not None and qa >= QUEUE_RATIO * qb and qa - qb >= QUEUE_MIN_S
        waiting_up = wb - wa >= max(WAITING_MIN, wa)
        waiting_down = wa - wb >= max(WAITING_MIN, wb)
        rose, fell = queue_up or (waiting_up and not queue_down), queue_down or (waiting_down and not queue_up)
        if "queue" in self.cited or not (rose if up else fell):
            return None
        self.cited.add("queue")
        numbers = f"max waiting {num(wa)} → {num(wb)}"
        if qa is not None and qb is not None:
            numbers += f", queue time mean {num(qa, 's')} → {num(qb, 's')}"
        if not up:
            return f"less waiting in the scheduler queue ({numbers})"
        return f"requests waited in the scheduler queue ({numbers}){self._queue_cause()}"

    def _queue_cause(self) -> str:
        """Which cap made them wait: attributed to the changed knob only when a signal shows it binding."""
        seqs = self._lowered("max_num_seqs")
        running = self.b.get("max_running") or 0
        if seqs is not None and running >= CAP_FRACTION * seqs:
            self.cited.add("cap")
            return f" — max_num_seqs {seqs} caps the running batch (max running {num(running)})"
        tokens = self._lowered("max_num_batched_tokens")
        if tokens is not None:
            return f" — max_num_batched_tokens {tokens:,} admits fewer prompt tokens per step"
        if (self.b.get("kv_usage_peak") or 0) >= KV_FULL:
            self.cited.add("kv")
            return f" — the KV cache is full (peak {num(self.b['kv_usage_peak'], 'ratio')}), new requests wait " \
                   "for free blocks"
        return ""

    def _running(self, more: bool) -> str | None:
        moved = self._moved("max_running", more)
        if "running" in self.cited or moved is None:
            return None
        self.cited.add("running")
        a, b = moved
        text = f"{'more' if more else 'fewer'} sequences per step (max running {num(a)} → {num(b)})"
        seqs = self._lowered("max_num_seqs")
        if not more and seqs is not None and b >= CAP_FRACTION * seqs and "cap" not in self.cited:
            self.cited.add("cap")
            text += f" — max_num_seqs {seqs} caps the running batch"
        return text

    def _preempt(self, appeared: bool) -> str | None:
        a, b = self.a.get("preemptions") or 0, self.b.get("preemptions") or 0
        if "preempt" in self.cited:
            return None
        if appeared and b > 0 and (a == 0 or (b >= PREEMPT_RATIO * a and b - a >= PREEMPT_MIN)):
            self.cited.add("preempt")
            kv = self.b.get("kv_usage_peak") or 0
            text = f"{num(b)} preemptions (baseline {num(a)}), KV peak {num(kv, 'ratio')}"
            if kv >= KV_FULL:
                self.cited.add("kv")
                seqs = self.params.max_num_seqs
                text += f" — the KV cache{self._capacity()} is too small for " + \
                    (f"{seqs} sequences" if seqs is not None else "the running sequences")
            return text
        if not appeared and a > 0 and b == 0:
            self.cited.add("preempt")
            return f"preemptions gone ({num(a)} → 0)"
        return None

    def _lowered(self, name: str) -> int | float | None:
        """The new value of a numeric parameter the variation lowered, else None."""
        change = self.changed.get(name)
        if change is None or not isinstance(change.value, int | float) or not isinstance(change.baseline, int | float):
            return None
        return change.value if change.value < change.baseline else None

    def _capacity(self) -> str:
        a, b = self.capacity
        if b is None:
            return ""
        return f" ({num(a)} → {num(b)} tokens)" if a is not None and a != b else f" ({num(b)} tokens)"

    # --- what is left to say --------------------------------------------------------------------------

    def leftovers(self) -> list[str]:
        """Notable signals no clause cited: preemptions (or their absence) and a full KV cache."""
        out = []
        preempt = self._preempt(True) or self._preempt(False)
        if preempt:
            out.append(preempt)
        elif "preempt" not in self.cited and not self.a.get("preemptions") and not self.b.get("preemptions"):
            out.append("no preemptions")
        kv = self.b.get("kv_usage_peak") or 0
        if "kv" not in self.cited and kv >= KV_FULL:
            out.append(f"KV peak {num(kv, 'ratio')}")
        return out

    def advice(self) -> str | None:
        """The seed's remedy, only when preemptions came with a full KV cache."""
        if "preempt" not in self.cited or (self.b.get("kv_usage_peak") or 0) < KV_FULL \
                or not self.b.get("preemptions"):
            return None
        return "Raise gpu_memory_utilization or lower max_num_seqs / max_num_batched_tokens."
