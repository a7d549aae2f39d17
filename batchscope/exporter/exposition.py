"""The Prometheus text exposition format batchscope serves everywhere.

Always the classic text format 0.0.4, whatever the scraper's Accept header asks: prometheus-client >= 0.23 would
otherwise negotiate a format in which Prometheus 2.x rewrites ``vllm:x`` names to ``vllm_x`` on scrape.
"""

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
