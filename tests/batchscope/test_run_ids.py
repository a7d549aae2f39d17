"""batchscope.runs.run_ids: the one name format of run ids, plans and settings."""

from __future__ import annotations

import re

import pytest

from batchscope.runs.run_ids import NAME_PATTERN, RUN_ID, RUN_ID_MAX_LENGTH, default_run_id


@pytest.mark.parametrize("name", ["a", "one-knob", "mns-32-r0", "v1.2_x", "9", "a" * RUN_ID_MAX_LENGTH])
def test_names_that_make_safe_folders_and_labels_are_run_ids(name):
    assert RUN_ID.fullmatch(name) and re.fullmatch(NAME_PATTERN, name)


@pytest.mark.parametrize("name", ["", "-a", ".hidden", "a/b", "../x", "a b", "é", "a" * (RUN_ID_MAX_LENGTH + 1)])
def test_anything_else_is_not(name):
    assert not RUN_ID.fullmatch(name)


def test_the_default_run_id_is_the_start_time_and_a_valid_id():
    run_id = default_run_id()
    assert re.fullmatch(r"\d{8}T\d{6}", run_id) and RUN_ID.fullmatch(run_id)
