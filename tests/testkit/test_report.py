"""Report tables: columns aligned, markdown escaped, targets marked PASS/FAIL."""

from __future__ import annotations

from batchscope.testkit.report import markdown_table, table, targets_table


def test_plain_table_left_aligns_the_first_column_and_right_aligns_the_rest():
    text = table(["run", "tok/s"], [["closed loop 64", "21,000"], ["paced", "5"]])
    assert text.splitlines() == [
        "run              tok/s",
        "--------------  ------",
        "closed loop 64  21,000",
        "paced                5",
    ]


def test_markdown_table_aligns_by_colons_and_escapes_pipes():
    text = markdown_table(["target", "measured"], [["a|b", "1 ms"]])
    assert text.splitlines() == ["| target | measured |", "|:---|---:|", "| a\\|b | 1 ms |"]


def test_targets_table_marks_each_check():
    text = targets_table([("p99 <= 50 ms", "12.0 ms", True), ("RSS <= 100 MB", "130 MB", False)])
    rows = text.splitlines()[2:]
    assert rows[0].endswith("PASS") and rows[1].endswith("FAIL")
    assert rows[1].startswith("RSS <= 100 MB")
