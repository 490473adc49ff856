"""A finished batch's output and error files, built from its jobs' rows (the database is the
truth: building them again gives the same files), in OpenAI's line format:

``{"id": "batch_req_…", "custom_id": "…", "response": {"status_code", "request_id", "body"}, "error": null}``

A completed job's body is exactly what the online endpoint answers for it
(api/openai_api/responses.py). A job that failed or was cancelled on its own has the online
endpoint's error response; a line that never ran because the batch was cancelled or expired has
``response`` null and ``error`` ``batch_cancelled`` / ``batch_expired``, as OpenAI's.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any

from api.batches.lines import BATCH_ENDPOINTS
from api.batches.models import Batch, BatchStatus
from api.common.errors import error_body
from api.jobs.logprobs import chat_logprobs, job_logprobs, text_logprobs
from api.models import Job, JobStatus
from api.openai_api.requests import Kind
from api.openai_api.responses import completion_body, ending_error
from api.streaming.messages import final_from_job

_BATCH_ENDED = {
    BatchStatus.CANCELLED: ("batch_cancelled", "This request was not run: the batch was cancelled."),
    BatchStatus.EXPIRED: ("batch_expired", "This request could not be run before the batch's completion window ended."),
}


@dataclass
class OutputFile:
    """A file being written to disk, line by line."""

    handle: IO[bytes]
    lines: int = 0
    size: int = 0

    def write(self, line: dict[str, Any]) -> None:
        data = (json.dumps(line, ensure_ascii=False) + "\n").encode()
        self.handle.write(data)
        self.lines += 1
        self.size += len(data)


def batch_output_lines(*, batch: Batch, outcome: BatchStatus) -> tuple[OutputFile, OutputFile]:
    """The batch's (output, error) files, written to temporary files (rewound, closed by the
    caller): each job once, in the order of the input file. ``outcome``: how the batch ends."""
    output = OutputFile(tempfile.TemporaryFile())
    errors = OutputFile(tempfile.TemporaryFile())
    kind = BATCH_ENDPOINTS[batch.endpoint]
    for job in _jobs(batch):
        line, ok = job_output_line(job, kind=kind, model=batch.model, outcome=outcome)
        (output if ok else errors).write(line)
    for file in (output, errors):
        file.handle.seek(0)
    return output, errors


def _jobs(batch: Batch) -> Iterable[Job]:
    # Created in the input's order, one per line (api/batches/services.py).
    return Job.objects.filter(batch=batch).order_by("created_at", "custom_id").iterator(chunk_size=500)


def job_output_line(job: Job, *, kind: Kind, model: str, outcome: BatchStatus) -> tuple[dict[str, Any], bool]:
    """The line of one job, and whether it belongs to the output file (else the error file)."""
    line: dict[str, Any] = {"id": f"batch_req_{job.id.hex}", "custom_id": job.custom_id, "response": None,
                            "error": None}
    if job.status == JobStatus.COMPLETED:
        line["response"] = {"status_code": 200, "request_id": str(job.id), "body": _completion(job, kind, model)}
        return line, True
    if outcome in _BATCH_ENDED and job.status in (JobStatus.CANCELLED, JobStatus.EXPIRED):
        code, message = _BATCH_ENDED[outcome]
        line["error"] = {"code": code, "message": message}
        return line, False
    error = ending_error(final_from_job(job))
    assert error is not None  # not completed
    line["response"] = {"status_code": error.status_code, "request_id": str(job.id),
                        "body": error_body(error.message, error_type=error.error_type, code=error.code,
                                           param=error.param)}
    return line, False


def _completion(job: Job, kind: Kind, model: str) -> dict[str, Any]:
    logprobs = None
    if job.params.get("logprobs") is not None:
        entries = job_logprobs(job.logprobs or []) or []  # a list for a list
        logprobs = chat_logprobs(entries) if kind is Kind.CHAT else text_logprobs(entries, text=job.output_text)
    return completion_body(kind=kind, job_id=str(job.id), created=int(job.created_at.timestamp()), model=model,
                           text=job.output_text, final=final_from_job(job), logprobs=logprobs)
