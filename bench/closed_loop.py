"""The load of bench/peer_bench.py, apart from how a request is sent: its chat prompts, the closed
loop of C clients, and the row of figures a level reports. peer_bench.py sends the requests over
HTTP; bench/engine_loop.py hands them to an in-process engine, so both measure the same load.

Imports neither mlx nor an HTTP client: the bench's own process uses it too.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

PROMPTS = ["def fib(n):", "import os", "class Queue:", "Write a haiku about tests.", "What is 2+2?",
           "for i in range(10):", "Explain the GIL.", "return None"]


def chat_messages(i: int) -> list[dict[str, str]]:
    """The messages of request ``i``: one short user turn, unique per request."""
    return [{"role": "user", "content": f"{PROMPTS[i % 8]} #{i}"}]


def new_record() -> dict:
    """One request's record: ``ok``, ``ttft`` and ``stream`` (seconds), ``tokens``, ``error``."""
    return {"ok": False, "ttft": None, "stream": None, "tokens": 0, "error": None}


async def closed_loop(concurrency: int, requests: int,
                      one: Callable[[int], Awaitable[dict]]) -> tuple[list[dict], float]:
    """Requests ``0 .. requests-1`` (last first), ``concurrency`` clients, each sending its next
    request (``one(i)``, which returns its record) when its previous one ended. Returns the
    records and the wall time in seconds."""
    pending = list(range(requests))
    records: list[dict] = []

    async def client() -> None:
        while pending:
            records.append(await one(pending.pop()))

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return records, time.perf_counter() - started


def load_row(records: list[dict], wall: float) -> dict:
    """A level's figures from its records: completion tok/s and requests/s of the successful
    requests over the wall time, TTFT p50/p95, stream p50 (first token to the end: the decode as
    the client sees it), errors and two of their messages."""
    ok = [r for r in records if r["ok"]]
    ttfts = sorted(r["ttft"] for r in ok)
    return {
        "tok_s": round(sum(r["tokens"] for r in ok) / wall, 1),
        "req_s": round(len(ok) / wall, 1),
        "ttft_p50_ms": round(1000 * _pct(ttfts, 0.5), 1) if ttfts else None,
        "ttft_p95_ms": round(1000 * _pct(ttfts, 0.95), 1) if ttfts else None,
        "stream_p50_ms": round(1000 * statistics.median(r["stream"] for r in ok), 1) if ok else None,
        "errors": len(records) - len(ok),
        "error_samples": [r["error"] for r in records if not r["ok"]][:2],
    }


def _pct(xs: list[float], q: float) -> float:
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
