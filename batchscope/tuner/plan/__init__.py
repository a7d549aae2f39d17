"""The plan: its file (locked conditions, a baseline, one-knob variations), a setting and how it is applied, and
the order its runs take."""

from batchscope.tuner.plan.file import BASELINE, Objective, Plan, PlanError, Slos, load_plan, run_name
from batchscope.tuner.plan.order import PlannedRun, plan_runs
from batchscope.tuner.plan.settings import TUNABLE, CommandBackend, DockerBackend, ServingParams, SimulatorBackend

__all__ = [
    "BASELINE", "TUNABLE", "CommandBackend", "DockerBackend", "Objective", "Plan", "PlanError", "PlannedRun",
    "ServingParams", "SimulatorBackend", "Slos", "load_plan", "plan_runs", "run_name",
]
