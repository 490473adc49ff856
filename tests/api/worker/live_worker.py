"""An engine worker in the test's process (not a test module): the worker's service, with its
periodic duties (heartbeats, history, commands) on the I/O thread of an in-process JobHost that
drives a real EngineCore on the tiny model, with the default prefix cache."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from api.worker.config import WorkerConfig
from api.worker.service import EngineWorkerService
from engine_worker.common.config import EngineConfig
from engine_worker.engine_core import EngineCore
from engine_worker.protocol import FinalResult, JobSpec
from engine_worker.runtime import JobHost, MemorySink

SHARED_PREFIX = "You are a careful assistant who writes small, well-tested Python functions. " * 3
SUFFIXES = ("def add(a, b):", "class Stack:", "import os", "for i in range(10):")


class LiveWorker:
    def __init__(self, engine: EngineCore, service: EngineWorkerService, sink: MemorySink, tokenizer: Any) -> None:
        self.engine = engine
        self.service = service
        self.sink = sink
        self.tokenizer = tokenizer

    def run_shared_prefix_jobs(self, count: int = 3, max_tokens: int = 24) -> list[FinalResult]:
        """Jobs one after another whose prompts share a long prefix: the first stores it, the
        others hit it."""
        finals = []
        for suffix in SUFFIXES[:count]:
            job_id = str(uuid.uuid4())
            ids = tuple(self.tokenizer.encode(SHARED_PREFIX + suffix))
            assert self.service.host.submit(JobSpec(job_id=job_id, prompt_token_ids=ids, max_tokens=max_tokens,
                                                    ignore_eos=True))
            final = self.sink.wait_final(job_id, 60)
            assert final is not None, f"job {job_id} did not finish"
            finals.append(final)
        return finals


@contextmanager
def live_worker(tiny_model: Any, redis_client: Any, *, worker_id: str = "w-live",
                heartbeat_s: float = 0.25) -> Iterator[LiveWorker]:
    model, tokenizer = tiny_model
    engine = EngineCore(model, tokenizer, EngineConfig())
    engine.start()
    sink = MemorySink()
    config = WorkerConfig(worker_id=worker_id, model_path="tiny", model_name="tiny", lease_s=30, heartbeat_s=heartbeat_s, drain_s=1,
                          redispatch_after_s=30, stream_interval_s=0, prefetch=16)

    def make_host(sink: MemorySink, on_tick: Callable[[], None], on_refused: Any) -> JobHost:
        return JobHost(engine, sink, model_name="tiny", context_length=4096, on_tick=on_tick, tick_s=0.05,
                       on_refused=on_refused)

    service = EngineWorkerService(config=config, make_host=make_host, sink=sink, redis_client=redis_client,
                                  dispatch=lambda job_id: None)
    service.start()
    try:
        yield LiveWorker(engine, service, sink, tokenizer)
    finally:
        service.shutdown()
        engine.stop()
        engine.close()


def wait_until(condition: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")
