"""Model factories: plain functions with sensible defaults, overridable by keyword."""

from __future__ import annotations

import itertools
from typing import Any

from django.contrib.auth import get_user_model

from api.keys.services import api_key_create
from api.models import ApiKey, Job, JobStatus

_counter = itertools.count(1)


def make_user(**overrides: Any):
    n = next(_counter)
    fields = {"username": f"user{n}", "email": f"user{n}@example.com", **overrides}
    password = fields.pop("password", None)
    user = get_user_model().objects.create(**fields)
    if password:
        user.set_password(password)
        user.save()
    return user


def make_api_key(*, owner=None, **quotas: Any) -> tuple[ApiKey, str]:
    """A key and its secret (the secret is only available at creation)."""
    return api_key_create(owner=owner or make_user(), name=quotas.pop("name", "test"), **quotas)


def make_job(*, owner=None, api_key: ApiKey | None = None, **overrides: Any) -> Job:
    if owner is None:
        owner = api_key.owner if api_key is not None else make_user()
    fields: dict[str, Any] = {
        "owner": owner,
        "api_key": api_key,
        "status": JobStatus.QUEUED,
        "prompt": "Once upon a time",
        "prompt_token_ids": [1, 2, 3],
        "params": {"max_tokens": 16, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                   "repetition_penalty": 1.0, "seed": None, "stop": []},
        **overrides,
    }
    return Job.objects.create(**fields)


def heartbeat(*, worker_id: str = "w-1", model: str = "tiny", requests: tuple = (), cache: dict | None = None,
              **overrides: Any):
    """A WorkerHeartbeat as an engine worker would publish it."""
    import time

    from engine_worker.protocol import MemoryStats, WorkerHeartbeat

    fields: dict[str, Any] = {
        "worker_id": worker_id, "model": model, "device": "cpu",
        "memory": MemoryStats(device="cpu", active_bytes=10 << 20, peak_bytes=20 << 20, cache_bytes=5 << 20,
                              budget_bytes=1 << 30, weights_bytes=4 << 20, kv_bytes=3 << 20, prefix_cache_bytes=2 << 20),
        "num_running": len(requests), "num_waiting": 0, "sent_at": time.time(), "requests": tuple(requests),
        "cache": cache, "context_length": 4096, **overrides,
    }
    return WorkerHeartbeat(**fields)


def publish_heartbeat(redis_client, hb, *, ttl: int | None = None) -> None:
    import json

    from api.common import redis_keys
    from engine_worker.protocol import to_dict

    redis_client.set(redis_keys.worker_heartbeat_key(hb.worker_id), json.dumps(to_dict(hb)),
                     ex=ttl or redis_keys.WORKER_HEARTBEAT_TTL_S)
