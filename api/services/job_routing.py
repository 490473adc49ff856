"""Prefix-affinity routing: which queue a new job's ``run_job`` message goes to.

Among the live workers of the job's model, a job whose prompt starts with a prefix that other
jobs used recently goes to a worker that ran one of them, whose prefix cache holds it; a new
prefix goes to the least-loaded worker. A conversation's next turn, whose prompt is the previous
turn's prompt and answer and one more message, then lands where its history is cached.

* **Prefixes.** The prompt's tokens are cut into blocks of ``BLOCK_TOKENS``; block *i* is named
  by a hash of blocks 0..*i* (a chain, as the engine's prefix index names them), for the first
  ``MAX_BLOCKS`` blocks. Redis keeps, per name, the set of workers recently sent a job with that
  prefix (``engine:affinity:<model>:<hash>``, for ``AFFINITY_TTL_S`` after the last). The deepest
  block held by a live worker names the candidates: its live holders (none: every live worker).
* **Load.** A worker's load is its model's active jobs it runs or was routed (the database,
  counted per submission, so a burst of submissions sees each other; heartbeats would lag by
  seconds). The least-loaded candidate takes the job unless it is much busier than the
  least-loaded live worker: more than ``MAX_EXTRA_JOBS`` jobs or half that worker's load more.
  Then the least-loaded worker takes it (ties broken by rendezvous hashing of the first block, so
  equal workers split new prefixes evenly). Either way the prompt's blocks now name that worker
  too: a shared system prompt soon has every worker as a holder and spreads by load, while a
  conversation's own turns have one holder and stay with it.
* **Queues.** The chosen worker's own queue (``engine.<model>.<worker>``). With fewer than two
  live workers, with a prompt shorter than a block, with affinity off (``ROUTING_AFFINITY``) or
  Redis out of reach, the model's shared queue, which every worker of the model consumes.

A worker that dies stops heartbeating: it is never chosen again, and its prefixes go to the
others. A message already sent to its queue is never consumed; the job stays queued, and the
reconciler sends it to the model's shared queue once its claim deadline passes (api/tasks.py).
"""

from __future__ import annotations

import hashlib
import logging
import struct
from dataclasses import dataclass

import redis
from django.conf import settings

from api.model_catalog import model_queue, worker_queue
from api.redis_client import get_redis
from api.selectors.jobs import job_worker_loads
from api.selectors.workers import worker_ids_serving

logger = logging.getLogger(__name__)

BLOCK_TOKENS = 32
MAX_BLOCKS = 256  # 8,192 tokens: deeper prefixes route as their first 8,192 tokens do
AFFINITY_TTL_S = 600
MAX_EXTRA_JOBS = 2  # a spill costs one prefill of the prefix on another worker, which then holds it too

AFFINITY_PREFIX = "engine:affinity:"


@dataclass(frozen=True)
class Route:
    queue: str
    worker_id: str | None  # None: the model's shared queue


def job_route(*, model: str, prompt_token_ids: list[int]) -> Route:
    """The queue of a new job of ``model`` with this prompt, and the worker it is meant for.
    Records the prompt's prefix as that worker's. Never raises for Redis trouble (the shared
    queue then)."""
    shared = Route(model_queue(model), None)
    if not settings.ROUTING_AFFINITY:
        return shared
    hashes = prefix_hashes(prompt_token_ids)
    if not hashes:
        return shared
    try:
        live = worker_ids_serving(model)
        if len(live) < 2:
            return shared
        client = get_redis()
        names = [_affinity_key(model, h) for h in hashes]
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.smembers(name)
        holders = next((held & live for held in reversed(pipe.execute()) if held & live), live)
        loads = job_worker_loads(model=model, worker_ids=live)

        def busy(worker: str) -> tuple[int, int]:
            return loads[worker], -_rendezvous(hashes[0], worker)

        least, target = min(live, key=busy), min(holders, key=busy)
        if loads[target] - loads[least] > max(MAX_EXTRA_JOBS, loads[least] // 2):
            target = least
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.sadd(name, target)
            pipe.expire(name, AFFINITY_TTL_S)
        pipe.execute()
    except redis.RedisError:
        logger.warning("prefix-affinity routing unavailable (Redis); job sent to the shared queue", exc_info=True)
        return shared
    return Route(worker_queue(model, target), target)


def prefix_hashes(token_ids: list[int]) -> list[bytes]:
    """The chain hashes of the prompt's whole blocks (at most MAX_BLOCKS): each names the prefix
    that ends with its block."""
    hashes = []
    previous = b""
    blocks = min(len(token_ids) // BLOCK_TOKENS, MAX_BLOCKS)
    for i in range(blocks):
        block = token_ids[i * BLOCK_TOKENS:(i + 1) * BLOCK_TOKENS]
        previous = hashlib.blake2b(previous + struct.pack(f"<{BLOCK_TOKENS}I", *block), digest_size=16).digest()
        hashes.append(previous)
    return hashes


def _affinity_key(model: str, block_hash: bytes) -> str:
    return f"{AFFINITY_PREFIX}{model}:{block_hash.hex()}"


def _rendezvous(first_block: bytes, worker_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(first_block + worker_id.encode(), digest_size=8).digest(), "big")
