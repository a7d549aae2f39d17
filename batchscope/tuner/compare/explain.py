"""One or two sentences per variation saying what changed and why, from vLLM's own signals.

Pure rules over the comparison's numbers: the effects whose interval excludes 0, grouped (TTFT, time per token,
throughput), the largest first; the causes are server signals that moved past the thresholds below, with their
before -> after values. The rules in full: docs/tuner.md (Explanations).
"""

from __future__ import annotations

from batchscope.tuner.compare.model import MetricDelta, SettingSummary, VariationComparison
from batchscope.tuner.compare.verdicts import counts

STEP_RATIO = 1.2
QUEUE_RATIO, QUEUE_MIN_S = 2.0, 0.05
WAITING_MIN = 4
PREEMPT_RATIO, PREEMPT_MIN = 2.0, 10
KV_FULL = 0.99
REJECTED_MIN = 0.01  # admission rejections are a cause when their share of arrivals moved by >= 1 point
CAP_FRACTION = 0.9
ALSO_MIN = 0.05  # a group's other metric is named beside the lead only when it moved by >= 5%
ALSO_MAX = 2  # and at most this many of them

# The effect groups: metric keys, the order within a group breaking ties
TTFT = ("ttft_p99", "ttft_p50", "ttft_mean")
PER_TOKEN = ("itl_p99", "itl_p50", "tpot_p99", "tpot_p50", "tpot_mean")
THROUGHPUT = ("completion_throughput_rps", "output_tokens_per_s")


def explain(variation: VariationComparison, baseline: SettingSummary | None, setting: SettingSummary) -> str:
    """The explanation of one variation (the rules: docs/tuner.md, Explanations)."""
    if baseline is None or not baseline.runs_ok:
        return "no baseline run finished, so nothing to compare with"
    if not setting.runs_ok:
        return "every run of this setting failed (see the failed runs)"
    facts = _Facts(variation, baseline, setting)
    effects = sorted(facts.effects(), key=lambda e: -e.size)
    # throughput claims its causes first (preemptions explain lost throughput best); then the rest in the order
    # they are shown, so a signal's numbers come with the first clause that cites it
    clauses = {id(e): facts.clause(e) for e in sorted(effects, key=lambda e: e.group != THROUGHPUT)}
    tail = facts.leftovers()
    if not effects:
        sentence = "no significant change in TTFT, TPOT, ITL or throughput"
        return f"{sentence} ({'; '.join(tail)})" if tail else sentence
    text = "; ".join([*(clauses[id(e)] for e in effects), *tail])
    advice = facts.advice()
    return f"{text}. {advice}" if advice else text


class _Effect:
    """The metrics of one group that moved one way, largest first."""

    def __init__(self, group: tuple[str, ...], metrics: list[MetricDelta]):
        self.group = group
        self.metrics = sorted(metrics, key=lambda m: (-abs(m.relative or 0.0), group.index(m.metric)))
        self.lead = self.metrics[0]
        self.up = (self.lead.delta or 0.0) > 0
        self.size = abs(self.lead.relative or 0.0)

    def head(self, label: str | None = None) -> str:
        # throughput's twin (output tokens/s) moves with it: brackets only for the latencies
        others = [] if self.group == THROUGHPUT else self.metrics[1:]
        also = [m for m in others if abs(m.relative or 0.0) >= ALSO_MIN][:ALSO_MAX]
        brackets = f" ({', '.join(f'{m.label} {pct(m.relative)}' for m in also)})" if also else ""
        return f"{label or self.lead.label} {pct(self.lead.relative)}{brackets}"

    def has(self, key: str) -> bool:
        return any(m.metric == key for m in self.metrics)


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

    # --- effects: one clause per group and direction ------------------------------------------------------
    # Each cause is cited only in the direction that explains the effect (more queueing makes TTFT worse,
    # never better), and once: a later clause does not repeat it.

    def effects(self) -> list[_Effect]:
        out = []
        for group in (TTFT, PER_TOKEN, THROUGHPUT):
            moved = [m for m in map(self.v.metric, group) if counts(m)]
            for up in (True, False):
                same = [m for m in moved if ((m.delta or 0.0) > 0) == up]
                if same:
                    out.append(_Effect(group, same))
        return out

    def clause(self, effect: _Effect) -> str:
        up = effect.up
        if effect.group == TTFT:
            # fewer requests let in wait less: a latency won by turning arrivals away says so first
            reasons = [self._rejections(more=not up), self._steps(more=not up, prefill=True), self._prefill(up),
                       self._queue(up), self._preempt(up)]
            return self._clause(effect.head(), reasons, ": ")
        if effect.group == PER_TOKEN:
            stutter = self._stutter() if up and effect.has("itl_p99") else None
            chunked = None if up else self._chunked()
            reasons = [stutter, chunked, self._steps(more=up, prefill=False), self._running(up), self._preempt(up)]
            return self._clause(effect.head(), reasons, ": " if stutter or chunked else " ")
        label = "throughput" if effect.lead.metric == "completion_throughput_rps" else None
        return self._clause(effect.head(label), [self._preempt(not up), self._running(up)], ": ")

    def _clause(self, head: str, reasons: list[str | None], joiner: str) -> str:
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

    def _prefill(self, up: bool) -> str | None:
        """Mean prefill time (vLLM's request_prefill_time: scheduled to first token) moved the effect's way."""
        moved = self._moved("prefill_time_mean_s", up)
        if "prefill" in self.cited or moved is None:
            return None
        self.cited.add("prefill")
        a, b = moved
        text = f"prefill took {b / a if up else a / b:.1f}× {'longer' if up else 'less time'} " \
               f"(prefill time mean {num(a, 's')} → {num(b, 's')})"
        raised = self._knob("max_num_batched_tokens", raised=True)
        if up and raised is not None:
            text += f" — max_num_batched_tokens {raised:,} prefills several prompts together in longer steps"
        return text

    def _chunked(self) -> str | None:
        """Per-token latency down with a long-prefill cap set or lowered, shown binding by a longer prefill: each
        step carries a slice of a long prompt, no longer the whole of it, beside the running decodes."""
        change = self.changed.get("long_prefill_token_threshold")
        moved = self._moved("prefill_time_mean_s", True)
        if "prefill" in self.cited or change is None or moved is None or not isinstance(change.value, int) \
                or not change.value or (isinstance(change.baseline, int) and 0 < change.baseline <= change.value):
            return None
        self.cited.add("prefill")
        a, b = moved
        return f"long_prefill_token_threshold {change.value:,} gives a prompt at most that many tokens of a step, so " \
               f"a decode no longer shares its step with a whole prompt; prefill takes {b / a:.1f}× longer for it " \
               f"(prefill time mean {num(a, 's')} → {num(b, 's')})"

    def _stutter(self) -> str | None:
        """Tail ITL up: a decode's gap is a whole step, and a step that carries a long prefill is a long one."""
        itl = self.v.metric("itl_p99")
        raised = self._knob("max_num_batched_tokens", raised=True)
        longer = self._moved("tokens_per_step_mean", True)
        if "stutter" in self.cited or (raised is None and longer is None):
            return None
        self.cited.add("stutter")
        numbers = f"ITL p99 {num(itl.baseline, 's')} → {num(itl.value, 's')}"
        if raised is not None:
            return f"decodes stall in steps shared with long prefills ({numbers}) — max_num_batched_tokens " \
                   f"{raised:,} lets a long prompt's prefill into the same step as the running decodes"
        return f"decodes stall in longer steps ({numbers})"

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
        seqs = self._knob("max_num_seqs", raised=False)
        running = self.b.get("max_running") or 0
        if seqs is not None and running >= CAP_FRACTION * seqs:
            self.cited.add("cap")
            return f" — max_num_seqs {seqs} caps the running batch (max running {num(running)})"
        tokens = self._knob("max_num_batched_tokens", raised=False)
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
        seqs = self._knob("max_num_seqs", raised=False)
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

    def _rejections(self, more: bool) -> str | None:
        """vLLM's admission check refused a larger (or smaller) share of the arrivals, past REJECTED_MIN and with
        the count's interval excluding 0; the cap the variation set or tightened is named."""
        rejected = self.v.metric("rejected")
        share = self.v.metric("rejected_share")
        a, b = share.baseline or 0.0, share.value or 0.0
        if "rejected" in self.cited or not counts(rejected) or not (b - a >= REJECTED_MIN if more
                                                                      else a - b >= REJECTED_MIN):
            return None
        self.cited.add("rejected")
        if not more:
            return f"fewer arrivals rejected ({num(a, 'ratio')} → {num(b, 'ratio')}), so more of them wait"
        cap = self._admission_cap()
        return f"{cap + ', ' if cap else ''}{num(b, 'ratio')} of arrivals rejected (baseline {num(a, 'ratio')})"

    def _admission_cap(self) -> str | None:
        """The admission limit the variation set or lowered, in words."""
        for name, words in (("max_num_queued_reqs", "the queue is capped at {} requests"),
                            ("max_num_queued_tokens", "the prefill backlog is capped at {} tokens")):
            change = self.changed.get(name)
            if change is not None and isinstance(change.value, int) and (
                    not isinstance(change.baseline, int) or change.value < change.baseline):
                text = words.format(f"{change.value:,}") + f" ({name})"
                seqs = self.params.max_num_seqs
                if name == "max_num_queued_reqs" and seqs is not None and change.value < seqs:
                    # vLLM counts waiting + running against it: below max_num_seqs it caps the batch as well
                    text += f", below max_num_seqs {seqs}, so it caps the running batch too"
                return text
        return None

    def _knob(self, name: str, raised: bool) -> int | float | None:
        """The new value of a numeric parameter the variation raised (or lowered), else None."""
        change = self.changed.get(name)
        if change is None or not isinstance(change.value, int | float) or not isinstance(change.baseline, int | float):
            return None
        return change.value if (change.value > change.baseline) == raised and change.value != change.baseline \
            else None

    def _capacity(self) -> str:
        a, b = self.capacity
        if b is None:
            return ""
        return f" ({num(a)} → {num(b)} tokens)" if a is not None and a != b else f" ({num(b)} tokens)"

    # --- what is left to say --------------------------------------------------------------------------

    def leftovers(self) -> list[str]:
        """Notable signals no clause cited: admission rejections, preemptions (or their absence), a full KV cache."""
        rejected = self._rejections(more=True) or self._rejections(more=False)
        out = [rejected] if rejected else []
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
