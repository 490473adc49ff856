"""What a finished request leaves in the prefix cache: its prompt, and its reply as the latest turn
of that prompt's conversation.

A later request can reuse a finished request's KV in two ways only: its prompt starts with this
prompt (the same system prompt or question again), or it is the next turn of this conversation
(this prompt, this reply, then more). So the finished request's whole KV (prompt + reply) is
stored, under the prompt + reply tokens, and it replaces the entry stored by the previous
finished request of the same prompt: a prompt keeps one reply, the latest. Without that, every
request of a load that sends the same prompts again (benchmarks, retries, templated jobs) left
one entry per request whose reply no one asks for again, and the cache filled its whole budget.

A conversation's turns do not pile up either: the next turn's entry extends this one, and the
store drops an entry that a new one extends (:meth:`EntryStore.insert`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from engine_worker.cache import kv
from engine_worker.cache.protocol import PrefixCacheBackend, StoreItem
from engine_worker.cache.types import key_hash

# Prompts whose latest turn is remembered (a key hash each, about 100 bytes): beyond it the
# oldest prompt's turn is no longer replaced, only aged out by the cache's own LRU.
MAX_PROMPTS = 8192


class TurnStore:
    """Stores finished requests' caches, one reply per prompt. Engine thread only."""

    def __init__(self, backend: PrefixCacheBackend, max_prompts: int = MAX_PROMPTS) -> None:
        self._backend = backend
        self._max_prompts = max_prompts
        self._turns: OrderedDict[str, str] = OrderedDict()  # prompt key hash -> its latest turn's

    def store(self, prompt: Sequence[int], tokens: Sequence[int], cache: list[Any]) -> None:
        """Store ``cache`` (what the request's KV holds: ``tokens``, its prompt and reply, cut to
        the cache's offset) and drop the previous reply stored for ``prompt``."""
        self.store_many([(prompt, tokens, cache)])

    def store_many(self, finished: Sequence[tuple[Sequence[int], Sequence[int], list[Any]]]) -> None:
        """:meth:`store` each ``(prompt, tokens, cache)`` in order, through one
        :meth:`~engine_worker.cache.protocol.PrefixCacheBackend.store_many` (the requests that
        finished in one step: one evaluation of their copies). Two replies to one prompt in the
        same batch: the later one is kept, as when they are stored one after the other."""
        items = []
        for prompt, tokens, cache in finished:
            key_tokens = list(tokens[: min(len(tokens), kv.cache_offset(cache))])
            items.append(StoreItem(key_tokens, cache, self._replaced(prompt, key_tokens)))
        self._backend.store_many(items)

    def _replaced(self, prompt: Sequence[int], key_tokens: list[int]) -> str | None:
        """Record ``key_tokens`` as the latest turn of ``prompt``; the key of the turn it replaces."""
        if len(key_tokens) <= len(prompt):
            return None  # the prompt alone (or a part): nothing to replace
        prompt_key, turn_key = key_hash(list(prompt)), key_hash(key_tokens)
        previous = self._turns.pop(prompt_key, None)
        self._turns[prompt_key] = turn_key
        if len(self._turns) > self._max_prompts:
            self._turns.popitem(last=False)
        return previous if previous != turn_key else None
