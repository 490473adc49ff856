"""The seed's ``engine_core`` module: :class:`EngineCore` and its ``async with`` wrapper
:class:`AsyncEngineCore`, with the configuration they take.

The classes live in :mod:`engine_worker.engine.core` and :mod:`engine_worker.engine.async_engine`; this
module only gathers them under the seed's import path (``from vllm_mlx.engine_core import ...``).
"""

from __future__ import annotations

from engine_worker.common.config import EngineConfig, SchedulerConfig, SchedulingPolicy
from engine_worker.engine.async_engine import AsyncEngineCore
from engine_worker.engine.core import EngineCore
from engine_worker.engine.ownership import ModelInUse

__all__ = ["AsyncEngineCore", "EngineConfig", "EngineCore", "ModelInUse", "SchedulerConfig", "SchedulingPolicy"]
