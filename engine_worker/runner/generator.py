"""A thin adapter around mlx-lm's ``BatchGenerator``, using its public methods only.

The scheduler talks to a :class:`BatchRunner`; :class:`MlxBatchRunner` is the real one. Tests of
scheduling policy can substitute a fake that returns scripted responses with the same fields
(``uid``, ``token``, ``finish_reason``, ``prompt_cache``, ``all_tokens``).

Thread affinity: mlx streams and the generator are bound to the thread that creates them, so the
runner must be created, stepped and closed on one thread (the engine thread).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from engine_worker.runner.mlx_core import mx

from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

from engine_worker.common.config import SchedulerConfig
from engine_worker.runner.batch_sampler import BatchSampler, RowOrder
from engine_worker.runner.float_logits import Float32Logits

logger = logging.getLogger(__name__)

# RotatingKVCache keeps the first tokens of the sequence (usually BOS and the system prompt's
# start) as attention sinks; 4 is mlx-lm's own choice in make_prompt_cache.
_KV_KEEP = 4


class StepResult(NamedTuple):
    """One generator step: the tokens it produced, and the sequences whose prompt it finished.

    A sequence whose prompt ends in step N has its first token sampled in that step, and that
    token comes out of step N+1 (mlx-lm evaluates each step's tokens asynchronously).
    """

    generated: Sequence[Any]
    prompts_done: Sequence[int]


class BatchRunner(Protocol):
    """What the scheduler needs from the token generator: every method it calls.

    :class:`MlxBatchRunner` and :class:`~engine_worker.runner.urgent_lane.LanedRunner` implement
    all of them. A runner without a capability (a scripted one in the tests) subclasses this
    Protocol and keeps the trivial default, as documented per method.
    """

    #: The mlx-lm ``BatchGenerator`` that steps the batch (the seed's ``Scheduler.batch_generator``);
    #: None for a runner without one.
    generator: Any = None

    def insert(
        self,
        tokens: list[int],
        *,
        max_tokens: int,
        cache: list[Any] | None,
        all_tokens: list[int] | None,
        sampler: Any,
        logits_processors: list[Any],
        stop_sequences: Any,
    ) -> int:
        """Queue one sequence (only the tokens not in ``cache``); returns its uid."""
        ...

    def insert_urgent(self, tokens: list[int], **kwargs: Any) -> int:
        """As :meth:`insert`, into the urgent lane (:mod:`engine_worker.runner.urgent_lane`).
        Default, for a runner without a lane: :meth:`insert`."""
        return self.insert(tokens, **kwargs)

    def step(self) -> StepResult:
        """One generator step: decode one token per decoding sequence, prefill one chunk."""
        ...

    def remove(self, uids: list[int], return_caches: bool = False) -> dict[int, tuple[list[Any], list[int]]]:
        """Take sequences out (in any stage); with ``return_caches``, ``{uid: (cache_layers, tokens)}``."""
        ...

    def extract_cache(self, uids: list[int]) -> dict[int, tuple[list[Any], list[int]]]:
        """``{uid: (cache_layers, tokens)}`` of sequences still in the batch, in any stage (they
        stay in): mid-prefill saves and prompt snapshots. Default, for a runner that keeps no KV
        caches: ``{}`` (nothing is saved)."""
        return {}

    def kv_bytes(self) -> int | None:
        """Bytes of the batch's KV buffers now (the memory budget measures the batch with them).
        Default, for a runner that cannot measure them: None (the budget then counts every row as
        long as the longest sequence)."""
        return None

    def close(self) -> None:
        """Release the generator, on the thread that stepped it."""
        ...


class MlxBatchRunner(BatchRunner):
    """Owns one ``BatchGenerator``; create it on the thread that will step it.

    Every row is inserted with the generator's one :class:`BatchSampler` (so the generator samples
    each step in one call), which gets the row's own sampler, and follows the generator's row
    order through :class:`RowOrder` (:mod:`engine_worker.runner.batch_sampler`).
    """

    def __init__(self, model: Any, config: SchedulerConfig) -> None:
        self._model = model
        self._max_kv_size = config.max_kv_size
        self._bounded_ok = True
        self._order = RowOrder()
        self.sampler = BatchSampler(self._order)
        # The generator's defaults (sampler, stop tokens, processors) are never used: every insert
        # passes per-request values, so settings cannot leak from one request to another. The model's
        # logits reach it in float32: greedy decoding then takes the model's top token (float_logits.py).
        self.generator = BatchGenerator(
            Float32Logits(model),  # type: ignore[arg-type]  # BatchGenerator only calls it and reads its attributes
            completion_batch_size=config.completion_batch_size,
            prefill_batch_size=config.prefill_batch_size,
            prefill_step_size=config.effective_prefill_step_size,
            max_kv_size=config.max_kv_size or None,
            stream=mx.default_stream(mx.default_device()),
        )

    def _bounded_cache(self) -> list[Any] | None:
        """Per-layer rotating caches of ``max_kv_size`` tokens.

        BatchGenerator's ``max_kv_size`` only reaches models without ``make_cache`` (llama has one),
        so the bound is made real by inserting rotating caches ourselves. Models whose layers are
        not plain attention caches (hybrid/recurrent) cannot be bounded this way.
        """
        if not self._bounded_ok:
            return None
        if not hasattr(self._model, "make_cache"):
            return make_prompt_cache(self._model, max_kv_size=self._max_kv_size)
        layers = self._model.make_cache()
        if all(type(c) is KVCache for c in layers):
            return [RotatingKVCache(max_size=self._max_kv_size, keep=_KV_KEEP) for _ in layers]
        self._bounded_ok = False
        logger.warning("max_kv_size=%s ignored: this model's caches cannot be bounded", self._max_kv_size)
        return None

    def insert(
        self,
        tokens: list[int],
        *,
        max_tokens: int,
        cache: list[Any] | None,
        all_tokens: list[int] | None,
        sampler: Any,
        logits_processors: list[Any],
        stop_sequences: Any,
    ) -> int:
        if cache is None and self._max_kv_size > 0:
            cache = self._bounded_cache()
        (uid,) = self.generator.insert(
            [tokens],
            max_tokens=[max_tokens],
            caches=[cache] if cache is not None else None,
            all_tokens=[all_tokens] if all_tokens is not None else None,
            samplers=[self.sampler],
            logits_processors=[logits_processors],
            stop_sequences=[stop_sequences],
        )
        self.sampler.add(uid, sampler)
        self._order.inserted(uid, len(tokens))
        return uid

    def step(self) -> StepResult:
        """One generator step: decode one token per decoding sequence, prefill one chunk."""
        prompts, generated = self.generator.next()
        self._order.stepped(generated, prompts)
        self.sampler.drop([r.uid for r in generated if r.finish_reason is not None])
        return StepResult(generated, [r.uid for r in prompts if r.end_of_prompt])

    def remove(self, uids: list[int], return_caches: bool = False) -> dict[int, tuple[list[Any], list[int]]]:
        removed = self.generator.remove(uids, return_prompt_caches=return_caches)
        self._order.removed(uids)
        self.sampler.drop(uids)
        return removed

    def extract_cache(self, uids: list[int]) -> dict[int, tuple[list[Any], list[int]]]:
        """The caches of sequences still in the batch (queued, prefilling or decoding); the
        sequences stay in. A prefilling one's cache ``offset`` is the tokens processed so far."""
        return self.generator.extract_cache(uids)

    def kv_bytes(self) -> int:
        """Bytes of the generator's KV buffers now (queued, prefilling and decoding sequences)."""
        return int(self.generator.prompt_cache_nbytes)

    def close(self) -> None:
        self.generator.close()


def release_thread_streams() -> None:
    """Finish this thread's mlx work and destroy the streams it created (its generators' and
    mlx-lm's thread-local ones). Call it last on a thread that ran mlx work, before the thread
    ends: mlx 0.32 aborts the process at exit (``terminate called without an active exception``)
    when a finished non-main thread's streams are left for interpreter shutdown."""
    try:
        mx.synchronize()
    finally:  # a failed device still gets its streams destroyed
        mx.clear_streams()
