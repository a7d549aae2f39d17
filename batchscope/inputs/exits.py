"""The exit codes every `batchscope` command uses, defined once (the README's table says the same)."""

OK = 0
BAD_INPUT = 2  # a flag, spec or plan is unusable; one line names the field; nothing was started or sent
UNBALANCED = 3  # a load run's outcomes do not add up to the requests it started
RUN_FAILED = 4  # the run ended early: too many requests failed (max_failed_fraction) or the target went away;
# for tune, the runs left nothing to compare (every baseline run failed, or every variation's)
INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C; SIGTERM to a run ends the same way
