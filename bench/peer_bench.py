"""This service's OpenAI endpoint against the servers users would run instead, in one run.

Servers (one at a time, loopback only, the same model folder and the same streaming client):

* ``ours``: this tree's service (daphne + one engine worker, SQLite, a local Redis), and with
  ``--old [NAME=]DIR`` (repeatable) the same service from another checkout, server NAME (default
  ``old``): an A/B of a change;
* ``ourspg``: this tree's service on PostgreSQL (``--postgres``), as docker-compose.yml deploys it;
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
cost of the job path itself (row ``max_tokens`` 1). The clients run in ``--client-processes``
processes (4), so that no one process's event loop sets the pace (docs/benchmarks.md).
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
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import httpx
from closed_loop import chat_messages, closed_loop, load_row, new_record
from peer_servers import ROOT, EngineLoop, MlxLmServer, OurService, Server, VllmMlx, available
from process_cpu import CpuSnapshot
from process_memory import MemorySampler, device_used_bytes

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
            if job is not None and os.environ.get("TTFT_PROBE"):  # bench/probes (TTFT_PROBE): the client's times
                with open(f"{os.environ['TTFT_PROBE']}.client.jsonl", "a") as out:
                    out.write(json.dumps({"id": job[0], "sent": started_at, "first_text": job[1]}) + "\n")
    except (httpx.HTTPError, OSError, TimeoutError) as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"[:200]
    return rec


async def load(base: str, model: str, key: str, concurrency: int, max_tokens: int, requests: int,
               first: int = 0) -> tuple[list[dict], float]:
    """``requests`` streamed chat completions (messages ``first`` on), ``concurrency`` at a time
    (closed loop): their records and the wall time."""
    url = f"{base}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(limits=limits, timeout=600) as client:
        async def one(i: int) -> dict:
            body = {"model": model, "messages": chat_messages(first + i), "stream": True, "max_tokens": max_tokens,
                    "temperature": 0.0, "stream_options": {"include_usage": True}}
            return await _one(client, url, headers, body)

        return await closed_loop(concurrency, requests, one)


def _part(base: str, model: str, key: str, concurrency: int, max_tokens: int, requests: int, first: int,
          start_at: float) -> tuple[list[dict], float, float, float]:
    """One client process's share of a level, started at ``start_at`` (``time.time()``): its
    records, when it started and ended, and its CPU seconds (the event loop, and in the bench's own
    process the memory sampler's thread)."""
    time.sleep(max(0.0, start_at - time.time()))
    started, cpu = time.time(), time.process_time()
    records, _ = asyncio.run(load(base, model, key, concurrency, max_tokens, requests, first))
    return records, started, time.time(), time.process_time() - cpu


def load_in(pool: ProcessPoolExecutor | None, processes: int, base: str, model: str, key: str,
            concurrency: int, max_tokens: int, requests: int) -> dict:
    """A level from ``processes`` client processes (``pool``), each with its share of the clients
    and requests, all started at once; in this process when ``pool`` is None. ``client_cpu`` is the
    client's CPU cores over the level (near 1.0 in one process: the client, not the server, sets
    the pace), summed over the processes, and ``client_cpu_max`` the busiest process's."""
    if pool is None:
        parts = [_part(base, model, key, concurrency, max_tokens, requests, 0, 0.0)]
    else:
        n = min(processes, concurrency)
        shares = [concurrency // n + (i < concurrency % n) for i in range(n)]
        starts = [sum(shares[:i]) * requests // concurrency for i in range(n + 1)]
        start_at = time.time() + 0.2
        futures = [pool.submit(_part, base, model, key, shares[i], max_tokens, starts[i + 1] - starts[i], starts[i],
                               start_at) for i in range(n)]
        parts = [f.result() for f in futures]
    wall = max(p[2] for p in parts) - min(p[1] for p in parts)
    row = {**load_row([r for p in parts for r in p[0]], wall), "client_cpu": round(sum(p[3] for p in parts) / wall, 2)}
    if pool is not None:
        row["client_cpu_max"] = round(max(p[3] / (p[2] - p[1]) for p in parts), 2)
    return row


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
            return load_in(args.pool, args.client_processes, base, model, key, c, max_tokens, requests)
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
            since, cpu, calls, wall = dt.datetime.now(dt.UTC), CpuSnapshot(server.proc.pid), server.redis_calls(), time.perf_counter()
            row = {"concurrency": c, "max_tokens": max_tokens, **run(c, max_tokens, requests)}
            wall = time.perf_counter() - wall
            row["server_cpu"] = CpuSnapshot(server.proc.pid).since(cpu, wall)
            row["redis_per_token"] = per_token(calls, server.redis_calls(), row["tok_s"] * wall)
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


def per_token(before: dict[str, int], after: dict[str, int], tokens: float) -> dict[str, float]:
    """Redis commands per completion token over a level, by command and in all (empty without Redis)."""
    if not after or tokens <= 0:
        return {}
    calls = {name: n - before.get(name, 0) for name, n in after.items() if n > before.get(name, 0)}
    found = {name: round(n / tokens, 3) for name, n in sorted(calls.items(), key=lambda kv: -kv[1])[:5]}
    return {**found, "all": round(sum(calls.values()) / tokens, 3)}


def _line(label: str, row: dict) -> str:
    line = (f"  {label:>10} C={row['concurrency']:<4} max_tokens={row['max_tokens']:<4} tok/s={row['tok_s']:<8} "
            f"req/s={row['req_s']:<7} ttft p50={row['ttft_p50_ms']} p95={row['ttft_p95_ms']} "
            f"stream p50={row['stream_p50_ms']} errors={row['errors']} client cpu={row.get('client_cpu')}"
            f"{' (max ' + str(row['client_cpu_max']) + ')' if 'client_cpu_max' in row else ''} "
            f"peak={row['peak_memory_bytes'] / 1e9:.2f} GB (device {row['device_peak_bytes'] / 1e9:.2f} GB) "
            f"{row['error_samples'] or ''}")
    if "claim_p50_ms" in row:
        line += (f" (claim p50={row['claim_p50_ms']}, claim to token p50={row['claim_to_token_p50_ms']}, "
                 f"token to final p50={row['token_to_final_p50_ms']})")
    if row.get("engine_memory"):
        line += f" engine memory {row['engine_memory']}"
    if row.get("server_cpu"):
        line += f"\n{'':>14}cpu cores {row['server_cpu']['cores']}, busiest thread {row['server_cpu']['busiest_thread']}"
    if row.get("redis_per_token"):
        line += f"\n{'':>14}redis commands per token {row['redis_per_token']}"
    for process, n in sorted(row.get("peak_processes", {}).items(), key=lambda kv: -kv[1])[:6]:
        line += f"\n{'':>14}{n / 1e9:6.2f} GB  {process}"
    return line


def make_server(name: str, batch: int, args: argparse.Namespace, work: Path) -> Server:
    if name == "ours":
        return OurService(f"ours_b{batch}", work, ROOT, args.model, batch, 8100)
    if name == "ourspg":
        return OurService(f"ourspg_b{batch}", work, ROOT, args.model, batch, 8104, postgres=args.postgres)
    if name.startswith("ours-w") and name[6:].isdigit():  # ours with that many daphne processes
        return OurService(f"{name}_b{batch}", work, ROOT, args.model, batch, 8105, web_processes=int(name[6:]))
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
                         "claim_to_token_p50_ms", "token_to_final_p50_ms", "ready_s", "client_cpu")}
        rows.append({"server": name, "batch": batch, "concurrency": c, "max_tokens": max_tokens, **med,
                     "runs": len(runs), "errors": sum(r["errors"] for r in runs),
                     "tok_s_runs": [r["tok_s"] for r in runs], "ttft_p50_ms_runs": [r["ttft_p50_ms"] for r in runs],
                     "peak_memory_gb": round(max(r["peak_memory_bytes"] for r in runs) / 1e9, 2),
                     "device_peak_gb": round(max(r["device_peak_bytes"] for r in runs) / 1e9, 2),
                     "memory_kind": runs[0]["memory_kind"]})
    return rows


# The servers whose ratios to every other server are reported: this service, on SQLite and on PostgreSQL.
SUBJECTS = ("ours", "ourspg")


def ratios(rows: list[dict]) -> dict[str, float]:
    by = {(r["server"], r["batch"], r["concurrency"], r["max_tokens"]): r for r in rows}
    out = {}
    for subject in SUBJECTS:
        for (name, batch, c, max_tokens), row in by.items():
            ours = by.get((subject, batch, c, max_tokens))
            if name in SUBJECTS[:SUBJECTS.index(subject) + 1] or not ours:
                continue
            key = f"{subject}_over_{name}"
            if max_tokens == 1:
                if ours["req_s"] and row["req_s"]:
                    out[f"{key}_one_token_req_s_b{batch}_c{c}"] = round(ours["req_s"] / row["req_s"], 3)
                continue
            if ours.get("ready_s") and row.get("ready_s"):
                out[f"{key}_ready_s_b{batch}"] = round(ours["ready_s"] / row["ready_s"], 3)
            if row["peak_memory_gb"] and ours["peak_memory_gb"]:
                out[f"{key}_peak_memory_b{batch}_c{c}"] = round(ours["peak_memory_gb"] / row["peak_memory_gb"], 3)
            if row["device_peak_gb"] and ours["device_peak_gb"]:
                out[f"{key}_device_peak_b{batch}_c{c}"] = round(ours["device_peak_gb"] / row["device_peak_gb"], 3)
            if ours["tok_s"] and row["tok_s"]:
                out[f"{key}_tok_s_b{batch}_c{c}"] = round(ours["tok_s"] / row["tok_s"], 3)
                if ours["ttft_p50_ms"] is not None and row["ttft_p50_ms"] is not None:
                    out[f"{subject}_minus_{name}_ttft_p50_ms_b{batch}_c{c}"] = round(
                        ours["ttft_p50_ms"] - row["ttft_p50_ms"], 1)
                    if row["ttft_p50_ms"]:
                        out[f"{key}_ttft_p50_b{batch}_c{c}"] = round(ours["ttft_p50_ms"] / row["ttft_p50_ms"], 3)
    return out


def print_ratios(rows: list[dict]) -> None:
    """Per level, ours (and ourspg) / each other server: tok/s and TTFT p50 (one-token levels: requests/s)."""
    found = ratios(rows)
    for subject in SUBJECTS:
        for row in sorted(rows, key=lambda r: (r["batch"], -r["max_tokens"], r["concurrency"], r["server"])):
            name, batch, c = row["server"], row["batch"], row["concurrency"]
            key, head = f"{subject}_over_{name}", f"  {subject} / {name:<8} batch {batch} C={c:<4}"
            if row["max_tokens"] == 1:
                if (req_s := found.get(f"{key}_one_token_req_s_b{batch}_c{c}")) is not None:
                    print(f"{head} one-token req/s {req_s}", flush=True)
            elif (tok_s := found.get(f"{key}_tok_s_b{batch}_c{c}")) is not None:
                ttft = found.get(f"{key}_ttft_p50_b{batch}_c{c}")
                minus = found.get(f"{subject}_minus_{name}_ttft_p50_ms_b{batch}_c{c}")
                print(f"{head} tok/s {tok_s:<6} TTFT p50 {ttft} ({minus:+} ms)" if minus is not None
                      else f"{head} tok/s {tok_s}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="an mlx-lm model folder")
    parser.add_argument("--servers", default="ours,vllm,mlxlm",
                        help="ours, ourspg (ours on PostgreSQL), ours-wN (ours with N web processes), engine, vllm, "
                             "mlxlm, and the names of --old checkouts")
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
    parser.add_argument("--postgres", default=os.environ.get("PEER_POSTGRES", "postgresql://postgres@127.0.0.1:5432"),
                        help="server ``ourspg``'s PostgreSQL server (it creates database peer_<label> there)")
    parser.add_argument("--client-processes", type=int, default=4, metavar="N",
                        help="run the clients of each level in N processes (a level's clients and requests "
                             "shared out), so that one process's event loop does not set the pace; 1: in "
                             "this process")
    parser.add_argument("--out", default=None, help="folder for the servers' logs and the JSON result")
    args = parser.parse_args()
    args.pool = (ProcessPoolExecutor(args.client_processes, mp_context=get_context("spawn"))
                 if args.client_processes > 1 else None)
    args.trees = {}
    for item in args.old:
        name, _, tree = item.rpartition("=")
        args.trees[name or "old"] = Path(tree).resolve()
    work = Path(args.out or tempfile.mkdtemp(prefix="peer-bench-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    levels = [int(c) for c in args.concurrency.split(",")]
    servers = [s for s in args.servers.split(",") if s]
    skipped = [s for s in servers if not available(s)]
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
