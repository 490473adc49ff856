"""Shared-prefix admission: a prompt waits for a prefill in progress that will cover more of it.

The prefix cache stores a request's cache when the request ends, so prompts that arrive together
and share a long prefix (one system prompt, the first turns of many conversations) would all
prefill it: none of them is in the cache yet. Instead, a waiting prompt that shares at least
:data:`MIN_GAIN_TOKENS` more tokens with a prompt still prefilling (a *leader*) than the cache gave
that leader *follows* it: it stays in the waiting queue, not looked up, until the leader's prompt
is processed. (The cache serves a prompt the longest prefix it shares with any entry, so what it
gave the leader is what it holds of the shared part.) The leader's cache is then stored under its
prompt (:func:`~engine_worker.cache.hooks.store_prompt_snapshot`), and the follower's
next lookup hits the shared part. So the shared prefix is prefilled once, and the followers
prefill only what is their own.

A follower waits at most as long as its leader prefills: an aborted or failed leader releases its
followers at once. Prompts that share less than :data:`MIN_GAIN_TOKENS` with a prefill in
progress are admitted as before.

Runs on the engine thread (:class:`engine_worker.cache.hooks.CacheLifecycle`, which stores the
leaders' prompts).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine_worker.cache.index import as_token_array, common_prefix_len
from engine_worker.common.request import Request

# A follower waits for its leader's prefill only to skip at least this many prompt tokens, so
# short prompts and a conversation's next turn (its history already cached) never wait. Also the
# length of the first block by which prefills in progress are grouped.
MIN_GAIN_TOKENS = 256


class SharedPrefill:
    def __init__(self) -> None:
        # First MIN_GAIN_TOKENS tokens of a prompt -> its requests still prefilling, by id.
        self._prefilling: dict[bytes, dict[str, tuple[Request, np.ndarray]]] = {}
        self._block_of: dict[str, bytes] = {}  # leader id -> its group
        self._followers: dict[str, set[str]] = {}  # leader id -> ids of the requests following it
        self._leader_of: dict[str, str] = {}  # follower id -> leader id
        # Requests that followed once: they never follow again, so a cache that cannot keep the
        # leader's prompt (an entry over its budget) costs each of them one wait, not a chain.
        self._followed: set[str] = set()

    @property
    def leading(self) -> bool:
        """Whether some prompt in the batch is still prefilling under watch."""
        return bool(self._prefilling)

    def release_all(self) -> None:
        """Stop every leader (after a failure): their followers are looked up again."""
        for rid in list(self._block_of):
            self._stop_leading(rid)

    def started(self, request: Request) -> None:
        """``request`` entered the batch to prefill its prompt."""
        prompt = request.prompt_ids
        if len(prompt) - request.cached_tokens < MIN_GAIN_TOKENS:
            return  # it prefills too little for anyone to wait on it
        tokens = as_token_array(prompt)
        block = tokens[:MIN_GAIN_TOKENS].tobytes()
        self._prefilling.setdefault(block, {})[request.request_id] = (request, tokens)
        self._block_of[request.request_id] = block

    def waits(self, request: Request) -> bool:
        """For a waiting request: True while it follows a leader still prefilling."""
        leader = self._leader_of.get(request.request_id)
        if leader is None:
            return False
        if leader in self._block_of:
            return True
        del self._leader_of[request.request_id]
        return False

    def follow(self, request: Request) -> bool:
        """Before ``request``'s lookup: whether it should follow a prefill in progress (it is
        looked up once the leader's prompt is stored)."""
        prompt = request.prompt_ids
        if len(prompt) < MIN_GAIN_TOKENS or not self._prefilling or request.request_id in self._followed:
            return False
        tokens = as_token_array(prompt)
        group = self._prefilling.get(tokens[:MIN_GAIN_TOKENS].tobytes())
        if not group:
            return False
        for leader_id, (leader, leader_tokens) in group.items():
            if common_prefix_len(leader_tokens, tokens) >= leader.cached_tokens + MIN_GAIN_TOKENS:
                self._leader_of[request.request_id] = leader_id
                self._followers.setdefault(leader_id, set()).add(request.request_id)
                self._followed.add(request.request_id)
                return True
        return False

    def after_step(self, store_prompt: Callable[[Request], bool | None]) -> None:
        """Store the prompts of leaders that someone follows once they are processed
        (``store_prompt(leader)``: None while its prompt is still prefilling); a leader whose first
        token came (or that left the batch) stops leading."""
        for group in list(self._prefilling.values()):
            for rid, (request, _tokens) in list(group.items()):
                if request.batch_uid is None or request.is_finished():
                    self._stop_leading(rid)
                    continue
                if rid not in self._followers:
                    if request.output_token_ids:
                        self._stop_leading(rid)
                    continue
                if store_prompt(request) is not None or request.output_token_ids:
                    self._stop_leading(rid)

    def forget(self, request_id: str) -> None:
        """``request_id`` finished, failed or was aborted."""
        if request_id in self._block_of:
            self._stop_leading(request_id)
        self._followed.discard(request_id)
        leader = self._leader_of.pop(request_id, None)
        if leader is not None and leader in self._followers:
            self._followers[leader].discard(request_id)

    def _stop_leading(self, request_id: str) -> None:
        block = self._block_of.pop(request_id, None)
        group = self._prefilling.get(block) if block is not None else None
        if block is not None and group is not None:
            group.pop(request_id, None)
            if not group:
                del self._prefilling[block]
        self._followers.pop(request_id, None)  # its followers see it gone at their next waits()
