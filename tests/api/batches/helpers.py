"""Building batch input files and running a batch's steps in a unit test (no engine)."""

from __future__ import annotations

import json
from typing import Any

from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from api.models import Job, JobStatus


def chat_line(custom_id: str, content: str = "Hello", **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 8, **body}}


def jsonl(lines: list[Any]) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


def upload(lines: list[Any], name: str = "input.jsonl") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, jsonl(lines), content_type="application/jsonl")


def finish(job: Job, *, text: str = "done", status: JobStatus = JobStatus.COMPLETED, error: str | None = None) -> None:
    """End a job as a worker's final would."""
    Job.objects.filter(id=job.id).update(
        status=status, output_text=text, finish_reason="stop" if status == JobStatus.COMPLETED else "error",
        error=error, prompt_tokens=len(job.prompt_token_ids), completion_tokens=3, finished_at=timezone.now())
