"""The exporter scrape bench (bench/exporter_scrape.py), one job per module: ``settings`` (cores, deadlines,
targets), ``upstreams`` (the vLLM and load generator expositions the stubs serve), ``stubs`` (static HTTP
servers), ``exporter`` (the exporter child and one scrape), ``measure`` (the timed scrapes and their figures),
``report``."""
