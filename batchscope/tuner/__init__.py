"""The tuner: the one-knob method as `batchscope tune` and `batchscope report` (batchscope.tuner.cli).

No other component imports it, so its face offers nothing; its sub-packages' faces are listed in README.md.
"""

__all__: list[str] = []
