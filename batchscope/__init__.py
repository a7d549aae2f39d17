"""batchscope: observe and tune vLLM's queueing and batching (max_num_seqs, max_num_batched_tokens, KV cache)."""

__version__ = "0.1.0"
