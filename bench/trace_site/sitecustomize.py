"""Diagnostic timeline of an engine worker (bench only): put this folder first on PYTHONPATH and
set WORKER_TRACE_DIR; a process running ``run_engine_worker`` then appends one JSON line per event
to WORKER_TRACE_DIR/worker-<pid>.jsonl (wall-clock ``t``): Celery hand-overs, admission batches,
claims, engine submits, engine steps (commands taken, outputs) and the I/O thread's publishes;
steps, admissions and publishes also carry the CPU time their thread spent in them (``cpu_ms``).
Read it with ``python bench/worker_timeline.py DIR``. service_bench.py itself logs only its
in-process engine's steps, to bench-<pid>.jsonl (``worker_timeline.py DIR --steps`` compares them).
A daphne process of inference_service.serve_web logs one ``post`` line per POST /api/v1/jobs to
web-<pid>.jsonl: when its connection was made, its ASGI app created, a request thread took it, and
when authentication, tokenization, the rate limit, the INSERT and the Celery publish ended (read
it with ``python bench/web_timeline.py DIR``). Other processes are left alone."""

import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
import time

_DIR = os.environ.get("WORKER_TRACE_DIR")


def _install(prefix: str, only: tuple[str, ...] | None = None, skip: tuple[str, ...] = ()) -> None:
    """Trace into <prefix>-<pid>.jsonl; ``only``: the modules to patch (default: all of them but
    ``skip``)."""
    out = open(os.path.join(_DIR, f"{prefix}-{os.getpid()}.jsonl"), "a", buffering=1)
    lock = threading.Lock()

    def emit(kind: str, **fields) -> None:
        line = json.dumps({"t": time.time(), "k": kind, "th": threading.current_thread().name, **fields})
        with lock:
            out.write(line + "\n")

    def patch_worker(mod) -> None:
        cls = mod.EngineWorkerService
        admit, admit_batch = cls.admit, cls._admit_batch

        def traced_admit(self, job_id):
            emit("handover", job=job_id)
            return admit(self, job_id)

        def traced_admit_batch(self, job_ids, **kw):  # woken=True: the database's notice
            emit("admit_start", n=len(job_ids), **kw)
            cpu = time.thread_time()
            try:
                return admit_batch(self, job_ids, **kw)
            finally:
                emit("admit_end", n=len(job_ids), cpu_ms=round(1000 * (time.thread_time() - cpu), 2))

        cls.admit, cls._admit_batch = traced_admit, traced_admit_batch

    def patch_lifecycle(mod) -> None:
        claim = mod.jobs_claim

        def traced_claim(**kw):
            jobs = claim(**kw)
            emit("claimed", n=len(jobs), asked=len(kw.get("job_ids", ())), ahead=kw.get("ahead"))
            return jobs

        mod.jobs_claim = traced_claim

    def patch_host(mod) -> None:
        submit = mod.JobHost.submit

        def traced_submit(self, spec):
            ok = submit(self, spec)
            emit("submit", job=spec.job_id, prompt=len(spec.prompt_token_ids))
            return ok

        mod.JobHost.submit = traced_submit

    parts_on = bool(os.environ.get("WORKER_TRACE_PARTS"))

    # WORKER_TRACE_PARTS=1: each step event also carries ``parts``, the ms spent in the step's
    # pieces (mlx-lm's BatchGenerator stages, the scheduler's own), inclusive where they nest.
    step_parts = threading.local()

    def timed(cls, name: str, label: str) -> None:
        func = getattr(cls, name)

        def wrapper(*args, **kw):
            parts = getattr(step_parts, "d", None)
            if parts is None:
                return func(*args, **kw)
            t = time.perf_counter()
            try:
                return func(*args, **kw)
            finally:
                parts[label] = parts.get(label, 0.0) + 1000 * (time.perf_counter() - t)

        setattr(cls, name, wrapper)

    def patch_mlx_generate(mod) -> None:
        if not parts_on:
            return
        for cls, name, label in ((mod.BatchGenerator, "_make_batch", "make_batch"),
                                 (mod.PromptProcessingBatch, "extend", "prompt_extend"),
                                 (mod.PromptProcessingBatch, "split", "split"),
                                 (mod.PromptProcessingBatch, "generate", "generate"),
                                 (mod.PromptProcessingBatch, "prompt", "prompt"),
                                 (mod.GenerationBatch, "next", "decode"),
                                 (mod.GenerationBatch, "extend", "gen_extend"),
                                 (mod.GenerationBatch, "filter", "gen_filter")):
            timed(cls, name, label)

    def patch_scheduler(mod) -> None:
        if not parts_on:
            return
        for name, label in (("add_request", "add"), ("_schedule_waiting", "schedule"), ("_insert", "insert"),
                            ("_process_responses", "responses"), ("_finish", "finish")):
            timed(mod.Scheduler, name, label)

    def patch_engine(mod) -> None:
        step = mod.EngineCore._step

        def traced_step(self, commands):
            t0, cpu = time.time(), time.thread_time()
            if parts_on:
                step_parts.d = {}
            outputs = step(self, commands)
            parts, step_parts.d = getattr(step_parts, "d", None), None
            running = len(getattr(self.scheduler, "running", ()) or ())
            extra = {"parts": {k: round(v, 2) for k, v in parts.items()}} if parts else {}
            emit("step", t0=t0, cpu_ms=round(1000 * (time.thread_time() - cpu), 2), cmds=len(commands), outs=len(outputs),
                 running=running, **extra)
            return outputs

        mod.EngineCore._step = traced_step

    def patch_io(mod) -> None:
        publish = mod.IOThread._publish

        def traced_publish(self, batch):
            t0, cpu = time.time(), time.thread_time()
            publish(self, batch)
            emit("publish", t0=t0, cpu_ms=round(1000 * (time.thread_time() - cpu), 2), first=len(batch.first_tokens), chunks=len(batch.chunks),
                 finals=len(batch.finals), started=len(batch.started))

        mod.IOThread._publish = traced_publish

    def patch_sink(mod) -> None:
        """The output process: each batch's publish, with the time of each of its parts (ms)."""
        cls = mod.RedisJobSink
        parts_of = {"_reset_streams": "reset", "_write_finals": "finals_db", "_write_streams": "streams",
                    "_fan_out": "fan_out", "_write_bookkeeping": "bookkeeping"}
        current: dict[str, float] = {}

        def timed(name, label):
            func = getattr(cls, name)

            def traced(self, *args, **kw):
                t = time.perf_counter()
                try:
                    return func(self, *args, **kw)
                finally:
                    current[label] = round(1000 * (time.perf_counter() - t), 3)

            setattr(cls, name, traced)

        for name, label in parts_of.items():
            timed(name, label)
        publish = cls.publish

        def traced_publish(self, batch):
            current.clear()
            t0 = time.time()
            publish(self, batch)
            emit("sink", t0=t0, chunks=len(batch.chunks), finals=len(batch.finals), first=len(batch.first_tokens),
                 started=len(batch.started), parts=dict(current))

        cls.publish = traced_publish

    marks = threading.local()  # web: this request thread's timestamps, reset per request

    def mark_end(mod, name: str, label: str) -> None:
        func = getattr(mod, name)

        def traced(*args, **kw):
            try:
                return func(*args, **kw)
            finally:
                d = getattr(marks, "d", {})
                d[label] = time.time()
                d[label + "_cpu"] = time.thread_time()

        setattr(mod, name, traced)

    def patch_daphne_server(mod) -> None:
        create = mod.Server.create_application

        def traced_create(self, protocol, scope):
            scope["_trace"] = {"made": getattr(getattr(protocol, "channel", None), "_trace_made", None), "app": time.time()}
            return create(self, protocol, scope)

        mod.Server.create_application = traced_create

    def patch_twisted_http(mod) -> None:
        made = mod.HTTPChannel.connectionMade

        def traced_made(self):
            self._trace_made = time.time()
            return made(self)

        mod.HTTPChannel.connectionMade = traced_made

    def patch_views(mod) -> None:
        post = mod.JobListCreateView.post

        def traced_post(self, request):
            marks.d = {**getattr(request._request, "scope", {}).get("_trace", {}), "view": time.time(),
                       "view_cpu": time.thread_time()}
            response = post(self, request)
            d = getattr(marks, "d", {})
            emit("post", job=str(response.data.get("id")), end=time.time(), **d)
            return response

        mod.JobListCreateView.post = traced_post

    def patch_jobs(mod) -> None:
        for name, label in (("_tokenize", "tokenized"), ("quota_consume_request", "rate"),
                            ("quota_gate", "inserted"), ("job_dispatch", "published")):
            mark_end(mod, name, label)

    def patch_auth(mod) -> None:
        mark_end(mod, "authenticate_api_key", "authed")

    patches = {
        "daphne.server": patch_daphne_server,
        "twisted.web.http": patch_twisted_http,
        "api.views.jobs": patch_views,
        "api.services.jobs": patch_jobs,
        "api.authentication": patch_auth,
        "api.streaming.worker": patch_worker,
        "api.services.job_lifecycle": patch_lifecycle,
        "engine_worker.runtime.host": patch_host,
        "engine_worker.engine_core": patch_engine,
        "engine_worker.scheduler": patch_scheduler,
        "mlx_lm.generate": patch_mlx_generate,
        "engine_worker.runtime.io_thread": patch_io,
        "api.streaming.sink": patch_sink,
    }

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in patches or name in skip or (only is not None and name not in only):
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None:
                return None
            exec_module = spec.loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                patches[name](module)

            spec.loader.exec_module = exec_and_patch
            return spec

    sys.meta_path.insert(0, Finder())


# The worker gets every patch; service_bench.py (its in-process engine side) only the engine's
# steps, to compare step lengths with the worker's in the same run.
_WEB = ("daphne.server", "twisted.web.http", "api.views.jobs",
        "api.services.jobs", "api.authentication")
if _DIR and "run_engine_worker" in sys.argv:
    _install("worker", skip=_WEB)
elif _DIR and sys.argv[:1] == ["-m"] and "--worker-id" in sys.argv:
    _install("sink", ("api.streaming.sink",))  # the worker's output process (api.streaming.sink_process)
elif _DIR and "inference_service.asgi:application" in sys.argv:
    _install("web", _WEB)  # a daphne process of inference_service.serve_web
elif _DIR and any(arg.endswith("service_bench.py") for arg in sys.argv):
    _install("bench", ("engine_worker.engine_core", "engine_worker.scheduler", "mlx_lm.generate"))
