"""On the embedded default database (SQLite), the finals' statement says which jobs named a
webhook, and their deliveries are recorded with the finals, as on PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import json, time
from django.contrib.auth.models import User
from api.models import Job
from api.jobs.services import outputs
from api.keys.services import api_key_create
from api.webhooks.models import WebhookDelivery
from engine_worker.protocol import FinalResult

user = User.objects.create(username="sqlite")
key, _ = api_key_create(owner=user)
jobs = [Job.objects.create(owner=user, api_key=key, status="in_progress", worker_id="w", prompt="x",
                           prompt_token_ids=[1], params={"max_tokens": 1}, webhook_url=url)
        for url in ("http://93.184.216.34/a", "")]
finals = [FinalResult(job_id=str(j.id), text="t", finish_reason="stop", prompt_tokens=1, completion_tokens=1,
                      finished_at=time.time(), last_seq=1) for j in jobs]
written = outputs.jobs_complete(results=finals, worker_id="w")
again = outputs.jobs_complete(results=finals, worker_id="w")
print(json.dumps({"written": sorted(written) == sorted(str(j.id) for j in jobs), "again": again,
                  "deliveries": [[str(d.job_id), d.event_type] for d in WebhookDelivery.objects.all()],
                  "hooked": str(jobs[0].id)}))
"""


def test_finals_record_the_webhooks_of_their_jobs_on_sqlite(migrated_sqlite_url, tiny_model_path):
    env = {**os.environ, "DATABASE_URL": migrated_sqlite_url, "MODEL_PATH": str(tiny_model_path),
           "DJANGO_SETTINGS_MODULE": "inference_service.settings", "REDIS_URL": "redis://127.0.0.1:1/15"}
    env.pop("TEST_DATABASE_NAME", None)
    run = lambda *args: subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,  # noqa: E731
                                       capture_output=True, text=True, timeout=120)
    out = run("shell", "-c", SCRIPT)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["written"] is True and result["again"] == []
    assert result["deliveries"] == [[result["hooked"], "job.completed"]]
