"""The opt-in Celery broker transport: kombu's Redis transport, with one Redis client per channel
instead of a new one for every published or acknowledged message (inference_service/broker.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import redis
from django.conf import settings
from kombu import Connection, Consumer, Exchange, Producer, Queue

from inference_service.broker import Transport

ROOT = Path(__file__).resolve().parents[2]


def test_the_setting_selects_the_shared_client_transport_for_a_redis_broker():
    env = {**os.environ, "BROKER_SHARED_CLIENT": "1", "REDIS_URL": settings.REDIS_URL}
    probe = ("import django; django.setup(); from inference_service.celery import app; "
             "print(type(app.connection_for_write().transport).__module__)")
    out = subprocess.run([sys.executable, "-c", probe], env={**env, "DJANGO_SETTINGS_MODULE": "inference_service.settings"},
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    assert out[-1] == "inference_service.broker"
    off = {**env, "BROKER_SHARED_CLIENT": "0", "DJANGO_SETTINGS_MODULE": "inference_service.settings"}
    out = subprocess.run([sys.executable, "-c", probe], env=off, cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.split()
    assert out[-1] == "kombu.transport.redis"


def test_publishing_and_acknowledging_build_no_client_per_message(redis_client, monkeypatch):
    built = []
    real_init = redis.Redis.__init__

    def counting_init(client, *args, **kwargs):
        built.append(client)
        real_init(client, *args, **kwargs)

    queue = Queue("test-broker-transport", Exchange("test-broker-transport", type="direct"),
                  routing_key="test-broker-transport")
    received = []
    with Connection(settings.REDIS_URL, transport="inference_service.broker:Transport") as conn:
        assert isinstance(conn.transport, Transport)
        channel = conn.channel()
        queue(channel).declare()
        producer = Producer(channel)
        monkeypatch.setattr(redis.Redis, "__init__", counting_init)
        for i in range(20):
            producer.publish({"i": i}, exchange=queue.exchange, routing_key="test-broker-transport")

        def on_message(body, message) -> None:
            received.append(body["i"])
            message.ack()

        with Consumer(channel, [queue], callbacks=[on_message]):
            while len(received) < 20:
                conn.drain_events(timeout=5)
        monkeypatch.setattr(redis.Redis, "__init__", real_init)
        assert not redis_client.llen("test-broker-transport")  # all taken
        queue(channel).delete()

    assert received == list(range(20))
    assert len(built) <= 1  # kombu's own transport builds 2 per publish and 2 per consume: 80
