"""Per-job timestamps along the job path, in every process, for a diagnosis: where the time
between a request's arrival and its first token goes.

With ``bench/probes`` first on ``PYTHONPATH`` and an output prefix in ``TTFT_PROBE``, every Python
process started with that environment (peer_bench's servers ``ours`` and ``engine`` inherit it)
then records, for each job, the wall-clock time (``time.time()``: one clock for every process of
the machine) it first passes each of these points, one JSON line per point and batch of jobs
appended to ``<TTFT_PROBE>.<pid>.jsonl`` (``{"point", "at", "jobs"}``):

* ``web_open``: the web's OpenAI consumer had the whole request and began to submit it (``_open``);
* ``submit_start``: ``job_create`` began, on the consumer's database thread (the key is
  authenticated and the body parsed by then); the job's row stamps ``queued`` once it is built;
* ``claimed``: the worker's claim returned the job (``jobs_claim``), parent;
* ``admit_sent``: ``EngineProcess.submit_many`` sends its Admit, parent;
* ``admit_recv``: the engine process takes the Admit off the pipe (``_obey``), child;
* ``engine_submit``: ``EngineCore.submit_many`` queued it for the engine thread;
* ``add_request``: the engine thread applied the Submit (``Scheduler.add_request``);
* ``step_start``: the start of the scheduler step that inserted it into the generator;
* ``inserted``: ``Scheduler._insert`` handed it to the generator;
* ``gen_start``: the start of the generator step that made its first token;
* ``first_token``: the scheduler stamped its first token (after that generator step); the lines of
  ``step_start`` and ``first_token`` carry the engine thread's step number (``step``), so the
  steps between the two are known;
* ``listener``: the engine thread handed the step's outputs to the output listener;
* ``folded``: the I/O thread folded its first token (``FirstToken.at``: the row's first_token_at);
* ``pipe_sent``: the child sent the StepBatch with its first chunk;
* ``parent_recv``: the parent's I/O thread received that batch;
* ``redis``: the parent's sink wrote its first chunk to Redis;
* ``relay``: the web process's relay sent the first chunk to its client.

The engine alone (bench/engine_loop.py) records ``engine_submit`` .. ``listener`` under its own
request ids. bench/ttft_phases.py turns the files (and the service's job rows, and peer_bench's
client times) into a table of phases.

    PYTHONPATH=bench/probes TTFT_PROBE=/tmp/ttft python bench/peer_bench.py --servers ours,engine ...

Methods are wrapped by name once their module is imported (bench/probes/sitecustomize.py):
nothing changes for a process whose environment lacks ``TTFT_PROBE``.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

_lock = threading.Lock()
_seen: set[tuple[str, str]] = set()


def mark(point: str, job_ids: Iterable[str], at: float | None = None, **extra: Any) -> None:
    """Record ``at`` (now by default) for each job that has not passed ``point`` yet: one line
    appended to this process's file at once (an engine process ends with ``os._exit``)."""
    now = time.time() if at is None else at
    with _lock:
        fresh = [job_id for job_id in job_ids if (job_id, point) not in _seen]
        if not fresh:
            return
        _seen.update((job_id, point) for job_id in fresh)
        _out.write(json.dumps({"point": point, "at": now, "jobs": fresh, **extra}) + "\n")
        _out.flush()


def _wrap(cls: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = getattr(cls, name)
    setattr(cls, name, functools.wraps(original)(make(original)))


def _batch_jobs(batch: Any, first_chunk: bool = True) -> list[str]:
    """The jobs of a StepBatch that has their first output: a chunk with text, or a final."""
    jobs = [c.job_id for c in getattr(batch, "chunks", ()) if c.text or not first_chunk]
    return jobs + [f.job_id for f in getattr(batch, "finals", ())]


def _engine_process(module: Any) -> None:
    def submit_many(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, specs: list[Any]) -> Any:
            sent = original(self, specs)
            mark("admit_sent", sent)
            return sent
        return run

    def obey(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(host: Any, message: Any) -> Any:
            if type(message).__name__ == "Admit":
                mark("admit_recv", [spec.job_id for spec in message.jobs])
            return original(host, message)
        return run

    def publish(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, message: Any) -> Any:
            result = original(self, message)
            if type(message).__name__ == "StepBatch":
                mark("pipe_sent", _batch_jobs(message))
            return result
        return run

    def handle(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, message: Any) -> Any:
            if type(message).__name__ == "StepBatch":
                mark("parent_recv", _batch_jobs(message))
            return original(self, message)
        return run

    _wrap(module.EngineProcess, "submit_many", submit_many)
    _wrap(module.EngineProcess, "_handle", handle)
    _wrap(module._ConnectionSink, "publish", publish)
    module._obey = functools.wraps(module._obey)(obey(module._obey))


def _core(module: Any) -> None:
    def submit_many(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, requests: list[Any]) -> Any:
            mark("engine_submit", [r.request_id for r in requests])
            return original(self, requests)
        return run

    def register(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            mark("engine_submit", [request.request_id])
            return original(self, request, *args, **kwargs)
        return run

    def dispatch(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, outputs: list[Any]) -> Any:
            mark("listener", [o.request_id for o in outputs if o.new_token_ids or o.finished])
            return original(self, outputs)
        return run

    _wrap(module.EngineCore, "submit_many", submit_many)
    _wrap(module.EngineCore, "_register", register)
    _wrap(module.EngineCore, "_dispatch", dispatch)


def _scheduler(module: Any) -> None:
    state = threading.local()

    def add_request(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, request: Any) -> Any:
            mark("add_request", [request.request_id])
            return original(self, request)
        return run

    def insert(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, request: Any) -> Any:
            mark("step_start", [request.request_id], getattr(state, "step_start", None),
                 step=getattr(state, "steps", 0))
            inserted = original(self, request)
            mark("inserted", [request.request_id])
            return inserted
        return run

    def step(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            state.step_start = time.time()
            state.steps = getattr(state, "steps", 0) + 1
            out = original(self, *args, **kwargs)
            stamps = {o.request_id: getattr(self.requests.get(o.request_id), "first_token_time", None)
                      for o in out.outputs}
            firsts = [rid for rid, at in stamps.items() if at is not None and at >= state.step_start]
            if firsts:  # the requests whose first token this step made
                mark("gen_start", firsts, getattr(state, "gen_start", None))
                mark("first_token", firsts, stamps[firsts[0]], step=state.steps,
                     running=len(self.running))
            return out
        return run

    def run_generator(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any) -> Any:
            state.gen_start = time.time()
            return original(self)
        return run

    _wrap(module.Scheduler, "add_request", add_request)
    _wrap(module.Scheduler, "_insert", insert)
    _wrap(module.Scheduler, "step", step)
    _wrap(module.Scheduler, "_run_generator", run_generator)


def _coalesce(module: Any) -> None:
    def fold(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            batch = original(self, *args, **kwargs)
            for first in batch.first_tokens:
                mark("folded", [first.job_id], first.at)
            return batch
        return run

    _wrap(module.ChunkCoalescer, "fold", fold)


def _consumer(module: Any) -> None:
    def open_(original: Callable[..., Any]) -> Callable[..., Any]:
        async def run(self: Any) -> Any:
            at = time.time()
            result = await original(self)
            if self._job_id is not None:
                mark("web_open", [self._job_id], at)
            return result
        return run

    _wrap(module.CompletionConsumer, "_open", open_)


def _submission(module: Any) -> None:
    def job_create(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            at = time.time()
            submission = original(*args, **kwargs)
            mark("submit_start", [str(submission.job.id)], at)
            mark("committed", [str(submission.job.id)])  # its row committed, its message sent
            return submission
        return run

    def quota_admission(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            mark("admission", [str(kwargs["job_id"])])  # routed, the rate counted: its transaction next
            return original(*args, **kwargs)
        return run

    def job_dispatch_counted(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            mark("dispatch", [str(kwargs["job_id"])])  # its transaction committed: the broker's send
            return original(*args, **kwargs)
        return run

    module.job_create = functools.wraps(module.job_create)(job_create(module.job_create))
    module.quota_admission = functools.wraps(module.quota_admission)(quota_admission(module.quota_admission))
    module.job_dispatch_counted = functools.wraps(module.job_dispatch_counted)(
        job_dispatch_counted(module.job_dispatch_counted))


def _claim(module: Any) -> None:
    def jobs_claim(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            jobs = original(*args, **kwargs)
            mark("claimed", [str(job.id) for job in jobs])
            return jobs
        return run

    module.jobs_claim = functools.wraps(module.jobs_claim)(jobs_claim(module.jobs_claim))


def _worker_service(module: Any) -> None:
    def admit(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, job_id: str) -> Any:
            if not self.host.holds(job_id):  # not claimed already with another job's message
                mark("received", [job_id])  # the worker's consumer runs its message
            return original(self, job_id)
        return run

    _wrap(module.EngineWorkerService, "admit", admit)


def _sink(module: Any) -> None:
    def write_streams(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, chunks: list[Any], finals: list[Any]) -> Any:
            result = original(self, chunks, finals)
            mark("redis", [c.job_id for c in chunks if c.text] + [f["job_id"] for f in finals])
            return result
        return run

    _wrap(module.RedisJobSink, "_write_streams", write_streams)


def _relay(module: Any) -> None:
    def emit(original: Callable[..., Any]) -> Callable[..., Any]:
        async def run(self: Any, message: dict[str, Any]) -> Any:
            result = await original(self, message)
            if message.get("text"):
                mark("relay", [self.job_id])
            return result
        return run

    _wrap(module.JobStreamRelay, "_emit", emit)


TARGETS: dict[str, Callable[[Any], None]] = {
    "engine_worker.runtime.engine_process": _engine_process,
    "engine_worker.engine.core": _core,
    "engine_worker.sched.scheduler": _scheduler,
    "engine_worker.runtime.coalesce": _coalesce,
    "api.openai_api.consumer": _consumer,
    "api.jobs.services.submission": _submission,
    "api.jobs.services.claim": _claim,
    "api.worker.service": _worker_service,
    "api.worker.sink": _sink,
    "api.streaming.relay": _relay,
}


_out = open(f"{os.environ['TTFT_PROBE']}.{os.getpid()}.jsonl", "a")  # noqa: SIM115 (the process's life)
