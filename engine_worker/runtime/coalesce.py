"""Fold the engine's per-step outputs into wire messages: one chunk per job per batch.

The engine reports every running request after each step. A sink round trip per token would
dominate a small model's step time, so the I/O thread folds everything that arrived since its
last write (one step, or several when it lags) into one :class:`StepBatch`: at most one
:class:`OutputChunk` per job, numbered on from the job's first seq (1 for a first run), plus
first-token events and finals.

The streamed text is the single source of the stored text: a final's ``text`` is the join of the
chunks this coalescer emitted, so a client that received every chunk has exactly the stored text.
Not thread-safe: only the I/O thread uses it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from engine_worker.common.request import RequestOutput
from engine_worker.protocol import FinalResult, FirstToken, OutputChunk, StepBatch

logger = logging.getLogger(__name__)


@dataclass
class JobProgress:
    """What one job has streamed so far in this worker."""

    job_id: str
    prompt_tokens: int
    seq: int = 0  # of the last chunk emitted
    first_seq: int = 1
    parts: list[str] = field(default_factory=list)
    completion_tokens: int = 0
    cached_tokens: int = 0
    first_token_at: float | None = None
    logprobs: list[tuple] | None = None  # of every token so far, for a job that asks
    logprobs_sent: int = 0  # how many of them chunks carried

    @property
    def text(self) -> str:
        return "".join(self.parts)


class ChunkCoalescer:
    """Tracks the jobs of one worker and turns engine outputs into :class:`StepBatch` es."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._jobs: dict[str, JobProgress] = {}

    def track(self, job_id: str, prompt_tokens: int, first_seq: int = 1) -> None:
        """Start following a job whose first chunk will have seq ``first_seq``."""
        self._jobs[job_id] = JobProgress(job_id=job_id, prompt_tokens=prompt_tokens, seq=first_seq - 1,
                                         first_seq=first_seq)

    def awaits_first_text(self, job_id: str) -> bool:
        """Whether the job has had no chunk yet: its client has seen nothing. A first token can
        bring no text (the detokenizer holds a partial character, or the leading space it trims),
        and the text then comes with a later token."""
        job = self._jobs.get(job_id)
        return job is not None and job.seq < job.first_seq

    def job_ids(self) -> list[str]:
        return list(self._jobs)

    def forget(self, job_id: str) -> None:
        """Drop a job without a final (it is handed back to the queue)."""
        self._jobs.pop(job_id, None)

    def fold(self, steps: Iterable[list[RequestOutput]], finals: Iterable[FinalResult] = ()) -> StepBatch:
        """Coalesce the outputs of one or more steps, in order. Outputs of jobs this coalescer no
        longer tracks (finished, cancelled, handed back) are dropped."""
        pending: dict[str, list[str]] = {}
        chunks: list[OutputChunk] = []
        first_tokens: list[FirstToken] = []
        done: list[FinalResult] = list(finals)
        for outputs in steps:
            for out in outputs:
                job = self._jobs.get(out.request_id)
                if job is None:
                    continue
                if out.new_text:
                    pending.setdefault(job.job_id, []).append(out.new_text)
                if out.new_logprobs is not None:
                    if job.logprobs is None:
                        job.logprobs = []
                    # Plain tuples, not TokenLogprob: the worker's parent process unpickles the
                    # batch and never imports mlx. A token without text yet goes with the next
                    # chunk (see _emit).
                    job.logprobs.extend((e.token_id, e.logprob, e.top) for e in out.new_logprobs)
                if out.completion_tokens or out.new_token_ids:
                    job.completion_tokens = max(job.completion_tokens, out.completion_tokens)
                    if job.first_token_at is None:
                        job.first_token_at = self._clock()
                        first_tokens.append(FirstToken(job_id=job.job_id, at=job.first_token_at))
                job.cached_tokens = out.cached_tokens or job.cached_tokens
                job.prompt_tokens = out.prompt_tokens or job.prompt_tokens
                if out.finished:
                    # The last chunk goes out before (and in the same batch as) the final; with no
                    # text left, still one (empty) when it has log probabilities to carry (a
                    # stream's entries are then as many as its tokens).
                    if job.job_id in pending:
                        chunks.append(self._emit(job, "".join(pending.pop(job.job_id))))
                    elif job.logprobs is not None and job.logprobs_sent < len(job.logprobs):
                        chunks.append(self._emit(job, ""))
                    done.append(self._finish(job, out.finish_reason or "stop", out.error, out.completion_tokens))
        for job_id, texts in pending.items():
            chunks.append(self._emit(self._jobs[job_id], "".join(texts)))
        return StepBatch(chunks=tuple(chunks), finals=tuple(done), first_tokens=tuple(first_tokens))

    def cancel(self, job_id: str) -> FinalResult | None:
        """End a job as aborted with the text streamed so far; None if it is not tracked."""
        job = self._jobs.get(job_id)
        if job is None:
            return None
        return self._finish(job, "abort", None, job.completion_tokens)

    def _emit(self, job: JobProgress, text: str) -> OutputChunk:
        job.seq += 1
        job.parts.append(text)
        logprobs = None
        if job.logprobs is not None:
            logprobs, job.logprobs_sent = tuple(job.logprobs[job.logprobs_sent:]), len(job.logprobs)
        return OutputChunk(job_id=job.job_id, seq=job.seq, text=text, completion_tokens=job.completion_tokens,
                           logprobs=logprobs)

    def _finish(
        self, job: JobProgress, reason: str, error: str | None, completion_tokens: int
    ) -> FinalResult:
        self._jobs.pop(job.job_id, None)
        return FinalResult(
            job_id=job.job_id,
            text=job.text,
            finish_reason=reason,
            prompt_tokens=job.prompt_tokens,
            completion_tokens=max(completion_tokens, job.completion_tokens),
            cached_tokens=job.cached_tokens,
            error=error,
            first_token_at=job.first_token_at,
            finished_at=self._clock(),
            last_seq=job.seq,
            logprobs=None if job.logprobs is None else tuple(job.logprobs),
        )
