"""How many attempts of one API key's deliveries run at once: at most WEBHOOK_CONCURRENCY_PER_KEY.

The webhooks worker runs WEBHOOK_WORKERS attempts at a time. Without a bound per key, one key whose
receivers never answer would hold every one of them for WEBHOOK_TIMEOUT_S and every other key's
deliveries would wait behind them. An attempt first takes one of its key's slots; one that finds
them all taken does not run (api/webhooks/delivery.py puts it off a second).

The slots are a Redis sorted set per key: a member per running attempt, scored with the time by
which it has surely ended (WEBHOOK_TIMEOUT_S and a margin), so the slot of a worker killed
mid-attempt frees itself. Taking one is one Lua script: the check and the add cannot interleave.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import redis
from django.conf import settings

from api.common.redis_client import get_redis

logger = logging.getLogger(__name__)

SLOTS_PREFIX = "webhooks:slots:"
# A slot outlives its attempt's longest by this much (the host's lookup, the record's writes).
SLOT_MARGIN_S = 30.0

_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


def slots_key(api_key_id: int | None) -> str:
    return f"{SLOTS_PREFIX}{api_key_id if api_key_id is not None else 'none'}"


@contextmanager
def key_slot(*, api_key_id: int | None, holder: str) -> Iterator[bool]:
    """Take one of ``api_key_id``'s slots for ``holder`` (a delivery's id) for the block; yields
    False, and holds nothing, when all of them are taken."""
    client = get_redis()
    key = slots_key(api_key_id)
    now = time.time()
    hold_s = float(settings.WEBHOOK_TIMEOUT_S) + SLOT_MARGIN_S
    taken = client.eval(_TAKE, 1, key, now, int(settings.WEBHOOK_CONCURRENCY_PER_KEY), now + hold_s, holder,
                        int(hold_s) + 1)
    try:
        yield bool(taken)
    finally:
        if taken:
            client.zrem(key, holder)


def slots_wait_released(*, holders: Iterable[tuple[int | None, str]], poll_s: float = 0.05) -> bool:
    """Wait until none of ``holders`` (pairs of an API key's id and a delivery's id) holds a slot,
    at most an attempt's longest; returns whether they all let go. The attempts then running have
    ended: a job's delete waits here, so that nothing of the job is sent after it returns."""
    client = get_redis()
    pending = list(holders)
    deadline = time.monotonic() + float(settings.WEBHOOK_TIMEOUT_S) + SLOT_MARGIN_S
    while pending:
        try:
            pending = [(key, holder) for key, holder in pending if client.zscore(slots_key(key), holder) is not None]
        except redis.RedisError:  # no attempt takes a slot without Redis either
            logger.warning("Could not read the webhook slots of %s", pending, exc_info=True)
            return False
        if not pending:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True
