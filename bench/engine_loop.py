"""The in-process engine under bench/peer_bench.py's load: its server ``engine``.

The engine is built as the engine worker builds it (``engine_worker.runtime.engine_process.serve``):
``load_model`` on the model folder, ``EngineCore(model, tokenizer, EngineConfig.from_env())``, so
the completion batch (``ENGINE_COMPLETION_BATCH_SIZE``, set by peer_bench), the scheduling policy,
the prefix cache and every other ``ENGINE_*`` setting are the service's. Each request is the one
the service would run for peer_bench's chat completion: the same messages through the web side's
chat template (``PromptTokenizer.encode_messages``), the same ``JobSpec`` turned into an engine
request by the worker's ``spec_to_request`` (temperature 0, ``max_tokens``). The closed loop and
the row are :mod:`closed_loop`'s, as for the HTTP servers. TTFT is the submit to the first token
out of the engine; prompts are tokenized before a level starts.

peer_bench runs this as a process of its own (its memory is then measured as a server's, and
mlx is never imported by the bench's own process). The protocol, one JSON object a line:

* stdout: ``{"ready": true}`` once the engine runs, then one row (``load_row``'s fields) per run;
* stdin: one run per line, ``{"concurrency": C, "max_tokens": N, "requests": R}``; end of input
  stops the engine and the process.

Anything else the libraries print goes to stderr.

    python bench/engine_loop.py --model var/models/tiny
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]  # closed_loop, and the repository's packages

from closed_loop import chat_messages, closed_loop, load_row, new_record  # noqa: E402
from cuda_memory import cuda_memory  # noqa: E402


async def engine_load(engine: Any, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict:
    """``len(prompts)`` requests to ``engine``, ``concurrency`` at a time (closed loop); the row."""
    from engine_worker.protocol import JobSpec
    from engine_worker.runtime.convert import spec_to_request

    async def one(i: int) -> dict:
        rec = new_record()
        request = spec_to_request(JobSpec(job_id="", prompt_token_ids=tuple(prompts[i]), max_tokens=max_tokens,
                                          temperature=0.0))
        start = time.perf_counter()
        rid = await engine.add_request(request.prompt, request.sampling_params,
                                       priority=request.priority)
        async for out in engine.stream_outputs(rid):
            if rec["ttft"] is None and out.new_token_ids:
                rec["ttft"] = time.perf_counter() - start
            if out.finished:
                rec["tokens"], rec["error"] = len(out.output_token_ids), out.error
        if rec["ttft"] is not None:
            rec["stream"] = time.perf_counter() - start - rec["ttft"]
        rec["ok"] = rec["error"] is None and rec["ttft"] is not None
        if rec["ttft"] is None and rec["error"] is None:
            rec["error"] = "no token"
        return rec

    records, wall = await closed_loop(concurrency, len(prompts), one)
    return load_row(records, wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="an mlx-lm model folder")
    args = parser.parse_args()
    # The protocol gets stdout's file; whatever mlx, transformers or a C library print goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    from api.serving.tokenization import PromptTokenizer
    from engine_worker.common.config import EngineConfig
    from engine_worker.engine.core import EngineCore
    from engine_worker.runner.loader import load_model

    model, tokenizer = load_model(args.model)
    engine = EngineCore(model, tokenizer, EngineConfig.from_env())
    engine.start()
    chat = PromptTokenizer(args.model)
    protocol.write(json.dumps({"ready": True}) + "\n")
    try:
        for line in sys.stdin:
            run = json.loads(line)
            prompts = [chat.encode_messages(chat_messages(i)) for i in range(run["requests"])]
            row = asyncio.run(engine_load(engine, prompts, run["concurrency"], run["max_tokens"]))
            memory = engine.get_stats().get("memory") or {}
            row["engine_memory"] = {"active_gb": round(memory.get("active_bytes", 0) / 1e9, 2),
                                    "peak_gb": round(memory.get("peak_bytes", 0) / 1e9, 2),
                                    "allocator_cache_gb": round(memory.get("cache_bytes", 0) / 1e9, 2),
                                    "prefix_cache_gb": round(memory.get("prefix_cache_bytes", 0) / 1e9, 2),
                                    # the CUDA pools, beyond mlx's accounting, since start
                                    **cuda_memory()}
            protocol.write(json.dumps(row) + "\n")
    finally:
        engine.stop()
        engine.close()
    # As the engine process does: leave without the interpreter's teardown of mlx's and
    # OpenBLAS's native threads, which can abort a process at exit.
    os._exit(0)


if __name__ == "__main__":
    main()
