"""A settable stand-in for ``time.monotonic`` in the sink's tests."""

from __future__ import annotations


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now
