"""The exporter: runs as `batchscope exporter` (batchscope.exporter.cli); no other component imports it."""

__all__: list[str] = []
