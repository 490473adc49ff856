"""Which engine owns a model: two engines stepping one model would corrupt each other's work."""

from __future__ import annotations

import logging
import weakref
from typing import Any

from engine_worker.common.errors import EngineError

logger = logging.getLogger(__name__)

_owners: dict[int, weakref.ref[Any]] = {}


class ModelInUse(EngineError, RuntimeError):
    """Another open engine owns this model and ``force_model_ownership`` is False."""


def acquire_model(model: Any, engine: Any, force: bool) -> None:
    """Record ``engine`` as the owner of ``model``. With ``force`` (the seed's default) a previous
    open owner is taken over with a warning; without it, :class:`ModelInUse` is raised."""
    ref = _owners.get(id(model))
    owner = ref() if ref else None
    if owner is not None and owner is not engine and not getattr(owner, "_closed", True):
        if not force:
            raise ModelInUse(f"model is owned by engine {owner.engine_id}")
        logger.warning("engine %s takes the model over from engine %s", engine.engine_id, owner.engine_id)
    _owners[id(model)] = weakref.ref(engine)


def release_model(model: Any, engine: Any) -> None:
    ref = _owners.get(id(model))
    if ref is not None and ref() is engine:
        del _owners[id(model)]
