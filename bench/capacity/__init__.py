"""The load generator capacity bench (bench/loadgen_capacity.py), one job per module: ``settings`` (cores,
deadlines, targets), ``server`` (the simulator and its ground truth), ``windows`` (snapshots and the figures of
a measurement window), ``reference_run`` and ``loadgen_runs`` (the two clients measured), ``truth`` (the join
with the server's ground truth: bias), ``phases`` (the order of runs), ``report`` (tables, notes, JSON)."""
