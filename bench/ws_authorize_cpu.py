"""CPU of a job WebSocket's authorization: the key and whether the job is its owner's.

    python bench/ws_authorize_cpu.py [--calls 500] [--rounds 5]

Every ``/ws/v1/jobs/<id>/`` connect runs it in the web process, while the burst's other
submissions wait for that process's GIL. Compares, alternately in one run, the consumer's earlier
path (``authenticate_api_key`` then the ORM's ``Job.objects.filter(...).exists()``: two queries,
one compiled per call) against ``authenticate_api_key_for_job`` (one prepared statement), and
prints the CPU per call of each (``time.thread_time``), medians over the rounds, and their ratio.
Diagnostics for the web tier (docs/benchmarks.md); not the issue's benchmark. Uses the service
benchmark's database (BENCH_DATABASE_URL, default PostgreSQL's ``service_bench``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import dump_json_line, environment  # noqa: E402
from service_bench import _postgres_bench_db  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500, help="calls per side and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None, help="also append the final JSON line to this file")
    args = parser.parse_args()

    os.environ["DATABASE_URL"] = os.environ.get("BENCH_DATABASE_URL") or _postgres_bench_db()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inference_service.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from api.authentication import authenticate_api_key, authenticate_api_key_for_job
    from api.models import Job
    from api.services.api_keys import api_key_create

    call_command("migrate", verbosity=0)
    owner = get_user_model().objects.create(username=f"ws-authorize-{uuid.uuid4().hex[:8]}")
    api_key, secret = api_key_create(owner=owner, name="ws_authorize_cpu")
    job_id = str(Job.objects.create(owner=owner, api_key=api_key, prompt="x", prompt_token_ids=[1, 2],
                                    params={"max_tokens": 4}).id)

    def two_queries() -> bool:  # what JobStreamConsumer did before
        key = authenticate_api_key(secret)
        return Job.objects.filter(id=job_id, owner_id=key.owner_id).exists()

    def one_statement() -> bool:
        return authenticate_api_key_for_job(secret, job_id)[1]

    sides = {"two_queries": two_queries, "one_statement": one_statement}
    cpu_ms: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for fn in sides.values():
            assert fn() is True
            for _ in range(50):  # warm: connections, the statements' first compile
                fn()
        for _ in range(args.rounds):
            for name, fn in sides.items():
                started = time.thread_time()
                for _ in range(args.calls):
                    fn()
                cpu_ms[name].append(1000 * (time.thread_time() - started) / args.calls)
    finally:
        owner.delete()  # its key and job with it
    medians = {name: statistics.median(values) for name, values in cpu_ms.items()}
    result = {
        "bench": "ws_authorize_cpu",
        "calls": args.calls,
        "rounds": args.rounds,
        "cpu_ms_per_call": {name: [round(v, 4) for v in values] for name, values in cpu_ms.items()},
        "cpu_ms_per_call_p50": {name: round(v, 4) for name, v in medians.items()},
        "one_over_two": round(medians["one_statement"] / medians["two_queries"], 3),
        "env": environment(),
    }
    print(f"CPU per authorization: two queries {medians['two_queries']:.3f} ms, one statement "
          f"{medians['one_statement']:.3f} ms (ratio {result['one_over_two']})")
    dump_json_line(result, args.out)


if __name__ == "__main__":
    main()
