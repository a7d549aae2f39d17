"""The simulator throughput bench (bench/sim_throughput.py), one job per module: ``settings`` (cores, deadlines,
targets), ``results`` (what a run measured), ``measure`` (one server, one closed loop, one window), ``runs``
(the closed-loop, paced and virtual-clock runs), ``report`` (tables, targets, JSON)."""
