"""Request types of the seed (vllm-mlx ``request.py``), with the same names, arguments and defaults.

See ``shared/notes/request-api.md``. Additions over the seed are keyword-only and defaulted, so code
written against vllm-mlx constructs these unchanged:

* ``SamplingParams.seed`` (per-request reproducible sampling) and ``top_k``/``min_p`` are honoured
  per request; ``ignore_eos`` makes a request run to ``max_tokens`` (benchmarks).
* ``RequestStatus.FINISHED_ERROR``: a request that failed alone (``finish_reason="error"``).
* ``RequestOutput.cached_tokens`` and ``error``; ``usage`` reports ``cached_tokens``.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class RequestStatus(enum.IntEnum):
    """Life cycle of a request. Everything after ``PREEMPTED`` is a finished state."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finish_reason(status: RequestStatus) -> str | None:
        return _FINISH_REASONS.get(status)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass
class SamplingParams:
    """Per-request sampling settings. Every field applies to its own request only."""

    max_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 0.9
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    logits_processors: list[Callable[..., Any]] | None = None
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop_token_ids is None:
            self.stop_token_ids = []

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Request:
    """One generation request as the scheduler tracks it."""

    request_id: str
    prompt: str | list[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    arrival_time: float = field(default_factory=time.time)
    priority: int = 0  # lower is more urgent; ties are broken by arrival
    # Set by the scheduler.
    prompt_token_ids: list[int] | None = None
    num_prompt_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    batch_uid: int | None = None
    prompt_cache: Any = None
    cached_tokens: int = 0
    remaining_tokens: list[int] | None = None
    prefix_boundary: int = 0
    block_table: Any = None
    shared_prefix_blocks: int = 0
    finish_reason: str | None = None
    first_token_time: float | None = None
    cache_hit_type: str | None = None
    error: str | None = None
    # Multimodal inputs of the seed. This service serves text models only; the scheduler rejects
    # a request that carries any of these instead of silently ignoring them.
    images: list[Any] | None = None
    videos: list[Any] | None = None

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def max_tokens(self) -> int:
        return self.sampling_params.max_tokens

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finish_reason(self) -> str | None:
        return self.finish_reason or RequestStatus.get_finish_reason(self.status)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)

    def set_finished(self, status: RequestStatus, reason: str | None = None) -> None:
        self.status = status
        self.finish_reason = reason or RequestStatus.get_finish_reason(status)

    def __lt__(self, other: Request) -> bool:
        return (self.priority, self.arrival_time) < (other.priority, other.arrival_time)


@dataclass
class RequestOutput:
    """What one step produced for one request. Lists are snapshots, never live references."""

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""
    output_token_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    finished: bool = False
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    mtp_drafts: int = 0
    mtp_accepted: int = 0
    cached_tokens: int = 0
    error: str | None = None
    # True when the request ended because the engine itself failed (not because of anything in
    # this request): a host should hand it to another engine rather than report it as failed.
    engine_failed: bool = False

    @property
    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "cached_tokens": self.cached_tokens,
        }
