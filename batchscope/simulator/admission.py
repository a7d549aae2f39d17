"""vLLM 0.32's admission check (AsyncLLM.check_admission) over the API server's own counts; pure, no clock.

The server and the virtual driver both hold one ``AdmissionControl``: ``check`` is the pre-flight check (before
the input path), ``admit`` the check made and the request counted in one go (as vLLM's ``_add_request`` does),
``prefilled`` and ``leave`` move a request out of the counts as the API server sees its first output and its end.
The counting and where each check runs: docs/simulator.md, "Admission control".
"""

from __future__ import annotations

from collections.abc import Hashable

from batchscope.vllm.catalogue import ADMISSION_REJECTION_REASONS

BY_REQUESTS, BY_TOKENS = ADMISSION_REJECTION_REASONS  # "max_num_queued_reqs", "max_num_queued_tokens"


class AdmissionControl:
    """The queue limits (None: no limit) and what they are checked against: the requests the API server holds
    (added, not yet finished or aborted) and the prompt tokens of those with no output yet."""

    def __init__(self, max_num_queued_reqs: int | None = None, max_num_queued_tokens: int | None = None) -> None:
        self.max_num_queued_reqs = max_num_queued_reqs
        self.max_num_queued_tokens = max_num_queued_tokens
        self._held: dict[Hashable, int] = {}  # request -> its prompt tokens while prefilling, then 0
        self.queued_tokens = 0  # vLLM's get_num_queued_tokens: whole prompts until their first output
        self.rejections = dict.fromkeys(ADMISSION_REJECTION_REASONS, 0)  # vllm:admission_rejections_total

    @property
    def requests(self) -> int:
        """vLLM's get_num_unfinished_requests: one per request (n slots for n choices)."""
        return len(self._held)

    def check(self, n: int = 1) -> str | None:
        """The reason a request of ``n`` choices is refused now, counted in ``rejections``; None: it passes.

        The request limit first (``current + n > N``), then the token limit (``current >= T``: a request with
        any prompt passes while the backlog is below T, whatever its own length).
        """
        if self.max_num_queued_reqs is not None and self.requests + n > self.max_num_queued_reqs:
            reason = BY_REQUESTS
        elif self.max_num_queued_tokens is not None and self.queued_tokens >= self.max_num_queued_tokens:
            reason = BY_TOKENS
        else:
            return None
        self.rejections[reason] += 1
        return reason

    def admit(self, request: Hashable, prompt_tokens: int) -> str | None:
        """Check, and count ``request`` in when it passes: with no await between the two, as in vLLM."""
        reason = self.check()
        if reason is None:
            self._held[request] = prompt_tokens
            self.queued_tokens += prompt_tokens
        return reason

    def prefilled(self, request: Hashable) -> None:
        """Its first output reached the API server: its prompt leaves the backlog (a no-op after the first)."""
        if self._held.get(request):
            self.queued_tokens -= self._held[request]
            self._held[request] = 0

    def leave(self, request: Hashable) -> None:
        """It finished or was aborted (a no-op for a request not held)."""
        self.queued_tokens -= self._held.pop(request, 0)
