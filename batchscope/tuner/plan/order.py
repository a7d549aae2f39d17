"""A plan's runs in the order they are made: every setting for repeat 0, then repeat 1..., so slow drift of the
machine does not load one setting, and each repeat has its own baseline run beside the variations'."""

from __future__ import annotations

from dataclasses import dataclass

from batchscope.tuner.plan.file import Plan, run_name
from batchscope.tuner.plan.settings import ServingParams


@dataclass(frozen=True)
class PlannedRun:
    index: int
    setting: str
    params: ServingParams
    repeat: int

    @property
    def name(self) -> str:
        return run_name(self.setting, self.repeat)


def plan_runs(plan: Plan) -> list[PlannedRun]:
    """Every setting × repeat, repeats interleaved (baseline first within each)."""
    settings = plan.settings()
    order = [(setting, params, repeat) for repeat in range(plan.repeats) for setting, params in settings]
    return [PlannedRun(i + 1, *entry) for i, entry in enumerate(order)]
