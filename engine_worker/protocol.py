"""Typed messages between the web side, the engine worker and its engine: the one vocabulary.

Plain frozen dataclasses of ids, numbers and strings: never ORM objects.

* **Jobs and their outputs.** The web side builds a :class:`JobSpec` (prompt already tokenized, so
  the context check happens before dispatch); the worker emits :class:`OutputChunk` per engine
  step and one :class:`FinalResult`, folded into :class:`StepBatch` es, and publishes
  :class:`WorkerHeartbeat` periodically. ``to_dict``/``from_dict`` give the JSON wire form.
* **Commands**, the same on every queue that carries them: the worker's connection to its engine
  process, that process's I/O queue and the engine's own command queue. :class:`Submit` starts a
  job, :class:`Cancel` stops one with a final (``finish_reason="abort"``), :class:`HandBack` stops
  some without one (they go back to the broker's queue); :class:`Evict` drops a prefix-cache entry
  and :class:`Stop` ends the engine process.
* **The engine process's answers** besides its batches and heartbeats: :class:`Refused` (a job the
  engine would not start, classified there: the job's fault or the engine's) and :class:`Stopped`.

This module imports nothing heavy (no mlx), so web processes can use it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
J = TypeVar("J")

FINISH_REASONS = ("stop", "length", "abort", "error")


def to_dict(message: Any) -> dict[str, Any]:
    return dataclasses.asdict(message)


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build ``cls`` from a wire dict, ignoring unknown keys (newer senders) and turning lists
    back into the tuples the frozen dataclasses declare."""
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names}
    return cls(**kwargs)


@dataclass(frozen=True)
class JobSpec:
    """One job for the engine: what to generate and how to sample it."""

    job_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    priority: int = 0
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # (token id, bias) pairs: a JSON object would turn the ids into strings on the wire.
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None  # SamplingParams.logprobs
    # Structured output (SamplingParams.constraint): kind "json_schema" (text: the schema as JSON)
    # or "lark" (text: an llguidance Lark grammar); "" for free text. The engine compiles it.
    constraint_kind: str = ""
    constraint: str = ""
    # The seq of this run's first chunk. A job that runs again after its worker died continues
    # the seqs of its earlier attempt, so a seq never names two different chunks.
    first_seq: int = 1


@dataclass(frozen=True)
class OutputChunk:
    """The text one job produced in one engine step (tokens of a step are coalesced)."""

    job_id: str
    seq: int
    text: str
    completion_tokens: int
    # With logprobs asked for: FinalResult.logprobs's entries of this chunk's tokens (a token whose
    # text the detokenizer still held comes with the chunk that has it); None otherwise.
    logprobs: tuple[tuple[int, float, tuple[tuple[int, float], ...]], ...] | None = None


@dataclass(frozen=True)
class FinalResult:
    """How a job ended, with the engine's own token counts."""

    job_id: str
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    error: str | None = None
    first_token_at: float | None = None  # unix time
    finished_at: float | None = None
    last_seq: int = 0
    # With logprobs asked for: one (token id, log probability, ((token id, log probability), ...))
    # per completion token, in order; None otherwise.
    logprobs: tuple[tuple[int, float, tuple[tuple[int, float], ...]], ...] | None = None


@dataclass(frozen=True)
class MemoryStats:
    """A worker's device memory: mlx's allocator (``active``, its ``peak`` since start, the freed
    buffers it keeps in ``cache``), the worker's budget and its parts. The parts default to 0 so a
    heartbeat from an older worker still reads."""

    device: str  # "cpu", "cuda" or "metal"
    active_bytes: int
    peak_bytes: int
    cache_bytes: int
    budget_bytes: int = 0
    weights_bytes: int = 0
    kv_bytes: int = 0
    prefix_cache_bytes: int = 0
    limit_bytes: int = 0  # mlx's memory limit: the allocator gives its cache back before passing it


@dataclass(frozen=True)
class WorkerHeartbeat:
    worker_id: str
    model: str
    device: str
    memory: MemoryStats
    num_running: int
    num_waiting: int
    sent_at: float
    requests: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    cache: dict[str, Any] | None = None
    context_length: int | None = None
    # The prefix cache's most recently used entries (EngineCore.list_cache_entries() rows), at most
    # runtime.heartbeat.HEARTBEAT_CACHE_ENTRIES of them; ``cache["entries"]`` counts them all.
    cache_entries: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    # Tokens the engine has generated since it started (a counter: its rate is the engine's speed).
    generated_tokens: int = 0
    # Requests its batch runs at once (the scheduler's ``max_running``); 0: not reported.
    capacity: int = 0


@dataclass(frozen=True)
class FirstToken:
    """A job produced its first token (for TTFT); emitted once per job run."""

    job_id: str
    at: float  # unix time


@dataclass(frozen=True)
class StepBatch:
    """What the worker hands to its output sink in one go: the coalesced chunks of one or more
    engine steps (at most one chunk per job), first-token events and finished jobs.

    A sink writes it with one Redis pipeline; when the I/O thread lags behind the engine, several
    steps fold into one batch instead of queueing up."""

    chunks: tuple[OutputChunk, ...] = ()
    finals: tuple[FinalResult, ...] = ()
    first_tokens: tuple[FirstToken, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.chunks or self.finals or self.first_tokens)


# ---- commands ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Submit(Generic[J]):
    """Start a job inside the engine process: its :class:`JobSpec` on the I/O thread's queue, the
    engine's ``Request`` (whose id is the job id) on the engine's own command queue. (Across the
    pipe, jobs travel in an :class:`Admit`.)"""

    job: J


@dataclass(frozen=True)
class Admit:
    """Start the jobs of one claim (one or many) in the engine process: one message across the
    pipe, and one hand-over to the engine, whose next step admits them together where its budget
    allows."""

    jobs: tuple[JobSpec, ...]


@dataclass(frozen=True)
class Cancel:
    """Stop a job: it ends with ``finish_reason="abort"`` and its text so far."""

    job_id: str


@dataclass(frozen=True)
class HandBack:
    """Stop jobs without a final: they go back to the broker's queue for another worker, and
    nothing more of theirs is written."""

    job_ids: tuple[str, ...]


@dataclass(frozen=True)
class Evict:
    """Drop one prefix-cache entry, by its ``key_hash``; the engine process's next heartbeat, sent
    at once, no longer lists it."""

    key: str


@dataclass(frozen=True)
class Stop:
    """End the engine process once every output is sent."""


# ---- the engine process's answers ---------------------------------------------------------------

@dataclass(frozen=True)
class Refused:
    """The engine would not start a job: ``job_fault`` when the job itself cannot run anywhere (an
    invalid request), else the engine's trouble (another worker may run it). The engine side
    classifies; the worker acts on it."""

    job_id: str
    error: str
    job_fault: bool


@dataclass(frozen=True)
class Stopped:
    """The engine process's last message: its engine stopped and every output was sent."""
