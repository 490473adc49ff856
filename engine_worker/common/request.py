"""Request types of the seed (vllm-mlx ``request.py``), with the same names, arguments and defaults.

Additions over the seed are keyword-only and defaulted, so code written against vllm-mlx
constructs these unchanged:

* ``SamplingParams.seed`` (per-request reproducible sampling) and ``top_k``/``min_p`` are honoured
  per request; ``ignore_eos`` makes a request run to ``max_tokens`` (benchmarks).
* ``RequestStatus.FINISHED_ERROR``: a request that failed alone (``finish_reason="error"``).
* ``RequestOutput.cached_tokens`` and ``error``; ``usage`` reports ``cached_tokens``.

The scheduler builds one output per request per step, so an output's ``output_token_ids`` and
``output_text`` (everything generated so far) are snapshots taken lazily (:func:`step_output`):
copying them on every step costs O(n) per token, O(n²) per request.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Constraint", "OutputText", "Request", "RequestOutput", "RequestStatus", "SamplingParams", "replace_new",
           "step_output"]


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


@dataclass(frozen=True)
class Constraint:
    """What a request's output must match (structured output): ``kind`` ``"json_schema"`` with a
    JSON schema as JSON text, or ``"lark"`` with a Lark grammar in llguidance's dialect (which may
    embed schemas as ``%json {...}``). The runner compiles it (:mod:`engine_worker.runner.grammar`)."""

    kind: str
    text: str


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
    # OpenAI's frequency penalty and logit bias (token id -> added to its logit), as mlx-lm applies
    # them: the penalties count the last 20 tokens of the sequence, as its server does.
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    # Log probabilities of the generated tokens: None for none, else how many of the most likely
    # alternatives each token comes with (0: the chosen token's own only). See logprobs.py.
    logprobs: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    logits_processors: list[Callable[..., Any]] | None = None
    seed: int | None = None
    ignore_eos: bool = False
    # Structured output: every token is sampled from those the constraint allows.
    constraint: Constraint | None = None

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop_token_ids is None:
            self.stop_token_ids = []


class OutputText:
    """A request's generated text as append-only pieces, joined only when read.

    A reader of the first ``n`` pieces gets the same string whatever was appended since, which is
    what lets an output snapshot the text as ``(this, n)`` in O(1).
    """

    __slots__ = ("_parts", "_joined")

    def __init__(self, text: str = "") -> None:
        self._parts: list[str] = [text] if text else []
        # (pieces joined, their join) in one reference: a reader on another thread (an output
        # materialized on the asyncio thread) never sees a count from one join and text from another.
        self._joined: tuple[int, str] = (len(self._parts), text)

    def __len__(self) -> int:
        """The number of pieces (not characters)."""
        return len(self._parts)

    def append(self, piece: str) -> None:
        self._parts.append(piece)

    def join(self, n: int | None = None) -> str:
        """The first ``n`` pieces (all by default) as one string; the longest join is cached, so
        reading after every append costs only the new pieces plus one string copy."""
        parts = self._parts
        if n is None:
            n = len(parts)
        done, text = self._joined
        if n == done:
            return text
        if n < done:  # an old snapshot read late
            return "".join(parts[:n])
        text += "".join(parts[done:n])
        self._joined = (n, text)
        return text

    def __reduce__(self) -> tuple[Any, ...]:
        return OutputText, (self.join(),)


class _ComputedTokensField:
    """``Request.num_computed_tokens``: as in the seed, the value given at construction (0 by
    default) plus one for every output token appended since, however it is appended (the
    scheduler's per-token path appends to ``output_token_ids`` directly)."""

    def __get__(self, request: Request | None, owner: type | None = None) -> int:
        if request is None:
            return 0  # the dataclass default
        return request._computed_base + len(request.output_token_ids)

    def __set__(self, request: Request, value: int) -> None:
        request._computed_base = value - len(getattr(request, "output_token_ids", ()))


class _OutputTextField:
    """``Request.output_text``: reads as a str; assigning a str starts a new :class:`OutputText`
    (outputs that snapshot the old one keep it). A descriptor-typed dataclass field, so the
    constructor argument, ``repr``, ``==`` and ``asdict`` see a plain str."""

    def __get__(self, request: Request | None, owner: type | None = None) -> str:
        if request is None:
            return ""  # the dataclass default
        return request._text.join()

    def __set__(self, request: Request, value: str) -> None:
        request._text = OutputText(value)


class _DescriptorStorage:
    """What the two descriptors above keep on a :class:`Request`: plain attributes, not dataclass
    fields (a base that is not a dataclass adds none)."""

    _computed_base: int
    _text: OutputText


@dataclass(eq=False)
class Request(_DescriptorStorage):
    """One generation request as the scheduler tracks it.

    Equal and hashed by ``request_id`` alone, as in the seed, so requests work as set members
    and dict keys whatever their state. ``output_token_ids`` only grows while the request runs
    (outputs keep ``(list, length)`` snapshots of it); replace it rather than mutating it in place.
    """

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
    # After output_token_ids, which it counts from.
    num_computed_tokens: _ComputedTokensField = _ComputedTokensField()  # reads and takes an int
    output_text: _OutputTextField = _OutputTextField()  # reads and takes a str
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
    # Multimodal inputs of the seed. This service serves text models only; the scheduler refuses
    # a request that carries any of these (UnsupportedInput) instead of silently ignoring them.
    images: list[Any] | None = None
    videos: list[Any] | None = None
    pixel_values: Any = None
    is_multimodal: bool = False

    @property
    def prompt_ids(self) -> list[int]:
        """``prompt_token_ids``, which the scheduler sets when the request is added (the cache and
        batch code see only requests added)."""
        ids = self.prompt_token_ids
        if ids is None:
            raise ValueError(f"request {self.request_id} has no prompt token ids yet")
        return ids

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

    def append_output_text(self, piece: str) -> None:
        """Add text to ``output_text`` in O(len(piece)) (``+=`` would copy all of it)."""
        self._text._parts.append(piece)  # OutputText.append inlined: this runs for every token

    def set_finished(self, status: RequestStatus, reason: str | None = None) -> None:
        self.status = status
        self.finish_reason = reason or RequestStatus.get_finish_reason(status)

    def multimodal_input(self) -> str | None:
        """What multimodal input the request carries ("images", "videos", "pixel_values" or
        "is_multimodal"), or None for a text-only request."""
        if self.images:
            return "images"
        if self.videos:
            return "videos"
        if self.pixel_values is not None:
            return "pixel_values"
        return "is_multimodal" if self.is_multimodal else None

    def __lt__(self, other: Request) -> bool:
        return (self.priority, self.arrival_time) < (other.priority, other.arrival_time)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        return self.request_id == other.request_id

    def __hash__(self) -> int:
        return hash(self.request_id)


_LAZY = "_lazy_snapshot"  # (token list, its length, OutputText, its piece count) of a step_output


@dataclass
class RequestOutput:
    """What one step produced for one request. Lists are snapshots, never live references.

    An output from :func:`step_output` builds ``output_token_ids`` and ``output_text`` on their
    first read (then caches them); equality, ``repr``, pickling, copying and ``asdict`` see the
    same values as for an output constructed with them.
    """

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""
    output_token_ids: list[int] = field(default_factory=list)
    # A factory, not ``= ""``: a plain default would stay a class attribute and hide
    # __getattr__'s lazy snapshot.
    output_text: str = field(default_factory=str)
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
    # With SamplingParams.logprobs: one TokenLogprob per token in new_token_ids; None otherwise.
    new_logprobs: list[Any] | None = None

    @property
    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "cached_tokens": self.cached_tokens,
        }

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails, i.e. for a step_output's snapshot fields before
        # their first read. setdefault: two threads reading at once end up with the same object.
        d = self.__dict__
        lazy = d.get(_LAZY)
        if lazy is not None:
            if name == "output_token_ids":
                return d.setdefault(name, lazy[0][: lazy[1]])
            if name == "output_text":
                return d.setdefault(name, lazy[2].join(lazy[3]))
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self) -> dict[str, Any]:
        # Pickle and copy carry the values, not the request's whole live list and text.
        d = self.__dict__
        if _LAZY not in d:
            return d
        state = {k: v for k, v in d.items() if k != _LAZY}
        state["output_token_ids"] = self.output_token_ids
        state["output_text"] = self.output_text
        state["new_logprobs"] = self.new_logprobs  # the class default unless the scheduler set it
        return state


def step_output(request: Request, new_token_ids: list[int], new_text: str, finish_reason: str | None) -> RequestOutput:
    """What this step produced for ``request``, in O(1) (the scheduler's per-token path).

    Equal to ``RequestOutput(request.request_id, new_token_ids, new_text,
    list(request.output_token_ids), request.output_text, finish_reason is not None, finish_reason,
    request.num_prompt_tokens, request.num_output_tokens, cached_tokens=request.cached_tokens)``,
    but the two running totals are snapshots taken as (append-only source, current length) and
    copied only if someone reads them.
    """
    tokens = request.output_token_ids
    text = request._text
    n = len(tokens)
    out = object.__new__(RequestOutput)
    # Always this order (the dataclass's, less the two snapshots): CPython then shares one key
    # table among these instances, which makes building one about a third cheaper.
    out.request_id = request.request_id
    out.new_token_ids = new_token_ids
    out.new_text = new_text
    out.finished = finish_reason is not None
    out.finish_reason = finish_reason
    out.prompt_tokens = request.num_prompt_tokens
    out.completion_tokens = n
    out.mtp_drafts = 0
    out.mtp_accepted = 0
    out.cached_tokens = request.cached_tokens
    out.error = None
    out.engine_failed = False
    # new_logprobs: the class's default (None) unless the scheduler sets it.
    setattr(out, _LAZY, (tokens, n, text, len(text._parts)))
    return out


def replace_new(out: RequestOutput, new_token_ids: list[int], new_text: str) -> RequestOutput:
    """``dataclasses.replace(out, new_token_ids=..., new_text=...)`` that keeps a lazy snapshot
    lazy (``replace`` reads every field, which would copy the totals)."""
    merged = object.__new__(type(out))
    merged.__dict__.update(out.__dict__)
    merged.new_token_ids = new_token_ids
    merged.new_text = new_text
    return merged
