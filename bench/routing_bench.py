"""Prefix-affinity routing's cost per submission (api/jobs/services/queue_routing.py ``job_route``).

Routing runs on every submission of a model with two or more live workers, in the web tier's one
thread for sync code, so its time adds to every submission behind it. A fresh SQLite database
(the workers' loads are a query of it) and Redis DB ``--redis-db`` of 127.0.0.1:6379; two live
workers of batch 128 (their heartbeats' reading, cached per process, is not timed). Each round
routes ``--conversations`` conversations of ``--turns`` turns over a ``--system-tokens`` system
prompt (each turn adds ``--turn-tokens`` tokens) twice, interleaved: with this tree's ``job_route``
(a Lua script each for the lookup and the record) and with the same lookup and record as Redis
pipelines (``before_route`` below: two commands per block for each). Prints the medians
per route and the ratio; the LAST line is one JSON object.

    python bench/routing_bench.py [--conversations 64] [--turns 4] [--system-tokens 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import dump_json_line  # noqa: E402

WORKERS = {"bench-w0": 128, "bench-w1": 128}


def setup(path: str, redis_db: int) -> None:
    os.environ["DATABASE_URL"] = f"sqlite:///{path}"
    os.environ["REDIS_URL"] = f"redis://127.0.0.1:6379/{redis_db}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inference_service.settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from api.jobs.services import queue_routing

    queue_routing.worker_capacities = lambda model: dict(WORKERS)


def before_route(*, model: str, prompt_token_ids: list[int]) -> str:
    """The baseline: ``job_route``'s lookup and record as pipelines of one or two commands per block."""
    from api.common.redis_client import get_redis
    from api.jobs.services import queue_routing as qr

    hashes = qr.prefix_hashes(prompt_token_ids)
    client = get_redis()
    names = [qr._affinity_key(model, h) for h in hashes]
    live = frozenset(WORKERS)
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.smembers(name)
        pipe.smembers(name + qr.END_SUFFIX)
    pipe.hgetall(qr.PENDING_PREFIX + model)
    *replies, pending = pipe.execute()
    counts = {worker: max(0, int(n)) for worker, n in pending.items()}
    ends: set[str] = set()
    for i in reversed(range(len(names))):
        if replies[2 * i] & live:
            ends = replies[2 * i + 1] & live
            break
    target = qr._choose(model, hashes, dict(WORKERS), ends, counts, client)
    pipe = client.pipeline(transaction=False)
    pipe.hincrby(qr.PENDING_PREFIX + model, target, 1)
    pipe.expire(qr.PENDING_PREFIX + model, qr.PENDING_TTL_S)
    for name in names:
        pipe.sadd(name, target)
        pipe.expire(name, qr.AFFINITY_TTL_S)
    pipe.sadd(names[-1] + qr.END_SUFFIX, target)
    pipe.expire(names[-1] + qr.END_SUFFIX, qr.AFFINITY_TTL_S)
    pipe.execute()
    return target


def this_route(*, model: str, prompt_token_ids: list[int]) -> str:
    from api.jobs.services.queue_routing import job_route

    worker = job_route(model=model, prompt_token_ids=prompt_token_ids).worker_id
    assert worker is not None, "routing chose the shared queue: the bench's workers are not live"
    return worker


def conversations(args, seed: int) -> list[list[int]]:
    """Each conversation's turns in submission order (every first turn, then every second...)."""
    rng = random.Random(seed)
    system = [rng.randrange(32000) for _ in range(args.system_tokens)]
    prompts = [list(system) for _ in range(args.conversations)]
    turns = []
    for _turn in range(args.turns):
        for prompt in prompts:
            prompt += [rng.randrange(32000) for _ in range(args.turn_tokens)]
            turns.append(list(prompt))
    return turns


def time_routes(route, model: str, prompts: list[list[int]]) -> float:
    """ms per route of ``prompts`` on ``model`` (a model of its own: no prefix carries over)."""
    from api.jobs.services.queue_routing import Route, job_route_settled
    from api.serving.catalog import worker_queue

    start = time.perf_counter()
    for prompt in prompts:
        worker = route(model=model, prompt_token_ids=prompt)
        job_route_settled(model=model, route=Route(worker_queue(model, worker), worker))
    return (time.perf_counter() - start) / len(prompts) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--turn-tokens", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--redis-db", type=int, default=11)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        setup(str(Path(tmp) / "routing.sqlite3"), args.redis_db)
        import redis

        redis.Redis(db=args.redis_db).flushdb()
        times: dict[str, list[float]] = {"before": [], "this": []}
        for r in range(args.rounds):
            prompts = conversations(args, seed=r)
            for name, route in (("before", before_route), ("this", this_route)):
                times[name].append(time_routes(route, f"bench-{name}-{r}", prompts))
            print(f"round {r + 1}: before {times['before'][-1]:.2f} ms, this tree {times['this'][-1]:.2f} ms per route")
    before, this = statistics.median(times["before"]), statistics.median(times["this"])
    print(f"median per route: before {before:.2f} ms, this tree {this:.2f} ms; this / before {this / before:.2f}")
    dump_json_line({"ms_per_route_before": round(before, 3), "ms_per_route_this": round(this, 3),
                    "ratio": round(this / before, 3), "rounds": times, "args": vars(args)}, args.out)


if __name__ == "__main__":
    main()
