"""The Celery broker: kombu's Redis transport, with one Redis client per channel instead of a new
one for every published or acknowledged message (inference_service/broker.py)."""

from __future__ import annotations

import redis
from kombu import Consumer, Exchange, Producer, Queue

from inference_service.broker import Transport
from inference_service.celery import app


def test_the_app_s_broker_connections_use_the_shared_client_transport(redis_client):
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, Transport)


def test_publishing_and_acknowledging_build_no_client_per_message(redis_client, monkeypatch):
    built = []
    real_init = redis.Redis.__init__

    def counting_init(client, *args, **kwargs):
        built.append(client)
        real_init(client, *args, **kwargs)

    queue = Queue("test-broker-transport", Exchange("test-broker-transport", type="direct"),
                  routing_key="test-broker-transport")
    received = []
    with app.connection_for_write() as conn:
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
