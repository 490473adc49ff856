"""Longest-prefix lookup over token sequences through a hashed-block index.

Every entry's tokens are cut into blocks of ``block_size``; block *i* is identified by the chain
hash of blocks 0..i, so equal hashes mean (up to a collision) equal prefixes. A lookup walks the
prompt's chain hashes to the deepest block that some entry shares, then measures the exact
longest common prefix against only those entries with numpy. Cost: len(prompt)/block_size dict
probes plus one vectorised comparison per candidate, instead of a per-token trie walk with one
Python object per token.

Entries sharing the prompt's deepest matched block all share it to within one block, so the
exact comparison looks at no more than ``MAX_CANDIDATES`` of them, plus the entries that are
wholly a prefix of the prompt (found by a hash of their whole tokens). Many entries behind one
common prefix (a chat template, a system prompt) would otherwise make every lookup, and every
store's search for the prefixes it dominates, one numpy comparison per entry: with 1,000 such
entries 2.8 ms a lookup, 3,000: 8.1 ms (capped: 0.09 ms), on the engine thread, per admitted
request. The cap can cost a lookup fewer than ``block_size`` tokens of its longest prefix.

Sharing fewer than ``block_size`` tokens is a miss on purpose: reusing a handful of tokens saves
less than the copy costs. Hash collisions are harmless: candidates are verified token by token.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence

import numpy as np

DEFAULT_INDEX_BLOCK = 16
# Candidates compared token by token per lookup (see the module docstring).
MAX_CANDIDATES = 32


def as_token_array(tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int64)


def chain_hashes(tokens: np.ndarray, block_size: int) -> Iterator[int]:
    """Chain hash of each *full* block of ``tokens``, in order."""
    previous = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        previous = hash((previous, tokens[start : start + block_size].tobytes()))
        yield previous


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class PrefixIndex:
    """Maps entry keys to their tokens and finds the entry sharing the longest prefix.

    Not thread-safe by itself: the owning cache serialises access with its lock.
    """

    def __init__(self, block_size: int = DEFAULT_INDEX_BLOCK) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be > 0")
        self.block_size = block_size
        self._tokens: dict[str, np.ndarray] = {}
        self._hashes: dict[str, list[int]] = {}
        self._by_hash: dict[int, set[str]] = {}
        self._by_last: dict[int, set[str]] = {}  # hash of an entry's last full block -> keys
        self._by_whole: dict[int, set[str]] = {}  # hash of an entry's whole token bytes -> keys

    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, key: object) -> bool:
        return key in self._tokens

    def tokens(self, key: str) -> np.ndarray:
        return self._tokens[key]

    def add(self, key: str, tokens: np.ndarray) -> None:
        if key in self._tokens:
            return
        hashes = list(chain_hashes(tokens, self.block_size))
        self._tokens[key] = tokens
        self._hashes[key] = hashes
        for h in hashes:
            self._by_hash.setdefault(h, set()).add(key)
        if hashes:
            self._by_last.setdefault(hashes[-1], set()).add(key)
        self._by_whole.setdefault(hash(tokens.tobytes()), set()).add(key)

    def remove(self, key: str) -> None:
        tokens = self._tokens.pop(key, None)
        if tokens is not None:
            _discard(self._by_whole, hash(tokens.tobytes()), key)
        hashes = self._hashes.pop(key, [])
        for h in hashes:
            _discard(self._by_hash, h, key)
        if hashes:
            _discard(self._by_last, hashes[-1], key)

    def clear(self) -> None:
        self._tokens.clear()
        self._hashes.clear()
        self._by_hash.clear()
        self._by_last.clear()
        self._by_whole.clear()

    def prefixes_of(self, tokens: np.ndarray) -> list[str]:
        """Keys of the entries whose tokens are a proper prefix of ``tokens``: an entry like that
        is dominated (any prompt it serves, the longer entry serves at least as well)."""
        found = []
        block = self.block_size
        for i, h in enumerate(chain_hashes(tokens, block)):
            keys: Collection[str] = self._by_last.get(h, ())
            if len(keys) > MAX_CANDIDATES:
                # Many entries end in this block: look the few possible prefix lengths up whole.
                end = min((i + 2) * block, len(tokens))
                keys = [k for n in range((i + 1) * block, end) for k in self._by_whole.get(hash(tokens[:n].tobytes()), ())]
            for key in keys:
                entry = self._tokens[key]
                if len(entry) < len(tokens) and common_prefix_len(entry, tokens) == len(entry):
                    found.append(key)
        return found

    def best_match(self, tokens: np.ndarray) -> tuple[str, int] | None:
        """``(key, common_prefix_length)`` of the entry sharing the longest prefix, or None when
        no entry shares a full block. Ties go to the shorter entry (less to slice)."""
        candidates: set[str] | None = None
        shared = 0  # tokens every candidate shares with the prompt (up to a hash collision)
        for h in chain_hashes(tokens, self.block_size):
            keys = self._by_hash.get(h)
            if not keys:
                break
            candidates = keys
            shared += self.block_size
        if not candidates:
            return None
        best: tuple[str, int] | None = None
        for key in self._bounded(candidates, tokens, shared):
            entry = self._tokens[key]
            lcp = common_prefix_len(entry, tokens)
            if best is None or lcp > best[1] or (lcp == best[1] and len(entry) < len(self._tokens[best[0]])):
                best = (key, lcp)
        return best

    def _bounded(self, candidates: set[str], tokens: np.ndarray, shared: int) -> Iterator[str]:
        """``candidates``, or past ``MAX_CANDIDATES`` of them: the entries that are wholly a
        prefix of ``tokens`` (looked up whole, for each length the deepest block allows), then
        ``MAX_CANDIDATES`` others."""
        if len(candidates) <= MAX_CANDIDATES:
            yield from candidates
            return
        for n in range(shared, min(shared + self.block_size, len(tokens) + 1)):
            yield from self._by_whole.get(hash(tokens[:n].tobytes()), ())
        for i, key in enumerate(candidates):
            if i == MAX_CANDIDATES:
                return
            yield key


def _discard(mapping: dict[int, set[str]], h: int, key: str) -> None:
    keys = mapping.get(h)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del mapping[h]
