"""The tuning plan: locked conditions, a baseline, and variations that each change ONE serving parameter.

The seed article's method as a file (YAML, validated by pydantic): lock the workload (the load generator's spec,
inline or by path), take a baseline (a knob it leaves unset is not passed: vLLM's default), then change one
parameter at a time; a variation may set a knob the baseline leaves unset. A variation that
changes two parameters is refused unless it says `combination: true`. Every problem is one line naming the
field (PlanError).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from batchscope.inputs.validation import TAGGED_UNION_ERRORS, first_error, read_yaml_mapping
from batchscope.loadgen import (
    DEFAULT_SLO_TPOT_S,
    DEFAULT_SLO_TTFT_S,
    MAX_TIMEOUT_S,
    SloTargets,
    WorkloadSpec,
    within_slo,
)
from batchscope.runs import run_ids
from batchscope.tuner.plan.settings import TUNABLE, Backend, ServingParams, SimulatorBackend

SCHEMA_VERSION: Final = 1
# A plan's and a variation's name: it names folders (results/<plan>/<setting>-r<n>/) and the load run's --run-id
NAME_PATTERN = f"^{run_ids.NAME_PATTERN}$"
BASELINE = "baseline"  # the reference setting's name; a variation may not take it
LOAD_MODES = ("concurrency", "poisson", "offline")
# What the report's one recommendation optimises, among the settings that met the SLOs (compare.verdicts.OBJECTIVES)
Objective = Literal["goodput", "throughput", "ttft_p99", "ttft_mean", "tpot_p99", "tpot_mean"]


class PlanError(ValueError):
    """A plan problem, already phrased as one line naming the field."""


class Variation(BaseModel):
    """One setting to compare with the baseline: the parameters it changes."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=NAME_PATTERN,
                      description="Run name (a folder under results/<plan>/).")
    # bool first: a switch's `true` stays true in plan.json (pydantic would make it 1 as an int)
    set: dict[str, bool | int | float] = Field(description="Parameters changed from the baseline, e.g. "
                                               "{max_num_seqs: 32}; a switch takes true or false.")
    combination: bool = Field(False, description="Allow more than one changed parameter (not one-knob).")

    @field_validator("set")
    @classmethod
    def _known_parameters(cls, values: dict[str, bool | int | float]) -> dict[str, bool | int | float]:
        unknown = sorted(set(values) - set(TUNABLE))
        if unknown:
            raise ValueError(f"unknown parameter {unknown[0]} (allowed: {', '.join(TUNABLE)})")
        if not values:
            raise ValueError("changes nothing")
        return values

    @model_validator(mode="after")
    def _one_knob(self) -> Variation:
        if len(self.set) > 1 and not self.combination:
            raise ValueError(f"changes {len(self.set)} parameters ({', '.join(sorted(self.set))}); change one "
                             "at a time, or mark it combination: true")
        return self


class Slos(BaseModel):
    """Latency bounds a configuration must meet (p99, seconds), as MLPerf's server scenario."""

    model_config = ConfigDict(extra="forbid")
    # bounded as the load spec's targets (run_spec hands them to the load generator)
    ttft_p99_s: float | None = Field(DEFAULT_SLO_TTFT_S, gt=0, le=MAX_TIMEOUT_S,
                                     description="Bound on client p99 TTFT, seconds.")
    tpot_p99_s: float | None = Field(DEFAULT_SLO_TPOT_S, gt=0, le=MAX_TIMEOUT_S,
                                     description="Bound on client p99 TPOT, seconds.")

    def met_by(self, ttft_s: float, tpot_s: float | None) -> bool:
        """One request within both bounds, vLLM bench serve's goodput rule (loadgen.spec.within_slo, the load
        generator's goodput counter's too)."""
        return within_slo(ttft_s, tpot_s, self.ttft_p99_s, self.tpot_p99_s)

    def targets(self) -> SloTargets:
        """The same bounds as a load spec's per-request targets."""
        return SloTargets(ttft_s=self.ttft_p99_s, tpot_s=self.tpot_p99_s)

    def count_met(self, requests: list[tuple[float, float | None]]) -> int:
        """How many of the (TTFT, TPOT) requests met both bounds: the count behind goodput."""
        return sum(self.met_by(ttft, tpot) for ttft, tpot in requests)


class Plan(BaseModel):
    """A whole tuning plan."""

    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[1] = Field(SCHEMA_VERSION, description="Plan format version.")
    name: str = Field(min_length=1, max_length=64, pattern=NAME_PATTERN,
                      description="Plan name (results/<name>/).")
    workload: WorkloadSpec = Field(description="The locked conditions: a load generator spec (inline, or a "
                                               "path to one relative to the plan file).")
    backend: Backend = Field(default_factory=SimulatorBackend, description="How a setting is applied.")
    baseline: ServingParams = Field(description="The reference configuration; a knob it leaves unset is vLLM's "
                                                "default (not passed).")
    variations: list[Variation] = Field(default_factory=list, description="Settings compared with the baseline.")
    repeats: int = Field(1, ge=1, le=100, description="Runs per setting (confidence intervals across repeats).")
    warmup_s: float = Field(10.0, ge=0, le=86_400, description="Load before the window, seconds (not measured).")
    window_s: float = Field(60.0, gt=0, le=86_400, description="Measurement window per run, seconds.")
    slos: Slos = Field(default_factory=Slos, description="Bounds for the verdict (and MLPerf's server search).")
    objective: Objective = Field("goodput", description="What the report recommends by, among the settings that "
                                 "met the SLOs: goodput (completed requests per second that met every SLO), "
                                 "throughput, or a latency (lowest ttft_p99, ttft_mean, tpot_p99, tpot_mean).")
    prometheus_url: str | None = Field(None, description="Prometheus to query for each run's window (optional).")
    grafana_url: str | None = Field(None, description="Grafana to annotate each run as a region (optional).")

    @model_validator(mode="after")
    def _run_ids_fit(self) -> Plan:
        # every run's load is started with --run-id <plan>-<setting>-r<repeat>, which has a length bound
        longest = self.run_id(max([BASELINE, *(v.name for v in self.variations)], key=len), self.repeats - 1)
        if len(longest) > run_ids.RUN_ID_MAX_LENGTH:
            raise ValueError(f"name and variation names too long: a run id (<name>-<variation>-r<repeat>) would "
                             f"have {len(longest)} characters, at most {run_ids.RUN_ID_MAX_LENGTH}")
        return self

    @model_validator(mode="after")
    def _distinct_names(self) -> Plan:
        names = [v.name for v in self.variations]
        if BASELINE in names or len(set(names)) != len(names):
            raise ValueError("variation names must be distinct and not 'baseline'")
        return self

    def settings(self) -> list[tuple[str, ServingParams]]:
        """(name, parameters) of every setting, the baseline first; raises PlanError for an invalid one."""
        out = [(BASELINE, self.baseline)]
        for index, variation in enumerate(self.variations):
            try:
                # the fields as they are (dict()), not a dump: a dump masks secret extra flags
                params = ServingParams.model_validate({**dict(self.baseline), **variation.set})
            except ValidationError as exc:
                # the path as the plan file spells it, as every other plan error does
                raise PlanError(one_line(exc, f"variations.{index}.set")) from None
            out.append((variation.name, params))
        return out

    def run_id(self, setting: str, repeat: int) -> str:
        """The load run's --run-id of one run."""
        return f"{self.name}-{run_name(setting, repeat)}"

    def run_spec(self) -> WorkloadSpec:
        """The workload of every run: the locked conditions with the plan's warm-up, window and SLOs (so the load
        generator's live goodput judges by the plan's)."""
        return self.workload.model_copy(update={"warmup_s": self.warmup_s, "duration_s": self.window_s,
                                                "slo": self.slos.targets()})


def run_name(setting: str, repeat: int) -> str:
    """A run's folder under results/<plan>/."""
    return f"{setting}-r{repeat}"


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file; raise PlanError with one line naming the field."""
    path = Path(path)
    data = read_yaml_mapping(path, "plan", PlanError)
    if isinstance(data.get("workload"), str):
        data["workload"] = read_yaml_mapping(path.parent / data["workload"], "plan: workload", PlanError)
    try:
        plan = Plan.model_validate(data)
    except ValidationError as exc:
        raise PlanError(one_line(exc)) from None
    plan.settings()  # every variation applied to the baseline must itself be a valid configuration
    return plan



def _without_union_tags(field: str) -> str:
    # pydantic names the union member (a backend kind, a load mode) right after the union's field, which is not
    # what the user wrote: backend.command.command is the command backend's `command`, backend.command.port its port
    parts = field.split(".")
    for union in (["backend"], ["workload", "load"]):
        if parts[:len(union)] == union and len(parts) > len(union):
            del parts[len(union)]
    return ".".join(parts)


def one_line(exc: ValidationError, prefix: str = "") -> str:
    """The first validation error as 'plan: field.path: message'."""
    field, message, kind = first_error(exc, field_name=_without_union_tags)
    if kind in TAGGED_UNION_ERRORS:
        message = f"kind must be one of: {exc.errors()[0].get('ctx', {}).get('expected_tags', '')}" \
            if "backend" in field.split(".") else f"mode must be one of: {', '.join(LOAD_MODES)}"
    where = ".".join(filter(None, [prefix, field]))
    return f"plan: {where}: {message}" if where else f"plan: {message}"  # a rule across fields names them itself
