"""Publishing and consuming Celery-style messages through kombu's stock Redis transport against
``inference_service.broker.Transport`` (one Redis client per channel), in one run.

Each round publishes ``--messages`` messages to a queue, then consumes and acknowledges them all,
first with one transport and then with the other (the order alternates by round); the report
gives the medians of µs per message for publishing and for consuming, how many ``redis.Redis``
objects each side built per message, and the ratios. Redis: ``BENCH_REDIS_URL`` (default DB 14 of
the local Redis; the queue is deleted afterwards).

    python bench/broker_bench.py [--messages 2000] [--rounds 5]

The LAST printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402
from common import dump_json_line, environment, median  # noqa: E402
from kombu import Connection, Consumer, Exchange, Producer, Queue  # noqa: E402

SIDES = {"kombu": "redis", "shared_client": "inference_service.broker:Transport"}


class ClientCount:
    """Counts ``redis.Redis`` objects built while it is installed."""

    def __init__(self) -> None:
        self.n = 0
        self._orig = redis.Redis.__init__

    def __enter__(self) -> ClientCount:
        orig = self._orig

        def counting(client, *args, **kwargs):
            self.n += 1
            orig(client, *args, **kwargs)

        redis.Redis.__init__ = counting
        return self

    def __exit__(self, *exc: object) -> None:
        redis.Redis.__init__ = self._orig


def one_round(url: str, transport: str, messages: int) -> dict:
    queue = Queue("broker-bench", Exchange("broker-bench", type="direct"), routing_key="broker-bench")
    body = {"args": ["00000000-0000-0000-0000-000000000000"], "kwargs": {}}
    with Connection(url, transport=transport) as conn:
        channel = conn.channel()
        queue(channel).declare()
        producer = Producer(channel)
        with ClientCount() as built:
            t0 = time.perf_counter()
            for _ in range(messages):
                producer.publish(body, exchange=queue.exchange, routing_key="broker-bench")
            publish_s = time.perf_counter() - t0
        publish_clients = built.n
        got = 0

        def on_message(_body, message) -> None:
            nonlocal got
            got += 1
            message.ack()

        with ClientCount() as built, Consumer(channel, [queue], callbacks=[on_message]):
            t0 = time.perf_counter()
            while got < messages:
                conn.drain_events(timeout=5)
            consume_s = time.perf_counter() - t0
        queue(channel).delete()
    return {"publish_us": 1e6 * publish_s / messages, "consume_us": 1e6 * consume_s / messages,
            "clients_per_publish": publish_clients / messages, "clients_per_consume": built.n / messages}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for i in range(args.rounds):
        order = list(SIDES) if i % 2 == 0 else list(reversed(SIDES))
        for side in order:
            runs[side].append(one_round(url, SIDES[side], args.messages))
        print(f"round {i + 1}: " + ", ".join(f"{s} publish {runs[s][-1]['publish_us']:.0f} µs consume "
                                            f"{runs[s][-1]['consume_us']:.0f} µs" for s in SIDES), flush=True)
    result: dict = {"bench": "broker", "messages": args.messages, "rounds": args.rounds}
    for side, side_runs in runs.items():
        result[side] = {key: round(median([r[key] for r in side_runs]), 2) for key in side_runs[0]}
    result["publish_shared_over_kombu"] = round(result["shared_client"]["publish_us"] / result["kombu"]["publish_us"], 3)
    result["consume_shared_over_kombu"] = round(result["shared_client"]["consume_us"] / result["kombu"]["consume_us"], 3)
    result["env"] = environment()
    dump_json_line(result, args.out)


if __name__ == "__main__":
    main()
