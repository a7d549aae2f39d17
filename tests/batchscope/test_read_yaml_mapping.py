"""The one reader of a YAML file that must hold a mapping (the load spec's and the plan's): each problem one line
naming the file, in the caller's error type."""

from __future__ import annotations

import pytest

from batchscope.inputs.validation import INPUT_MAX_BYTES, read_yaml_mapping


class Refused(ValueError):
    pass


@pytest.mark.parametrize(("content", "problem"), [
    (None, "cannot read"),
    (b"\xff\xfe", "is not UTF-8 text"),
    (b"a: [1\n", "is not valid YAML (line 2, column 1:"),
    (b"- 1\n", "must hold a mapping of fields"),
    (b"", "must hold a mapping of fields"),
    (b"a: 1\n" + b"#" * INPUT_MAX_BYTES, "larger than 4 MiB"),
])
def test_each_problem_is_one_line_naming_the_file(tmp_path, content, problem):
    path = tmp_path / "plan.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(Refused) as raised:
        read_yaml_mapping(path, "plan", Refused)
    message = str(raised.value)
    assert message.startswith("plan: ") and str(path) in message and problem in message and "\n" not in message


def test_a_mapping_is_read_and_an_empty_file_may_be_one(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("load: {mode: offline}\n")
    assert read_yaml_mapping(path, "spec", Refused) == {"load": {"mode": "offline"}}
    path.write_text("")
    assert read_yaml_mapping(path, "spec", Refused, empty_ok=True) == {}
