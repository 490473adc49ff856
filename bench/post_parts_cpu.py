"""CPU of the parts of one ``POST /api/v1/jobs``, in this process (diagnostics of the web tier).

    python bench/post_parts_cpu.py [--calls 300]

Times each part of a submission on this thread (``time.thread_time``, ms per call): the key
lookup, the request serializer, tokenization, the rate limit, the INSERT with the quota gate, all
of ``job_create``, and the whole request through Django and DRF (the test client: middleware,
DRF's dispatch, authentication, the view, the response). What the whole costs beyond its parts is
the frameworks' share. ``bench/web_post_cpu.py`` gives the same request's CPU through daphne. Work
done on other threads is not counted: the tokenizer's Rust pool. Not the issue's benchmark. Uses the service benchmark's databases (BENCH_DATABASE_URL,
default PostgreSQL's ``service_bench``; BENCH_REDIS_URL, default redis://127.0.0.1:6379/11).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import django_with_bench_key, dump_json_line, ensure_default_model, environment  # noqa: E402
from web_post_cpu import PROMPT  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", default=None, help="also append the final JSON line to this file")
    args = parser.parse_args()

    os.environ["REDIS_URL"] = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
    os.environ["MODEL_PATH"] = str(ensure_default_model(os.environ.get("MODEL_PATH")).resolve())
    owner, api_key, secret = django_with_bench_key("post_parts_cpu")
    from django.db import transaction
    from rest_framework.test import APIClient

    from api.authentication import authenticate_api_key
    from api.models import SAMPLING_DEFAULTS, Job
    from api.serializers import JobCreateSerializer
    from api.services.jobs import JobRequest, _tokenize, job_create
    from api.services.quotas import quota_consume_request, quota_gate

    body = {"prompt": PROMPT, "max_tokens": 64, "temperature": 0.0}

    def validate() -> JobCreateSerializer:
        serializer = JobCreateSerializer(data=body)
        serializer.is_valid(raise_exception=True)
        return serializer

    request = JobRequest.from_validated(validate().validated_data)
    token_ids = _tokenize(request)[0]

    def new_job() -> Job:  # what job_create builds before its INSERT
        return Job(owner=owner, api_key=api_key, prompt=request.prompt, prompt_token_ids=token_ids,
                   params={**SAMPLING_DEFAULTS, "max_tokens": 64}, priority=api_key.priority,
                   request_fingerprint=request.fingerprint(), dispatch_count=1)

    def insert_with_quota_gate() -> None:  # job_create's transaction
        with transaction.atomic():
            job = new_job()
            job.save(force_insert=True)
            quota_gate(api_key_id=api_key.id, prompt_tokens=len(token_ids), max_tokens=64, now=job.created_at)

    client = APIClient(SERVER_NAME="127.0.0.1")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert client.post("/api/v1/jobs", body, format="json").status_code == 202
    parts: dict[str, Callable[[], object]] = {
        "authenticate": lambda: authenticate_api_key(secret),
        "validate": validate,
        "tokenize": lambda: _tokenize(request),
        "rate_limit": lambda: quota_consume_request(api_key=api_key),
        "insert_with_quota_gate": insert_with_quota_gate,
        "job_create": lambda: job_create(owner=owner, api_key=api_key, request=request),
        "whole_request_django_drf": lambda: client.post("/api/v1/jobs", body, format="json"),
    }
    cpu_ms = {}
    try:
        for name, part in parts.items():
            for _ in range(20):
                part()
            started = time.thread_time()
            for _ in range(args.calls):
                part()
            cpu_ms[name] = round(1000 * (time.thread_time() - started) / args.calls, 4)
            Job.objects.filter(owner=owner).delete()
    finally:
        owner.delete()
    for name, ms in cpu_ms.items():
        print(f"{name:26} {ms:.3f} ms")
    dump_json_line({"bench": "post_parts_cpu", "calls": args.calls, "cpu_ms_per_call": cpu_ms, "env": environment()},
                   args.out)


if __name__ == "__main__":
    main()
