"""Every vLLM fact, once: its knobs, its metric catalogue and buckets, its /metrics reader and its log lines."""
