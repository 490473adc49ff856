"""Per-token cost of the engine itself, without the model: EngineCore over a scripted generator.

The real ``BatchGenerator`` is replaced (through the scheduler's ``runner_factory`` seam) by a
runner that answers every ``step()`` at once with one token for each running request, so all the
time measured is the engine's own Python: scheduler bookkeeping, detokenizing, building outputs,
handing them to the asyncio loop, and the consumers' wake-ups (the bench's ``stream_outputs``
loop, as in engine_bench.py). On a GPU, where a decode step of a 300M model costs only a few ms,
this is what decides ``engine_over_raw``.

    python bench/engine_overhead.py [--concurrency 32,256] [--max-tokens 128] [--repeats 3]

The LAST printed line is one JSON object: per level, µs of engine time per generated token and
ms per step (one token for every request), and the µs per token of ``Scheduler.step`` alone
(driven on one thread, no asyncio): the rest is the hand-off to asyncio and the consumers.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_bench as eb  # noqa: E402  (imports engine_worker first: BLAS before mlx)
from common import dump_json_line, ensure_default_model, environment, load_model, make_prompts, median  # noqa: E402

from engine_worker.generator import StepResult  # noqa: E402


class _Resp:
    __slots__ = ("uid", "token", "finish_reason", "prompt_cache", "all_tokens", "logprobs")

    def __init__(self, uid, token, finish_reason):
        self.uid = uid
        self.token = token
        self.finish_reason = finish_reason
        self.prompt_cache = None
        self.all_tokens = None
        self.logprobs = None


class ScriptedRunner:
    """Generator stand-in: each step gives every live request one token, no model work. Paced like
    mlx-lm's: a request's prompt ends in its first step, and its tokens come from the next."""

    def __init__(self, model, config):
        self._next_uid = 0
        self._live = {}  # uid -> [produced, max_tokens]
        self._prompting = []  # inserted, prompt not ended yet
        self._vocab = 2000

    def insert(self, tokens, *, max_tokens, cache=None, all_tokens=None, sampler=None,
               logits_processors=None, stop_sequences=None):
        uid = self._next_uid
        self._next_uid += 1
        self._live[uid] = [0, max_tokens]
        self._prompting.append(uid)
        return uid

    def step(self):
        out = []
        done = []
        prompts_done, self._prompting = self._prompting, []
        fresh = set(prompts_done)
        for uid, st in self._live.items():
            if uid in fresh:
                continue
            st[0] += 1
            reason = "length" if st[0] >= st[1] else None
            out.append(_Resp(uid, 100 + (uid * 7 + st[0] * 13) % self._vocab, reason))
            if reason:
                done.append(uid)
        for uid in done:
            del self._live[uid]
        return StepResult(out, prompts_done)

    def remove(self, uids, return_caches=False):
        for uid in uids:
            self._live.pop(uid, None)
            if uid in self._prompting:
                self._prompting.remove(uid)
        return {}

    def close(self):
        self._live.clear()


def scheduler_only(model, tokenizer, prompts, max_tokens, repeats):
    """µs per token of ``Scheduler.step`` alone (one thread, no asyncio, no dispatch)."""
    from engine_worker.config import SchedulerConfig
    from engine_worker.request import Request, SamplingParams
    from engine_worker.scheduler import Scheduler

    c = len(prompts)
    times = []
    for rep in range(repeats + 1):
        sched = Scheduler(model, tokenizer, SchedulerConfig(max_num_seqs=max(256, c), completion_batch_size=max(32, c),
                                                            enable_prefix_cache=False),
                          runner_factory=ScriptedRunner)
        for i, p in enumerate(prompts):
            sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
            sched.add_request(Request(f"s{rep}-{i}", p, sp))
        n = 0
        t = time.perf_counter()
        while sched.has_requests():
            out = sched.step()
            n += sum(len(o.new_token_ids) for o in out.outputs)
            for rid in out.finished_request_ids:
                sched.remove_finished_request(rid)
        if rep:  # the first pass is a warm-up
            times.append((time.perf_counter() - t) / n * 1e6)
        sched.close()
    return median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--concurrency", default="32,256")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="also append the final JSON line to this file")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",")]
    model, tokenizer, _ = load_model(ensure_default_model(args.model))
    prompts_all = make_prompts(tokenizer, max(levels))
    classes = eb.import_engine()
    result = {"bench": "engine_overhead", "command": " ".join([Path(sys.executable).name, *sys.argv]),
              "env": environment(), "max_tokens": args.max_tokens, "levels": {}}

    async def run():
        for c in levels:
            engine, _ = eb.make_engine(model, tokenizer, classes, concurrency=c, completion_batch_size=max(32, c),
                                       prefill_batch_size=8, prefill_step_size=2048, prefix_cache=False)
            engine.scheduler._runner_factory = ScriptedRunner  # the seam tests use
            await engine.start()
            await eb.run_engine(engine, classes, prompts_all[:c], 8, f"w{c}")
            runs = []
            for rep in range(args.repeats):
                r = await eb.run_engine(engine, classes, prompts_all[:c], args.max_tokens, f"c{c}r{rep}")
                runs.append(r)
            engine.stop()
            engine.close()
            us = median([r["wall_s"] / r["tokens"] * 1e6 for r in runs])
            us_sched = scheduler_only(model, tokenizer, prompts_all[:c], args.max_tokens, args.repeats)
            result["levels"][str(c)] = {
                "us_per_token": round(us, 2),
                "scheduler_step_us_per_token": round(us_sched, 2),
                "ms_per_step": round(us * c / 1e3, 3),
                "tok_s": round(median([r["tok_s"] for r in runs]), 1),
                "all_tokens_generated": all(r["tokens"] == c * args.max_tokens for r in runs),
            }
            print(f"# c={c}: {us:.2f} us/token, {us * c / 1e3:.3f} ms/step of engine-only work "
                  f"(Scheduler.step alone: {us_sched:.2f} us/token)", flush=True)

    t = time.perf_counter()
    asyncio.run(run())
    result["wall_s"] = round(time.perf_counter() - t, 2)
    dump_json_line(result, args.out)


if __name__ == "__main__":
    main()
