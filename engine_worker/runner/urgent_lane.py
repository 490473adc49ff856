"""An urgent lane beside the batch: a second generator for requests more urgent than the least
urgent request of the batch, stepped alone until their first tokens are out.

mlx-lm's generator returns a prompt's first token from the third ``next()`` after its insert
(prefill, last token, the asynchronous result), and each ``next()`` decodes its whole batch
first. In one generator an urgent prompt therefore waits three full batch steps for its first
token, however it is ordered. :class:`LanedRunner` keeps such prompts in a generator of their
own. While one of them waits for its first token, a step runs that generator alone; afterwards
both generators step, the lane's rows decoding beside the batch until they finish.

A stream of urgent prompts cannot stall the batch: the lane runs alone for at most
:data:`MAX_STEPS_ALONE` steps in a row, then one step runs both.

Lane uids are the lane generator's plus :data:`LANE_UID_BASE`, so the scheduler's one uid space
holds both generators' sequences.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine_worker.common.config import SchedulerConfig
from engine_worker.runner.generator import BatchRunner, MlxBatchRunner, StepResult

LANE_UID_BASE = 1 << 40
# A short prompt's first token comes out of the third step after its insert.
MAX_STEPS_ALONE = 3


def in_lane(uid: int | None) -> bool:
    return uid is not None and uid >= LANE_UID_BASE


class LanedRunner(BatchRunner):
    """The batch's generator (``main``) and, made at the first urgent insert, the lane's."""

    def __init__(self, model: Any, config: SchedulerConfig,
                 factory: Callable[[Any, SchedulerConfig], BatchRunner] = MlxBatchRunner) -> None:
        self._new_lane = lambda: factory(model, config)
        self.main = factory(model, config)
        self.lane: BatchRunner | None = None
        self._lane_uids: set[int] = set()  # lane sequences not yet finished (offset uids)
        self._awaiting_first: set[int] = set()  # of those, the ones whose first token is not out
        self._steps_alone = 0

    @property
    def generator(self) -> Any:
        """The batch's mlx-lm ``BatchGenerator`` (the seed's ``batch_generator``)."""
        return self.main.generator

    def insert(self, tokens: list[int], **kwargs: Any) -> int:
        return self.main.insert(tokens, **kwargs)

    def insert_urgent(self, tokens: list[int], **kwargs: Any) -> int:
        uid = self._made_lane().insert(tokens, **kwargs) + LANE_UID_BASE
        self._lane_uids.add(uid)
        self._awaiting_first.add(uid)
        return uid

    def _made_lane(self) -> BatchRunner:
        """The lane, made at the first urgent insert (it holds every lane uid)."""
        if self.lane is None:
            self.lane = self._new_lane()
        return self.lane

    def step(self) -> StepResult:
        if not self._lane_uids:  # the usual step: the batch's result as it is
            self._steps_alone = 0
            return self.main.step()
        alone = bool(self._awaiting_first) and self._steps_alone < MAX_STEPS_ALONE
        self._steps_alone = self._steps_alone + 1 if alone else 0
        generated: list[Any] = []
        prompts_done: list[int] = []
        if not alone:
            result = self.main.step()
            generated.extend(result.generated)
            prompts_done.extend(result.prompts_done)
        result = self._made_lane().step()
        for response in result.generated:
            response.uid += LANE_UID_BASE
            self._awaiting_first.discard(response.uid)
            if response.finish_reason is not None:
                self._lane_uids.discard(response.uid)
        generated.extend(result.generated)
        prompts_done.extend(uid + LANE_UID_BASE for uid in result.prompts_done)
        return StepResult(generated, prompts_done)

    def remove(self, uids: list[int], return_caches: bool = False) -> dict[int, tuple[list[Any], list[int]]]:
        main, lane = self._split(uids)
        removed = self.main.remove(main, return_caches=return_caches) if main else {}
        if lane:
            self._lane_uids.difference_update(lane)
            self._awaiting_first.difference_update(lane)
            got = self._made_lane().remove([u - LANE_UID_BASE for u in lane], return_caches=return_caches)
            removed = {**removed, **{u + LANE_UID_BASE: v for u, v in got.items()}}
        return removed

    def extract_cache(self, uids: list[int]) -> dict[int, tuple[list[Any], list[int]]]:
        main, lane = self._split(uids)
        found = self.main.extract_cache(main) if main else {}
        if lane:
            got = self._made_lane().extract_cache([u - LANE_UID_BASE for u in lane])
            found = {**found, **{u + LANE_UID_BASE: v for u, v in got.items()}}
        return found

    def kv_bytes(self) -> int | None:
        main = self.main.kv_bytes()
        lane = self.lane.kv_bytes() if self.lane is not None else 0
        return None if main is None or lane is None else main + lane

    def close(self) -> None:
        try:
            self.main.close()
        finally:
            if self.lane is not None:
                self.lane.close()

    @staticmethod
    def _split(uids: list[int]) -> tuple[list[int], list[int]]:
        return [u for u in uids if not in_lane(u)], [u for u in uids if in_lane(u)]
