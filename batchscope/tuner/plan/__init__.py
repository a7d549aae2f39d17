"""The plan: its file (locked conditions, a baseline, one-knob variations) and the order its runs take."""

from batchscope.tuner.plan.file import (
    BASELINE,
    TUNABLE,
    CommandBackend,
    DockerBackend,
    Objective,
    Plan,
    PlanError,
    ServingParams,
    SimulatorBackend,
    Slos,
    load_plan,
    run_name,
)
from batchscope.tuner.plan.order import PlannedRun, plan_runs

__all__ = [
    "BASELINE", "TUNABLE", "CommandBackend", "DockerBackend", "Objective", "Plan", "PlanError", "PlannedRun",
    "ServingParams", "SimulatorBackend", "Slos", "load_plan", "plan_runs", "run_name",
]
