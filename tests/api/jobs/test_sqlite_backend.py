"""The embedded default database (SQLite, what ``make run`` uses) runs the raw SQL of the quota gate
and the worker's claim correctly. The rest of the suite runs on PostgreSQL, so this runs a real
submission sequence in a subprocess with ``DATABASE_URL`` pointing at a fresh SQLite file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import json
from django.contrib.auth.models import User
from django.utils import timezone
from api.common.errors import QuotaExceeded
from api.jobs.selectors import job_queue_position
from api.keys.services import api_key_create
from api.jobs.services.submission import JobRequest, job_create
from api.keys.quotas import quota_key_usage
from api.keys.authentication import authenticate_api_key
from api.models import ApiKey
from django.forms.models import model_to_dict

user = User.objects.create(username="sqlite")
key, secret = api_key_create(owner=user, max_concurrent_jobs=3, tokens_per_day=10**6)
submissions = [job_create(owner=user, api_key=key, request=JobRequest(prompt="hello world", max_tokens=7))
               for _ in range(3)]
jobs = [s.job for s in submissions]
from api.models import Job
try:
    job_create(owner=user, api_key=key, request=JobRequest(prompt="hello world", max_tokens=7))
    refused = None
except QuotaExceeded as exc:
    refused = exc.code
usage = quota_key_usage(api_key=key, now=timezone.now())
active, tokens = usage.active_jobs, usage.tokens_used
positions = [job_queue_position(job=job) for job in jobs]
from api.jobs.services import claim as claims
from api.jobs.services import outputs
claimed = [claims.job_claim(job_id=str(jobs[0].id), worker_id="w", lease_s=30)]
claim_same = model_to_dict(claimed[0]) == model_to_dict(Job.objects.get(id=jobs[0].id)) and \
    claimed[0].started_at == Job.objects.get(id=jobs[0].id).started_at is not None
written = outputs.jobs_record_progress(worker_id="w", progress=[
    outputs.Progress(job_id=str(j.id), text="so far", last_seq=2, completion_tokens=3, first_token_at=1_800_000_000.5)
    for j in jobs])
jobs[0].refresh_from_db()
found, orm = authenticate_api_key(secret), ApiKey.objects.select_related("owner").get(id=key.id)
from api.keys.authentication import authenticate_api_key_for_job
other = User.objects.create(username="other")
foreign = Job.objects.create(owner=other, status="completed", prompt="x", prompt_token_ids=[1], params={"max_tokens": 1})
owns = [authenticate_api_key_for_job(secret, str(j.id))[1] for j in (jobs[0], foreign)]
# SQLite before 3.35 has no RETURNING: the claim falls back to the ORM.
from django.db import connection
connection.features.can_return_columns_from_insert = False
key.max_concurrent_jobs = 10; key.save()
old = [job_create(owner=user, api_key=key, request=JobRequest(prompt="hi", max_tokens=7)) for _ in range(2)]
fallback = [[s.queue_position for s in old],
            [str(claims.job_claim(job_id=str(s.job.id), worker_id="w", lease_s=30).id) for s in old]
            == [str(s.job.id) for s in old]]
Job.objects.filter(id__in=[j.id for j in jobs[1:]]).update(dispatch_count=1)
extra = Job.objects.create(owner=user, status="queued", prompt="x", prompt_token_ids=[1], params={"max_tokens": 1},
                           model=jobs[1].model, dispatch_count=1)
batch = [str(j.id) for j in claims.jobs_claim(job_id=str(jobs[2].id), worker_id="w2", lease_s=30, model=jobs[1].model,
                                              limit=2)]
batch_claim = batch == [str(jobs[2].id), str(jobs[1].id)] and Job.objects.get(id=extra.id).status == "queued"
print(json.dumps({
    "positions": positions, "insert_positions": [s.queue_position for s in submissions],
    "claim_same": claim_same, "fallback": fallback, "batch_claim": batch_claim,
    "active": active, "tokens": tokens, "prompt_len": len(jobs[0].prompt_token_ids), "refused": refused,
    "progress": [written, jobs[0].output_text, jobs[0].last_seq, jobs[0].completion_tokens,
                 jobs[0].first_token_at.timestamp()],
    "owns": owns,
    "auth_same": model_to_dict(found) == model_to_dict(orm) and found.created_at == orm.created_at
                 and timezone.is_aware(found.created_at) and found.owner.date_joined == orm.owner.date_joined,
}))
"""


def test_quota_usage_and_queue_position_on_sqlite(migrated_sqlite_url, tiny_model_path):
    env = {**os.environ, "DATABASE_URL": migrated_sqlite_url, "MODEL_PATH": str(tiny_model_path),
           "DJANGO_SETTINGS_MODULE": "inference_service.settings"}
    env.pop("TEST_DATABASE_NAME", None)
    run = lambda *args: subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,  # noqa: E731
                                       capture_output=True, text=True, timeout=120)
    out = run("shell", "-c", SCRIPT)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # Positions count only the jobs ahead (a text/datetime mismatch made a job count itself).
    assert result["positions"] == [0, 1, 2]
    assert result["insert_positions"] == [0, 1, 2]  # the 202's positions agree
    assert result["claim_same"] is True
    assert result["batch_claim"] is True  # the batch claim: the named job, then the queue, up to the limit  # the claim's UPDATE ... RETURNING rows, converted as the ORM does
    # Without RETURNING: positions behind the two jobs still queued, and both jobs claimed.
    assert result["fallback"] == [[2, 3], True]
    assert result["active"] == 3
    assert result["tokens"] == 3 * (result["prompt_len"] + 7)
    assert result["refused"] == "concurrent_jobs_exceeded"
    assert result["progress"] == [1, "so far", 2, 3, 1_800_000_000.5]  # only the job this worker holds
    assert result["auth_same"] is True
    assert result["owns"] == [True, False]  # a job's WebSocket: the key and the job's owner in one statement
