"""A run's identity and marks: run names, result-file headers, the tuner's live file, Grafana annotations."""
