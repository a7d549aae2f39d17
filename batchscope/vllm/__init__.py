"""Every vLLM fact, once: its knobs, its metric catalogue and buckets, its /metrics reader, its log lines and its
admission answers."""
