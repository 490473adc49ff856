"""This service's OpenAI endpoint against the servers users would run instead, in one run.

Servers (one at a time, loopback only, the same model folder and the same streaming client):

* ``ours``: this tree's service (daphne + one engine worker, SQLite, a local Redis), and with
  ``--old [NAME=]DIR`` (repeatable) the same service from another checkout, server NAME (default
  ``old``): an A/B of a change;
* ``vllm``: ``vllm-mlx serve --continuous-batching`` (the seed's own server);
* ``mlxlm``: ``mlx_lm.server``;
* ``engine``: no server: this tree's engine in a process of its own (bench/engine_loop.py), built
  as the engine worker builds it (the same completion batch, policy and prefix cache), given the
  same chat messages through the same chat template and the same closed loop; TTFT is submit to
  the first token out of the engine. ``ours / engine`` is then the cost of the service's job path
  (HTTP, database, broker, worker, streaming) under the same load.

For each completion batch size, servers are started in turn and each runs every concurrency level
(a closed loop of C clients, each sending its next streamed chat completion when the previous one
ended), ``--rounds`` times with the servers interleaved; the figures are the medians over rounds.
Reported per server, batch and concurrency: completion tok/s, requests/s, TTFT p50/p95, errors, and
the peak memory of the level (GPU memory from nvidia-smi, sampled every half second, when there is
a GPU: the server's processes, and the whole device's use above what it was before the server
started; else RSS), and per server start its time to ready. With ``--one-token C`` (default 128)
each server also answers ``--one-token-requests`` (4) x C requests of one token at C clients: the
cost of the job path itself (row ``max_tokens`` 1).
Then one line per level of ``ours / peer``: tok/s and TTFT p50 (requests/s for one token). The last
line is one JSON object with every row and the ratios ``ours / peer`` (and ``new / old``).

    python bench/peer_bench.py --model var/models/tiny --servers ours,engine,mlxlm --concurrency 1,8 --batch 32
    # GPU host: bash bench/h200_peer.sh (installs the carried wheels, builds the 316M model, runs this)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from closed_loop import chat_messages, closed_loop, load_row, new_record

ROOT = Path(__file__).resolve().parents[1]


# -- the client ----------------------------------------------------------------------------------

async def _one(client: httpx.AsyncClient, url: str, headers: dict, body: dict) -> dict:
    rec = new_record()
    start, started_at, job = time.perf_counter(), time.time(), None
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                rec["error"] = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return rec
            chunks = 0
            async for line in resp.aiter_lines():
                if not line.startswith("data:") or (data := line[5:].strip()) == "[DONE]":
                    continue
                event = json.loads(data)
                if event.get("error"):
                    rec["error"] = str(event["error"])[:200]
                if event.get("usage"):
                    rec["tokens"] = event["usage"].get("completion_tokens") or 0
                for choice in event.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        chunks += 1
                        if rec["ttft"] is None:
                            rec["ttft"], job = time.perf_counter() - start, (event.get("id"), time.time())
            rec["tokens"] = rec["tokens"] or chunks
            if rec["ttft"] is not None:
                rec["stream"] = time.perf_counter() - start - rec["ttft"]
            rec["ok"] = rec["error"] is None and rec["ttft"] is not None
            if rec["ttft"] is None and rec["error"] is None:
                rec["error"] = "no content"
            if job is not None and os.environ.get("TTFT_PROBE"):  # bench/ttft_probe: the client's times
                with open(f"{os.environ['TTFT_PROBE']}.client.jsonl", "a") as out:
                    out.write(json.dumps({"id": job[0], "sent": started_at, "first_text": job[1]}) + "\n")
    except (httpx.HTTPError, OSError, TimeoutError) as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"[:200]
    return rec


async def load(base: str, model: str, key: str, concurrency: int, max_tokens: int, requests: int) -> dict:
    """``requests`` streamed chat completions, ``concurrency`` at a time (closed loop)."""
    url = f"{base}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(limits=limits, timeout=600) as client:
        async def one(i: int) -> dict:
            body = {"model": model, "messages": chat_messages(i), "stream": True, "max_tokens": max_tokens,
                    "temperature": 0.0, "stream_options": {"include_usage": True}}
            return await _one(client, url, headers, body)

        records, wall = await closed_loop(concurrency, requests, one)
    return load_row(records, wall)


# -- memory of a process tree --------------------------------------------------------------------

class MemorySampler:
    """Peak memory of a process and its descendants: GPU memory (nvidia-smi) where there is a
    GPU, else resident memory. Sampled every half second on a thread. ``level_processes``: each
    process's share at the level's peak (its command line, shortened: which process holds what)."""

    def __init__(self, pid: int, device_idle: int = 0) -> None:
        self.pid = pid
        self.peak_bytes = self.level_bytes = self.device_bytes = 0
        self.level_processes: dict[str, int] = {}
        self.device_idle = device_idle  # the device's use before the server started
        self.kind = "gpu" if shutil.which("nvidia-smi") else "rss"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak_bytes

    def level(self) -> tuple[int, int, dict[str, int]]:
        """``(processes, device above idle, per process)`` peak bytes since the last call; starts the
        next level."""
        found = self.level_bytes, self.device_bytes, self.level_processes
        self.level_bytes = self.device_bytes = 0
        self.level_processes = {}
        return found

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            pids = _tree(self.pid)
            each = _gpu_bytes(pids) if self.kind == "gpu" else {p: _rss_bytes(p) for p in pids}
            used = sum(each.values())
            self.peak_bytes = max(self.peak_bytes, used)
            if used > self.level_bytes:
                self.level_bytes = used
                self.level_processes = {f"{pid} {_command(pid)}": n for pid, n in each.items() if n}
            if self.kind == "gpu":  # nvidia-smi in a container may not see the processes' pids
                self.device_bytes = max(self.device_bytes, device_used_bytes() - self.device_idle)


def _tree(pid: int) -> set[int]:
    found, todo = {pid}, [pid]
    while todo:
        try:
            children = Path(f"/proc/{todo.pop()}/task").iterdir()
            for task in children:
                for child in (task / "children").read_text().split():
                    if int(child) not in found:
                        found.add(int(child))
                        todo.append(int(child))
        except OSError:
            continue
    return found


def _gpu_bytes(pids: set[int]) -> dict[int, int]:
    """GPU bytes of each of ``pids`` that nvidia-smi lists."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    found: dict[int, int] = {}
    for line in out.splitlines():
        pid, _, mib = line.partition(",")
        if pid.strip().isdigit() and int(pid) in pids:
            found[int(pid)] = found.get(int(pid), 0) + int(mib.strip() or 0) * 1024 * 1024
    return found


def _command(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    return " ".join(a.decode(errors="replace") for a in argv if a)[:120]


def device_used_bytes() -> int:
    """The GPU's memory in use (the first GPU), 0 without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout.split()
    return int(out[0]) * 1024 * 1024 if out and out[0].isdigit() else 0


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# -- the servers ---------------------------------------------------------------------------------

class Server:
    """One server process group; ``start`` returns (base url, model name, api key)."""

    def __init__(self, label: str, work: Path) -> None:
        self.label = label
        self.log = (work / f"{label}.log").open("ab")
        self.proc: subprocess.Popen | None = None

    def _spawn(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def stop(self) -> None:
        """SIGTERM to the whole process group, SIGKILL after 60 s; returns once no process of the
        group is left, so that the next server finds its port and the GPU free."""
        if self.proc is None:
            return
        for sig, seconds in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                self.proc.poll()  # reap the leader, or the group stays alive as a zombie
                try:
                    os.killpg(self.proc.pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.2)

    def phases(self, since: dt.datetime, until: dt.datetime) -> dict:
        """Where the time to first token went, for servers that record it (ours)."""
        return {}

    def wait_ready(self, base: str, key: str = "") -> str:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.label} exited; see its log")
            try:
                r = httpx.get(f"{base}/v1/models", headers=headers, timeout=2)
                data = r.json().get("data") if r.status_code == 200 else None
                # This service lists a model with no live worker too, as unavailable: wait for one.
                if data and data[0].get("available", True):
                    return data[0]["id"]
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.label} did not become ready")


class OurService(Server):
    """The service from ``tree`` (this checkout, or an older one for an A/B), started as
    ``make run`` starts it, on a SQLite database of its own and a flushed Redis DB."""

    def __init__(self, label: str, work: Path, tree: Path, model: str, batch: int, port: int) -> None:
        super().__init__(label, work)
        self.tree, self.port = tree, port
        self.env = {**os.environ, **engine_blas_env(), "DATABASE_URL": f"sqlite:///{work}/{label}.sqlite3", "MODEL_PATH": model,
                    "REDIS_URL": os.environ.get("PEER_REDIS_URL", "redis://127.0.0.1:6379/11"),
                    "ENGINE_COMPLETION_BATCH_SIZE": str(batch), "LOG_LEVEL": "WARNING",
                    "DEFAULT_KEY_REQUESTS_PER_MINUTE": "1000000", "DEFAULT_KEY_MAX_CONCURRENT_JOBS": "100000"}

    def start(self) -> tuple[str, str, str]:
        import redis

        redis.Redis.from_url(self.env["REDIS_URL"]).flushdb()
        # As scripts/run.sh does: the web and the worker load while the database is migrated (the
        # worker takes no job before the migrations are in: WAIT_FOR_MIGRATIONS). `wait -n`: the shell
        # exits when either does, so wait_ready sees a failed start at once.
        web = os.environ.get("PEER_WEB_PROCESSES", "4")
        script = (f"{sys.executable} -m inference_service.serve_web -b 127.0.0.1 -p {self.port} --processes {web} & "
                  f"WAIT_FOR_MIGRATIONS=300 {sys.executable} manage.py run_engine_worker --loglevel WARNING & wait -n")
        self._spawn(["bash", "-c", script], self.tree, self.env)
        manage = [sys.executable, "manage.py"]
        subprocess.run([*manage, "migrate", "--noinput"], cwd=self.tree, env=self.env, check=True, capture_output=True)
        key = subprocess.run([*manage, "create_api_user", f"peer{os.getpid()}", "--quiet"], cwd=self.tree,
                             env=self.env, check=True, capture_output=True, text=True).stdout.split()[-1]
        base = f"http://127.0.0.1:{self.port}"
        return base, self.wait_ready(base, key), key


    def engine_memory(self) -> dict:
        """Where the worker's device memory is, from its last heartbeat: mlx's live arrays, its
        allocator cache and its limit, and the prefix cache's bytes and entries."""
        import redis

        client = redis.Redis.from_url(self.env["REDIS_URL"])
        for name in client.scan_iter("engine:workers:*"):
            beat = json.loads(client.get(name) or b"{}")
            memory, cache = beat.get("memory") or {}, beat.get("cache") or {}
            return {"active_gb": round(memory.get("active_bytes", 0) / 1e9, 2),
                    "peak_gb": round(memory.get("peak_bytes", 0) / 1e9, 2),
                    "allocator_cache_gb": round(memory.get("cache_bytes", 0) / 1e9, 2),
                    "prefix_cache_gb": round(float(cache.get("bytes_used") or 0) / 1e9, 2),
                    "prefix_cache_entries": cache.get("entries")}
        return {}

    def phases(self, since: dt.datetime, until: dt.datetime) -> dict:
        """Medians over the jobs submitted in [since, until): queued -> claimed by the worker, and
        claimed -> first token (the rest of the TTFT is the web side: request, insert, stream)."""
        import sqlite3

        with sqlite3.connect(self.env["DATABASE_URL"].removeprefix("sqlite:///")) as db:
            rows = db.execute("SELECT queued_at, started_at, first_token_at, finished_at FROM api_job "
                              "WHERE started_at IS NOT NULL AND first_token_at IS NOT NULL "
                              "AND finished_at IS NOT NULL").fetchall()
        stamps = [[dt.datetime.fromisoformat(v).replace(tzinfo=dt.UTC) for v in row] for row in rows]
        stamps = [s for s in stamps if since <= s[0] < until]
        if not stamps:
            return {}
        return {"claim_p50_ms": round(1000 * statistics.median((s[1] - s[0]).total_seconds() for s in stamps), 1),
                "claim_to_token_p50_ms": round(1000 * statistics.median((s[2] - s[1]).total_seconds()
                                                                        for s in stamps), 1),
                "token_to_final_p50_ms": round(1000 * statistics.median((s[3] - s[2]).total_seconds()
                                                                        for s in stamps), 1)}


class VllmMlx(Server):
    def __init__(self, label: str, work: Path, model: str, batch: int, port: int) -> None:
        super().__init__(label, work)
        self.model, self.batch, self.port = model, batch, port

    def start(self) -> tuple[str, str, str]:
        code = "import sys; from vllm_mlx.cli import main; sys.argv[0] = 'vllm-mlx'; main()"
        self._spawn([sys.executable, "-c", code, "serve", self.model, "--served-model-name", "m", "--host",
                     "127.0.0.1", "--port", str(self.port), "--continuous-batching", "--completion-batch-size",
                     str(self.batch)], ROOT, _offline_env())
        base = f"http://127.0.0.1:{self.port}"
        return base, self.wait_ready(base), ""


class MlxLmServer(Server):
    def __init__(self, label: str, work: Path, model: str, batch: int, port: int) -> None:
        super().__init__(label, work)
        self.model, self.batch, self.port = model, batch, port

    def start(self) -> tuple[str, str, str]:
        self._spawn([sys.executable, "-m", "mlx_lm.server", "--model", self.model, "--host", "127.0.0.1", "--port",
                     str(self.port), "--decode-concurrency", str(self.batch)], ROOT, _offline_env())
        base = f"http://127.0.0.1:{self.port}"
        self.wait_ready(base)
        return base, "default_model", ""


class EngineLoop(Server):
    """Server ``engine``: the service's engine in process, under the same load (bench/engine_loop.py,
    a process of its own). Not an HTTP server: :meth:`run` stands for :func:`load`."""

    def __init__(self, label: str, work: Path, model: str, batch: int) -> None:
        super().__init__(label, work)
        self.model, self.batch = model, batch

    def start(self) -> None:
        # The worker's engine settings: the completion batch as OurService sets it, the policy
        # inference_service/settings.py defaults to (the worker exports it to its engine).
        env = {**os.environ, **engine_blas_env(), "ENGINE_COMPLETION_BATCH_SIZE": str(self.batch),
               "ENGINE_POLICY": os.environ.get("ENGINE_POLICY", "priority")}
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "engine_loop.py"), "--model", self.model],
                                     cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, start_new_session=True)
        if self._read() != {"ready": True}:
            raise RuntimeError(f"{self.label} did not become ready")

    def run(self, concurrency: int, max_tokens: int, requests: int) -> dict:
        """``requests`` requests, ``concurrency`` at a time (closed loop): :func:`load`'s row."""
        assert self.proc is not None and self.proc.stdin is not None
        run = {"concurrency": concurrency, "max_tokens": max_tokens, "requests": requests}
        self.proc.stdin.write(json.dumps(run) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def stop(self) -> None:
        if self.proc is not None and self.proc.stdin is not None and self.proc.poll() is None:
            self.proc.stdin.close()  # the end of its input: it stops its engine and exits
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        super().stop()

    def _read(self) -> dict:
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.label} exited; see its log")
        return json.loads(line)


def engine_blas_env() -> dict[str, str]:
    """OpenBLAS's threads for an engine process, as scripts/run.sh sets them for its one worker:
    on a machine of at most 4 cores one core is left to the other processes (the web's, the
    client's). Without it, on 2 cores, OpenBLAS's spinning threads and the service's other
    processes share both cores and the service's decode steps wait for theirs: ours / engine 0.83
    to 0.86 tok/s at C=1 on the tiny model, 1.00 with it. Both ``ours`` and ``engine`` get it; an
    OPENBLAS_NUM_THREADS already set wins. No effect on a GPU, where the model uses no BLAS."""
    if "OPENBLAS_NUM_THREADS" in os.environ:
        return {}
    cores = os.cpu_count() or 2
    return {"OPENBLAS_NUM_THREADS": str(max(1, cores - 1) if cores <= 4 else cores)}


def _offline_env() -> dict[str, str]:
    cache = Path(tempfile.gettempdir()) / "peer-hf"
    (cache / "hub").mkdir(parents=True, exist_ok=True)  # mlx_lm.server's /v1/models needs it
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(cache), "HF_HUB_CACHE": str(cache / "hub")}


def _available(name: str) -> bool:
    module = {"vllm": "vllm_mlx", "mlxlm": "mlx_lm"}.get(name)
    if module is None:
        return True
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


# -- the run -------------------------------------------------------------------------------------

def measure(server: Server, levels: list[int], args: argparse.Namespace) -> list[dict]:
    idle = device_used_bytes()
    started = time.perf_counter()
    try:
        connection = server.start()
    except BaseException:
        server.stop()
        raise
    if isinstance(server, EngineLoop):
        run = server.run
    else:
        base, model, key = connection

        def run(c: int, max_tokens: int, requests: int) -> dict:
            return asyncio.run(load(base, model, key, c, max_tokens, requests))
    ready_s = round(time.perf_counter() - started, 2)
    print(f"  {server.label:>10} ready in {ready_s} s", flush=True)
    sampler = MemorySampler(server.proc.pid, idle)
    runs = [(c, args.max_tokens, c * args.requests_per_client) for c in levels]
    if args.one_token:
        runs.append((args.one_token, 1, args.one_token * args.one_token_requests))
    rows = []
    try:
        run(max(4, min(levels)), args.max_tokens, 8)  # warm: kernels, caches
        for c, max_tokens, requests in runs:
            sampler.level()
            since = dt.datetime.now(dt.UTC)
            row = {"concurrency": c, "max_tokens": max_tokens, **run(c, max_tokens, requests)}
            row.update(server.phases(since, dt.datetime.now(dt.UTC)))
            row["peak_memory_bytes"], row["device_peak_bytes"], row["peak_processes"] = sampler.level()
            row["memory_kind"], row["ready_s"] = sampler.kind, ready_s
            if isinstance(server, OurService):
                row["engine_memory"] = server.engine_memory()
            rows.append(row)
            print(_line(server.label, row), flush=True)
    finally:
        sampler.stop()
        server.stop()
    return rows


def _line(label: str, row: dict) -> str:
    line = (f"  {label:>10} C={row['concurrency']:<4} max_tokens={row['max_tokens']:<4} tok/s={row['tok_s']:<8} "
            f"req/s={row['req_s']:<7} ttft p50={row['ttft_p50_ms']} p95={row['ttft_p95_ms']} "
            f"stream p50={row['stream_p50_ms']} errors={row['errors']} "
            f"peak={row['peak_memory_bytes'] / 1e9:.2f} GB (device {row['device_peak_bytes'] / 1e9:.2f} GB) "
            f"{row['error_samples'] or ''}")
    if "claim_p50_ms" in row:
        line += (f" (claim p50={row['claim_p50_ms']}, claim to token p50={row['claim_to_token_p50_ms']}, "
                 f"token to final p50={row['token_to_final_p50_ms']})")
    if row.get("engine_memory"):
        line += f" engine memory {row['engine_memory']}"
    for process, n in sorted(row.get("peak_processes", {}).items(), key=lambda kv: -kv[1])[:6]:
        line += f"\n{'':>14}{n / 1e9:6.2f} GB  {process}"
    return line


def make_server(name: str, batch: int, args: argparse.Namespace, work: Path) -> Server:
    if name == "ours":
        return OurService(f"ours_b{batch}", work, ROOT, args.model, batch, 8100)
    if name in args.trees:
        return OurService(f"{name}_b{batch}", work, args.trees[name], args.model, batch, 8103)
    if name == "engine":
        return EngineLoop(f"engine_b{batch}", work, args.model, batch)
    if name == "vllm":
        return VllmMlx(f"vllm_b{batch}", work, args.model, batch, 8101)
    return MlxLmServer(f"mlxlm_b{batch}", work, args.model, batch, 8102)


def summarize(samples: dict[tuple[str, int, int, int], list[dict]]) -> list[dict]:
    rows = []
    for (name, batch, c, max_tokens), runs in sorted(samples.items()):
        med = {k: statistics.median(r[k] for r in runs if r.get(k) is not None)
               if any(r.get(k) is not None for r in runs) else None
               for k in ("tok_s", "req_s", "ttft_p50_ms", "ttft_p95_ms", "stream_p50_ms", "claim_p50_ms",
                         "claim_to_token_p50_ms", "token_to_final_p50_ms", "ready_s")}
        rows.append({"server": name, "batch": batch, "concurrency": c, "max_tokens": max_tokens, **med,
                     "runs": len(runs), "errors": sum(r["errors"] for r in runs),
                     "tok_s_runs": [r["tok_s"] for r in runs], "ttft_p50_ms_runs": [r["ttft_p50_ms"] for r in runs],
                     "peak_memory_gb": round(max(r["peak_memory_bytes"] for r in runs) / 1e9, 2),
                     "device_peak_gb": round(max(r["device_peak_bytes"] for r in runs) / 1e9, 2),
                     "memory_kind": runs[0]["memory_kind"]})
    return rows


def ratios(rows: list[dict]) -> dict[str, float]:
    by = {(r["server"], r["batch"], r["concurrency"], r["max_tokens"]): r for r in rows}
    out = {}
    for (name, batch, c, max_tokens), row in by.items():
        if name == "ours":
            continue
        ours = by.get(("ours", batch, c, max_tokens))
        if ours and max_tokens == 1 and ours["req_s"] and row["req_s"]:
            out[f"ours_over_{name}_one_token_req_s_b{batch}_c{c}"] = round(ours["req_s"] / row["req_s"], 3)
            continue
        if ours and ours.get("ready_s") and row.get("ready_s"):
            out[f"ours_over_{name}_ready_s_b{batch}"] = round(ours["ready_s"] / row["ready_s"], 3)
        if ours and row["peak_memory_gb"] and ours["peak_memory_gb"]:
            out[f"ours_over_{name}_peak_memory_b{batch}_c{c}"] = round(ours["peak_memory_gb"] / row["peak_memory_gb"], 3)
        if ours and row["device_peak_gb"] and ours["device_peak_gb"]:
            out[f"ours_over_{name}_device_peak_b{batch}_c{c}"] = round(ours["device_peak_gb"] / row["device_peak_gb"], 3)
        if ours and ours["tok_s"] and row["tok_s"]:
            out[f"ours_over_{name}_tok_s_b{batch}_c{c}"] = round(ours["tok_s"] / row["tok_s"], 3)
            if ours["ttft_p50_ms"] is not None and row["ttft_p50_ms"] is not None:
                out[f"ours_minus_{name}_ttft_p50_ms_b{batch}_c{c}"] = round(ours["ttft_p50_ms"] - row["ttft_p50_ms"], 1)
                if row["ttft_p50_ms"]:
                    out[f"ours_over_{name}_ttft_p50_b{batch}_c{c}"] = round(ours["ttft_p50_ms"] / row["ttft_p50_ms"], 3)
    return out


def print_ratios(rows: list[dict]) -> None:
    """Per level, ours / each other server: tok/s and TTFT p50 (one-token levels: requests/s)."""
    found = ratios(rows)
    for row in sorted(rows, key=lambda r: (r["batch"], -r["max_tokens"], r["concurrency"], r["server"])):
        name, batch, c = row["server"], row["batch"], row["concurrency"]
        if row["max_tokens"] == 1:
            if (req_s := found.get(f"ours_over_{name}_one_token_req_s_b{batch}_c{c}")) is not None:
                print(f"  ours / {name:<8} batch {batch} C={c:<4} one-token req/s {req_s}", flush=True)
        elif (tok_s := found.get(f"ours_over_{name}_tok_s_b{batch}_c{c}")) is not None:
            ttft = found.get(f"ours_over_{name}_ttft_p50_b{batch}_c{c}")
            minus = found.get(f"ours_minus_{name}_ttft_p50_ms_b{batch}_c{c}")
            print(f"  ours / {name:<8} batch {batch} C={c:<4} tok/s {tok_s:<6} TTFT p50 {ttft} ({minus:+} ms)"
                  if minus is not None else f"  ours / {name:<8} batch {batch} C={c:<4} tok/s {tok_s}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="an mlx-lm model folder")
    parser.add_argument("--servers", default="ours,vllm,mlxlm",
                        help="ours, engine, vllm, mlxlm, and the names of --old checkouts")
    parser.add_argument("--old", action="append", default=[], metavar="[NAME=]DIR",
                        help="another checkout of this project, for an A/B (server NAME, default 'old'); repeatable")
    parser.add_argument("--concurrency", default="1,32,128")
    parser.add_argument("--batch", default="32,128", help="completion batch sizes")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="repeats, the servers interleaved")
    parser.add_argument("--one-token", type=int, default=128, metavar="C",
                        help="also C clients of one-token requests (0: none)")
    parser.add_argument("--one-token-requests", type=int, default=4, help="one-token requests per client")
    parser.add_argument("--out", default=None, help="folder for the servers' logs and the JSON result")
    args = parser.parse_args()
    args.trees = {}
    for item in args.old:
        name, _, tree = item.rpartition("=")
        args.trees[name or "old"] = Path(tree).resolve()
    work = Path(args.out or tempfile.mkdtemp(prefix="peer-bench-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    levels = [int(c) for c in args.concurrency.split(",")]
    servers = [s for s in args.servers.split(",") if s]
    skipped = [s for s in servers if not _available(s)]
    servers = [s for s in servers if s not in skipped]
    samples: dict[tuple[str, int, int, int], list[dict]] = {}
    result = _result(samples, args, skipped)
    for round_ in range(args.rounds):
        for batch in (int(b) for b in args.batch.split(",")):
            for name in servers if round_ % 2 == 0 else list(reversed(servers)):
                print(f"round {round_ + 1}, batch {batch}: {name}", flush=True)
                try:
                    server = make_server(name, batch, args, work)
                    rows = measure(server, levels, args)
                except RuntimeError as exc:
                    print(f"  {name} failed: {exc}", flush=True)
                    continue
                for row in rows:
                    samples.setdefault((name, batch, row["concurrency"], row["max_tokens"]), []).append(row)
                result = _result(samples, args, skipped)
                (work / "peer_bench.json").write_text(json.dumps(result, indent=1))  # so far, if cut short
    print_ratios(result["rows"])
    print(json.dumps(result))


def _result(samples: dict[tuple[str, int, int, int], list[dict]], args: argparse.Namespace, skipped: list[str]) -> dict:
    rows = summarize(samples)
    return {"model": args.model, "max_tokens": args.max_tokens, "rounds": args.rounds, "skipped": skipped,
            "rows": rows, "ratios": ratios(rows)}


if __name__ == "__main__":
    main()
