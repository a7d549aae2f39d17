"""What tests and benches share to drive real processes: the simulator launcher, child processes with deadlines,
/proc sampling, the reference streaming client and report tables.

One module per job: ``processes`` (start, poll, stop, pin), ``simulator`` (THE way to start
`batchscope sim serve`), ``procfs`` (CPU time and memory of a pid), ``bounded`` (a child run under a memory
limit and a deadline, its exact peak RSS), ``reference_client`` (the minimal aiohttp streaming client benches
compare against; runnable as a child), ``report`` (plain and markdown tables, a bench's command line and JSON
figures). Nothing here is used by the product itself;
free ports come from ``batchscope.wire.listen.free_port``, which the tuner uses too.
"""
