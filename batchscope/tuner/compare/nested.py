"""Nested mappings (a model's JSON dump) as flat 'a.b.c' paths: to name the first field where two differ."""

from __future__ import annotations

_MISSING = object()


def flatten(data: dict | list, prefix: str = "", *, lists: bool = False) -> dict[str, object]:
    """Every leaf of a nested mapping under its dotted path; with `lists`, list items too, by index
    ('variations.4.set.max_num_seqs'), else a list is one leaf."""
    items = enumerate(data) if isinstance(data, list) else data.items()
    flat: dict[str, object] = {}
    for key, value in items:
        if isinstance(value, dict) or (lists and isinstance(value, list) and value):
            flat.update(flatten(value, f"{prefix}{key}.", lists=lists))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def first_difference(old: dict, new: dict) -> tuple[str, object, object] | None:
    """(path, old value, new value) of the first leaf that differs, in `old`'s order then `new`'s; None if equal.

    A leaf one side lacks reads as None there.
    """
    before, after = flatten(old, lists=True), flatten(new, lists=True)
    for path in [*before, *(p for p in after if p not in before)]:
        if before.get(path, _MISSING) != after.get(path, _MISSING):
            return path, before.get(path), after.get(path)
    return None
