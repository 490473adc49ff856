"""The seed's ``scheduler`` module (``from vllm_mlx.scheduler import ...``): the scheduler lives in
:mod:`engine_worker.sched.scheduler`, its configuration in :mod:`engine_worker.common.config`."""

from __future__ import annotations

from engine_worker.common.config import SchedulerConfig, SchedulingPolicy
from engine_worker.sched.scheduler import Scheduler, SchedulerOutput

__all__ = ["Scheduler", "SchedulerConfig", "SchedulerOutput", "SchedulingPolicy"]
