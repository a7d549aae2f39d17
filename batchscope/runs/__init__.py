"""A run's identity and marks: run names, the tuner's live file the exporter follows, and Grafana annotations."""
