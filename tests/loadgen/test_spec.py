"""The workload spec: its fixed shape, overrides, and one-line errors naming the field."""

from __future__ import annotations

import subprocess
import sys

import pytest

from batchscope.loadgen.spec import ConcurrencyLoad, PoissonLoad, SpecError, load_spec

DOC_EXAMPLE = """
model: auto
endpoint: completions          # or chat
input_tokens: 1024
output_tokens: 256
stream: true
timeout_s: 600
seed: 1
warmup_s: 30
duration_s: 120
load: {mode: concurrency, concurrency: 64}
"""


def test_the_documented_example_loads(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(DOC_EXAMPLE)
    spec = load_spec(path)
    assert spec.load == ConcurrencyLoad(concurrency=64)
    assert (spec.input_tokens, spec.output_tokens, spec.warmup_s, spec.duration_s) == (1024, 256, 30, 120)


def test_overrides_replace_nested_fields(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(DOC_EXAMPLE)
    spec = load_spec(path, ["load.mode=poisson", "load.rate=8.5", "load.concurrency=null", "input_tokens=10"])
    assert spec.load == PoissonLoad(rate=8.5) and spec.input_tokens == 10


@pytest.mark.parametrize(("overrides", "message"), [
    (["input_tokens=0"], "spec: input_tokens: Input should be greater than 0"),
    (["endpoint=grpc"], "spec: endpoint: Input should be 'completions' or 'chat'"),
    (["load.mode=burst"], "spec: load.mode: must be one of: concurrency, poisson, offline"),
    (["load.mode=poisson", "load.concurrency=null"], "spec: load.rate: Field required"),
    (["colour=blue"], "spec: colour: Extra inputs are not permitted"),
    (["noequals"], "--set: expected key=value"),
    (["shared_prefix.tokens=1024"], "spec: shared_prefix: tokens (1024) must be below input_tokens (1024)"),
    (["shared_prefix.tokens=64", "shared_prefix.distinct=0"], "spec: shared_prefix.distinct: Input should be"),
    (["shared_prefix.distinct=2"], "spec: shared_prefix.tokens: Field required"),
    (["shared_prefix.tokens=9000", "shared_prefix.distinct=10000", "input_tokens=10000"],
     "spec: shared_prefix: tokens x distinct (90000000) must be at most"),
])
def test_bad_fields_are_named(tmp_path, overrides, message):
    path = tmp_path / "spec.yaml"
    path.write_text(DOC_EXAMPLE)
    with pytest.raises(SpecError) as caught:
        load_spec(path, overrides)
    assert str(caught.value).startswith(message)


def test_chat_takes_a_shared_prefix_too(tmp_path):
    spec = load_spec(None, ["input_tokens=100", "output_tokens=8", "load.mode=offline", "load.requests=1",
                            "endpoint=chat", "shared_prefix.tokens=64", "shared_prefix.distinct=2"])
    assert spec.shared_prefix is not None and (spec.shared_prefix.tokens, spec.shared_prefix.distinct) == (64, 2)


def test_cli_rejects_a_bad_spec_in_one_line_before_starting_locust(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(DOC_EXAMPLE.replace("output_tokens: 256", "output_tokens: -3"))
    result = subprocess.run([sys.executable, "-m", "batchscope.cli", "load", "--spec", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "batchscope load: error: spec: output_tokens: Input should be greater than 0"]


def test_a_spec_that_is_not_yaml_names_the_line_and_column(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("input_tokens: 8\n  output_tokens: 8\n")
    with pytest.raises(SpecError) as error:
        load_spec(path)
    where = "line 2, column 16: mapping values are not allowed here"
    assert str(error.value) == f"spec: {path} is not valid YAML ({where})"


def test_a_closed_loop_ramps_by_default_in_proportion_to_its_users():
    def ramp(*fields: str) -> float:
        spec = load_spec(None, ["input_tokens=8", "output_tokens=4", "load.mode=concurrency", *fields])
        assert isinstance(spec.load, ConcurrencyLoad)
        return spec.load.ramp_up_s

    assert ramp("load.concurrency=256") == pytest.approx(2.56)  # 10 ms per user
    assert ramp("load.concurrency=100000") == 10.0  # at most 10 s
    assert ramp("load.concurrency=256", "load.ramp_up_s=0") == 0.0  # all at once, when asked
    # the dump carries the value in force, so a spec read back from summary.json sends the same load
    spec = load_spec(None, ["input_tokens=8", "output_tokens=4", "load.mode=concurrency", "load.concurrency=64"])
    assert spec.model_dump()["load"]["ramp_up_s"] == pytest.approx(0.64)
