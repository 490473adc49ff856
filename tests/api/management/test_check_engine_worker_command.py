"""``manage.py check_engine_worker``: the engine worker container's health check."""

from __future__ import annotations

import time

import pytest
from django.core.management import CommandError, call_command

from api.common import redis_keys
from api.worker.config import host_worker_id_prefix


def _heartbeat(client, worker_id: str, ttl_ms: int = 30_000) -> None:
    client.set(redis_keys.worker_heartbeat_key(worker_id), "{}", px=ttl_ms)


def test_a_live_worker_of_this_host_passes(redis_client, capsys, settings):
    settings.WORKER_ID = ""
    _heartbeat(redis_client, f"{host_worker_id_prefix()}123-abcdef")
    call_command("check_engine_worker")
    assert f"{host_worker_id_prefix()}123-abcdef" in capsys.readouterr().out


def test_only_another_hosts_worker_fails(redis_client, settings):
    settings.WORKER_ID = ""
    _heartbeat(redis_client, "some-other-host-123-abcdef")
    with pytest.raises(CommandError, match="no live heartbeat"):
        call_command("check_engine_worker")


def test_a_worker_with_a_set_id_is_looked_up_by_that_id_alone(redis_client, settings):
    settings.WORKER_ID = "worker-1"
    _heartbeat(redis_client, f"{host_worker_id_prefix()}123-abcdef")
    with pytest.raises(CommandError, match="worker-1"):
        call_command("check_engine_worker")
    _heartbeat(redis_client, "worker-1")
    call_command("check_engine_worker")


def test_a_heartbeat_that_expired_fails(redis_client, settings):
    settings.WORKER_ID = ""
    _heartbeat(redis_client, f"{host_worker_id_prefix()}1-x", ttl_ms=20)
    time.sleep(0.1)
    with pytest.raises(CommandError):
        call_command("check_engine_worker")


def test_redis_out_of_reach_fails_with_the_reason(settings):
    from api.common.redis_client import get_redis

    settings.WORKER_ID = ""
    settings.REDIS_URL = "redis://127.0.0.1:1/9"
    get_redis.cache_clear()
    try:
        with pytest.raises(CommandError, match="Redis is unreachable"):
            call_command("check_engine_worker")
    finally:
        get_redis.cache_clear()
