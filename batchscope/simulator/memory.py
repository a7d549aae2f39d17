"""Start-up memory accounting: how many KV blocks fit, computed the way vLLM V1 sizes its cache.

vLLM loads the weights, profiles one dummy forward pass of max_num_batched_tokens tokens, and gives whatever
is left of ``gpu_memory_utilization x total memory`` to the KV cache. The pool does not depend on
max_model_len; max_model_len only has to fit in it once.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchscope.simulator.profile import KV_LOG_NAME, Profile

GIB = 1024**3


@dataclass(frozen=True)
class KvCachePlan:
    """The memory split vLLM logs at start-up, and the resulting block pool."""

    requested_bytes: int
    weight_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    available_kv_bytes: int
    block_size: int
    num_gpu_blocks: int
    max_model_len: int
    device_name: str  # as vLLM names the device in its capacity line: GPU, CPU
    profiled_blocks: int | None = None  # the blocks memory allows, when --num-gpu-blocks-override replaced them

    @property
    def kv_cache_tokens(self) -> int:
        """Tokens the KV cache holds at once (vLLM's 'GPU KV cache size', 'CPU KV cache size' on the CPU)."""
        return self.num_gpu_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        """How many max_model_len requests fit at once (vLLM's 'Maximum concurrency')."""
        return self.kv_cache_tokens / self.max_model_len

    def log_lines(self) -> list[str]:
        """vLLM's start-up lines about the KV cache, with 0.32's wording: size and concurrency on one line."""
        overridden = [] if self.profiled_blocks is None else [
            f"Overriding num_gpu_blocks={self.profiled_blocks} with num_gpu_blocks_override={self.num_gpu_blocks}"]
        return [
            f"Model loading took {self.weight_bytes / GIB:.2f} GiB",
            f"Available KV cache memory: {self.available_kv_bytes / GIB:.2f} GiB",
            *overridden,
            f"{self.device_name} KV cache size: {self.kv_cache_tokens:,} tokens, Maximum concurrency for "
            f"{self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x",
        ]


def plan_kv_cache(
    profile: Profile, gpu_memory_utilization: float, max_num_batched_tokens: int, block_size: int, max_model_len: int,
    num_gpu_blocks_override: int | None = None,
) -> KvCachePlan:
    """Size the KV cache; raise ValueError with vLLM's message when it cannot hold one max_model_len request.

    ``num_gpu_blocks_override`` replaces the blocks memory allows, as vLLM's flag does, before that check."""
    requested = int(profile.gpu_memory_bytes * gpu_memory_utilization)
    activation = profile.activation_peak_bytes(max_num_batched_tokens)
    available = requested - profile.weight_bytes - activation - profile.non_torch_bytes
    if available <= 0:
        raise ValueError(
            "No available memory for the cache blocks. "
            "Try increasing `gpu_memory_utilization` when initializing the engine."
        )
    block_bytes = block_size * profile.kv_bytes_per_token
    profiled_blocks = available // block_bytes
    num_blocks = profiled_blocks if num_gpu_blocks_override is None else num_gpu_blocks_override
    needed_bytes = -(-max_model_len // block_size) * block_bytes
    # one block is the engine's reserved null block (as in vLLM), so a request can use num_blocks - 1
    if needed_bytes > (num_blocks - 1) * block_bytes:
        raise ValueError(
            f"To serve at least one request with the models's max seq len ({max_model_len}), "
            f"({needed_bytes / GIB:.2f} GiB KV cache is needed, which is larger than the available KV cache "
            f"memory ({available / GIB:.2f} GiB). Based on the available memory, the estimated maximum model "
            f"length is {max(num_blocks - 1, 0) * block_size}. Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len` when initializing the engine."
        )
    return KvCachePlan(
        requested_bytes=requested,
        weight_bytes=profile.weight_bytes,
        activation_bytes=activation,
        non_torch_bytes=profile.non_torch_bytes,
        available_kv_bytes=available,
        block_size=block_size,
        num_gpu_blocks=int(num_blocks),
        max_model_len=max_model_len,
        device_name=KV_LOG_NAME[profile.device],
        profiled_blocks=None if num_gpu_blocks_override is None else int(profiled_blocks),
    )
