"""Prefix-affinity routing: which queue a new job's ``run_job`` message goes to.

Among the live workers of the job's model, a job whose prompt continues a prompt that a worker
ran recently (a conversation's next turn: the previous turn's prompt, its answer and one more
message) goes to that worker, whose prefix cache holds it, unless its batch is full while another
worker's has room, or every batch is full and it is much busier than the others; any other job
goes to the least-loaded worker.

* **Prefixes.** The prompt's tokens are cut into blocks of ``BLOCK_TOKENS``; block *i* is named
  by a hash of blocks 0..*i* (a chain, as the engine's prefix index names them), for the first
  ``MAX_BLOCKS`` blocks. Redis keeps, per name, the set of workers recently sent a job whose
  prompt has that prefix (``engine:affinity:<model>:<hash>``), and the set of those whose job's
  prompt ended there (``...:end``: its last whole block), each for ``AFFINITY_TTL_S`` after the
  last job. The deepest block held by a live worker decides.
* **A continuation** (that block ends an earlier job's prompt on a live worker): that worker, if
  its batch has room (the job starts at once, its prefix cached). If not, the worker with the
  fewest jobs waiting for a place in its batch, when that one has room (the job starts at once
  there, recomputing the prefix, instead of waiting) or when every batch is full and more jobs
  wait at the first worker than there by more than ``MAX_EXTRA_JOBS`` or half of those.
* **Anything else** (a new prompt, or a new branch of a prefix other jobs share, such as a system
  prompt): the least-loaded worker; ties go round the tied workers in turn, by a counter of new
  prompts in Redis. A burst of new conversations is routed before its own jobs count in the
  loads, so every one of it sees the same loads: the turns split it evenly (a hash of the prompt
  splits it only on average, and affinity then keeps each conversation where it started). Holding
  the shared part earns nothing: each worker computes a system prompt once.
* **Load.** A worker's load is its model's active jobs it runs or was routed: the database's,
  plus those routed to it whose rows are not in yet (a Redis hash per model,
  ``engine:affinity-pending:<model>``, one up when the route is chosen and one down once the row
  has committed, :func:`job_route_settled`). A burst of submissions is routed before its rows
  commit (SQLite inserts them one at a time), so the database alone would show every one of it
  the same loads and send it all to one worker; heartbeats lag by seconds. A new job waits there
  while that load is at least its batch's capacity (its heartbeat's ``capacity``, which changes
  rarely). A worker whose heartbeat has no capacity counts every job as waiting.
  With every batch full a continuation still goes to a worker's own queue, not the shared one: a
  worker claims every message it takes, room or not (the job then waits in its engine), so the
  shared queue spreads jobs by which worker takes the message first, not by room, and loses the
  prefix.
* **Queues.** The chosen worker's own queue (``engine.<model>.<worker>``). With fewer than two
  live workers, with a prompt shorter than a block, with affinity off (``ROUTING_AFFINITY``) or
  Redis out of reach, the model's shared queue, which every worker of the model consumes.

A worker that dies stops heartbeating: it is never chosen again, and its prefixes go to the
others. A message already sent to its queue is never consumed; the job stays queued, and the
reconciler sends it to the model's shared queue once its claim deadline passes (api/jobs/tasks.py).
"""

from __future__ import annotations

import hashlib
import logging
import struct
from dataclasses import dataclass

import redis
from django.conf import settings

from api.common.redis_client import get_redis
from api.jobs.selectors import job_worker_loads
from api.serving.catalog import model_queue, worker_queue
from api.serving.workers import worker_capacities

logger = logging.getLogger(__name__)

BLOCK_TOKENS = 32
MAX_BLOCKS = 256  # 8,192 tokens: deeper prefixes route as their first 8,192 tokens do
AFFINITY_TTL_S = 600
MAX_EXTRA_JOBS = 4

AFFINITY_PREFIX = "engine:affinity:"
END_SUFFIX = ":end"  # the workers whose job's prompt's last whole block this is
NEW_PROMPTS_PREFIX = "engine:affinity-new:"  # per model: the new prompts routed, for the turns of ties
PENDING_PREFIX = "engine:affinity-pending:"  # per model: worker -> its routed jobs whose rows are not in
PENDING_TTL_S = 60  # a count a dead web process left behind goes once routing is idle this long


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
    if len(prompt_token_ids) < BLOCK_TOKENS:
        return shared
    try:
        capacities = worker_capacities(model)
        live = frozenset(capacities)
        if len(live) < 2:  # one worker (the usual deployment): nothing to choose, nothing to hash
            return shared
        hashes = prefix_hashes(prompt_token_ids)
        client = get_redis()
        names = [_affinity_key(model, h) for h in hashes]
        ends, pending = _lookup(client, model, names, live)
        target = _choose(model, hashes, capacities, ends, pending, client)
        client.register_script(_RECORD)(keys=[*names, names[-1] + END_SUFFIX, PENDING_PREFIX + model],
                                        args=[target, AFFINITY_TTL_S, PENDING_TTL_S])
    except redis.RedisError:
        logger.warning("prefix-affinity routing unavailable (Redis); job sent to the shared queue", exc_info=True)
        return shared
    return Route(worker_queue(model, target), target)


def job_route_settled(*, model: str, route: Route) -> None:
    """The routed job's row has committed (it counts in the database's loads now), or it never
    will (its submission failed): it no longer counts as pending. Never raises for Redis trouble."""
    if route.worker_id is None:
        return
    try:
        pipe = get_redis().pipeline(transaction=False)
        pipe.hincrby(PENDING_PREFIX + model, route.worker_id, -1)
        pipe.expire(PENDING_PREFIX + model, PENDING_TTL_S)
        pipe.execute()
    except redis.RedisError:
        logger.warning("could not settle a routed job's pending count (Redis)", exc_info=True)


def _lookup(client: redis.Redis, model: str, names: list[str], live: frozenset[str]) -> tuple[set[str], dict[str, int]]:
    """Of the live workers that hold the prompt's deepest held block, those whose job's prompt
    ended with that block (the prompt continues a prompt they ran); and each worker's pending
    jobs (one script: one command, whatever the prompt's length)."""
    ends, pending = client.register_script(_LOOKUP)(
        keys=[*names, *(name + END_SUFFIX for name in names), PENDING_PREFIX + model], args=sorted(live))
    counts = {worker: max(0, int(n)) for worker, n in zip(pending[::2], pending[1::2], strict=True)}
    return set(ends), counts


# KEYS: the prompt's block names, shallowest first; then the ":end" set of each, in the same order;
# then the model's pending hash. ARGV: the live workers. Returns the live workers of the ":end" set
# of the deepest block a live worker holds ({} if none does), and the pending hash's fields and values.
_LOOKUP = """
local blocks = (#KEYS - 1) / 2
local live = {}
for _, worker in ipairs(ARGV) do live[worker] = true end
local function alive(members)
    local kept = {}
    for _, worker in ipairs(members) do
        if live[worker] then kept[#kept + 1] = worker end
    end
    return kept
end
local ends = {}
for i = blocks, 1, -1 do
    if #alive(redis.call("SMEMBERS", KEYS[i])) > 0 then
        ends = alive(redis.call("SMEMBERS", KEYS[blocks + i]))
        break
    end
end
return {ends, redis.call("HGETALL", KEYS[#KEYS])}
"""

# KEYS: the sets the chosen worker joins (each block name, and the last block's ":end" set), then
# the model's pending hash. ARGV: the worker, the sets' TTL, the pending hash's TTL.
_RECORD = """
for i = 1, #KEYS - 1 do
    redis.call("SADD", KEYS[i], ARGV[1])
    redis.call("EXPIRE", KEYS[i], ARGV[2])
end
redis.call("HINCRBY", KEYS[#KEYS], ARGV[1], 1)
redis.call("EXPIRE", KEYS[#KEYS], ARGV[3])
"""


def _choose(model: str, hashes: list[bytes], capacities: dict[str, int], ends: set[str], pending: dict[str, int],
            client: redis.Redis) -> str:
    live = frozenset(capacities)
    loads = {w: n + pending.get(w, 0) for w, n in job_worker_loads(model=model, worker_ids=live).items()}

    def waiting(worker: str) -> int:  # the jobs the new one would wait behind there (0: it starts at once)
        return max(0, loads[worker] + 1 - capacities[worker])

    # Ties go by rendezvous hashing of the prompt's own last block: prompts that share only a
    # system prompt split evenly, even in a burst that sees the same loads.
    def soonest(worker: str) -> tuple[int, int, int]:
        return waiting(worker), loads[worker], -_rendezvous(hashes[-1], worker)

    if ends:  # the prompt continues one that a worker ran, whose KV it holds
        target, quickest = min(ends, key=soonest), min(live, key=soonest)
        if waiting(target) == 0 or waiting(quickest) > 0 and (
                waiting(target) - waiting(quickest) <= max(MAX_EXTRA_JOBS, waiting(quickest) // 2)):
            return target  # it starts at once there; or every worker is full and it is not much busier
        return quickest
    # A new prompt, or a new branch of a shared prefix (a system prompt): the least-loaded worker,
    # ties in turn.
    least = min(loads[w] for w in live)
    tied = sorted(w for w in live if loads[w] == least)
    if len(tied) == 1:
        return tied[0]
    return tied[_new_prompt_number(client, model) % len(tied)]


def _new_prompt_number(client: redis.Redis, model: str) -> int:
    pipe = client.pipeline(transaction=False)
    pipe.incr(NEW_PROMPTS_PREFIX + model)
    pipe.expire(NEW_PROMPTS_PREFIX + model, AFFINITY_TTL_S)
    return int(pipe.execute()[0])


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
