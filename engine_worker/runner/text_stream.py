"""Incremental, UTF-8-safe text for one request, with stop-string holdback.

The detokenizer (:mod:`engine_worker.runner.detokenizer`) already withholds the bytes of an incomplete
multi-byte character. On top of that, when the request has stop strings, the end of the text that
could still grow into a stop string is held back until it completes one (cut) or stops matching
(released), so text that is already released never has to be taken back. A request without stop
strings takes the fast path: one detokenizer call per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class TextStream:
    """Feeds tokens to a streaming detokenizer and releases text that is final."""

    __slots__ = ("_detok", "_stops", "_pending", "stopped")

    def __init__(self, detokenizer: Any, stop: Sequence[str] = ()) -> None:
        """``detokenizer`` has ``add(token) -> str`` and ``finish() -> str``."""
        self._detok = detokenizer
        self._stops = [s for s in stop if s]
        self._pending = ""  # decoded but not yet released (only used with stop strings)
        self.stopped = False  # a stop string matched; everything from it on is dropped

    def add(self, token: int) -> str:
        """Add one token; return the text released by it ("" while held back)."""
        segment = self._detok.add(token)
        if not self._stops:
            return segment
        return self._scan(segment, final=False)

    def finish(self) -> str:
        """Flush the detokenizer at the end of the request and release what is left."""
        if self.stopped:
            return ""
        segment = self._detok.finish()
        if not self._stops:
            return segment
        return self._scan(segment, final=True)

    def _scan(self, segment: str, *, final: bool) -> str:
        if self.stopped:
            return ""
        text = self._pending + segment
        cut = -1
        for stop in self._stops:
            i = text.find(stop)
            if i >= 0 and (cut < 0 or i < cut):
                cut = i
        if cut >= 0:
            self.stopped = True
            self._pending = ""
            return text[:cut]
        if final:
            self._pending = ""
            return text
        held = self._partial_match(text)
        split = len(text) - held
        self._pending = text[split:]
        return text[:split]

    def _partial_match(self, text: str) -> int:
        """Length of the longest end of ``text`` that could still grow into a stop string."""
        best = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:k]):
                    best = k
                    break
        return best
