"""The models the service accepts jobs for, and the names of their Celery queues.

``settings.MODELS`` lists them (``name=path``); empty, the one model at ``settings.MODEL_PATH``,
named after its folder. The web side tokenizes for each with its own tokenizer
(api/serving/tokenization.py); an engine worker serves one of them (``MODEL_PATH``, ``MODEL_NAME``).

Queues: each model has a shared queue, ``engine.<model>``, which all its workers consume, and each
worker its own, ``engine.<model>.<worker id>``, to which prefix-affinity routing sends the jobs
it should run (api/jobs/services/queue_routing.py). Workers also consume ``engine``, the one queue of
the service before it served several models, so that messages sent there still run (a message
for another model's job is forwarded to that model's queue).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from api.common.errors import ModelNotFound, ModelRequired
from inference_service.env import model_name_of

LEGACY_QUEUE = "engine"


@dataclass(frozen=True)
class ConfiguredModel:
    name: str
    path: str


def configured_models() -> list[ConfiguredModel]:
    """The models jobs may name, in the order they are configured."""
    if settings.MODELS:
        return [ConfiguredModel(name, path) for name, path in settings.MODELS]
    return [ConfiguredModel(model_name_of(settings.MODEL_PATH), settings.MODEL_PATH)]


def default_model_name() -> str:
    """The model of a job that names none, when one model is configured; the first otherwise
    (a job row inserted without a model: tests, the admin)."""
    return configured_models()[0].name


def model_resolve(*, name: str | None) -> ConfiguredModel:
    """The configured model ``name``; without a name, the only model. Raises ModelNotFound for a
    name not configured, ModelRequired when none is named and several are configured."""
    models = configured_models()
    if name is None:
        if len(models) == 1:
            return models[0]
        raise ModelRequired(available=[m.name for m in models])
    for model in models:
        if model.name == name:
            return model
    raise ModelNotFound(name)


def model_path(name: str | None) -> str:
    """The folder of the configured model ``name`` (None, or a model no longer configured: the
    first configured model's)."""
    models = configured_models()
    return next((m.path for m in models if m.name == name), models[0].path)


def model_queue(model: str) -> str:
    """The shared queue of ``model``: every worker of the model consumes it."""
    return f"engine.{model}"


def worker_queue(model: str, worker_id: str) -> str:
    """The queue of one worker of ``model``: jobs routed to it by prefix affinity."""
    return f"engine.{model}.{worker_id}"
