"""The messages of a job's stream, in their two forms: Redis stream entry and client JSON.

Stream entries (``job:<id>:chunks``) have the fields ``type`` (``delta``, ``reset`` or
``final``) and ``seq``; a delta has ``text`` and ``completion_tokens`` (and ``logprobs`` when the
job asks for them), a final ``data`` (the JSON of the final message). A ``reset`` is only ever
a stream's first entry: the job runs again after its worker died (api/worker/admission.py).
"""

from __future__ import annotations

import json
from typing import Any

from api.common.redis_keys import JOB_STREAM_FIELD_SEQ, JOB_STREAM_FIELD_TEXT
from api.models import JobStatus
from engine_worker.protocol import FinalResult, OutputChunk


def delta_message(job_id: str, seq: int, text: str, completion_tokens: int | None = None,
                  logprobs: Any = None, model: str | None = None) -> dict[str, Any]:
    """A delta as clients get it; ``logprobs`` (the chunk's stored entries, for a job that asks)
    rendered as GET /jobs/<id> shows them."""
    message: dict[str, Any] = {"type": "delta", "job_id": job_id, "seq": seq, "text": text}
    if completion_tokens is not None:
        message["completion_tokens"] = completion_tokens
    if logprobs is not None:
        from api.jobs.logprobs import job_logprobs  # the tokenizer: web processes only

        message["logprobs"] = job_logprobs(logprobs, model=model)
    return message


def final_message(
    *, job_id: str, seq: int, status: str, finish_reason: str | None, prompt_tokens: int,
    completion_tokens: int, cached_tokens: int, error: str | None,
) -> dict[str, Any]:
    return {
        "type": "final",
        "job_id": job_id,
        "seq": seq,
        "status": status,
        "finish_reason": finish_reason,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "cached_tokens": cached_tokens,
        },
        "error": error,
    }


def final_from_result(result: FinalResult) -> dict[str, Any]:
    return final_message(
        job_id=result.job_id, seq=result.last_seq,
        status=JobStatus.for_finish_reason(result.finish_reason).value,
        finish_reason=result.finish_reason, prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens, cached_tokens=result.cached_tokens, error=result.error,
    )


def chunk_entry(chunk: OutputChunk, *, model: str | None = None) -> dict[str, str]:
    """A chunk's stream entry. One with log probabilities names the ``model`` whose tokenizer
    renders them for the followers."""
    entry = {"type": "delta", JOB_STREAM_FIELD_SEQ: str(chunk.seq), JOB_STREAM_FIELD_TEXT: chunk.text,
             "completion_tokens": str(chunk.completion_tokens)}
    if chunk.logprobs is not None:
        entry["logprobs"] = json.dumps(chunk.logprobs)
        if model is not None:
            entry["model"] = model
    return entry


def reset_entry(seq: int) -> dict[str, str]:
    """The first entry of a job's stream when the job runs again: clients drop their text."""
    return {"type": "reset", JOB_STREAM_FIELD_SEQ: str(seq)}


def final_from_job(job: Any) -> dict[str, Any]:
    """The final message of a finished ``api.models.Job``, from its row."""
    return final_message(
        job_id=str(job.id), seq=job.last_seq, status=job.status, finish_reason=job.finish_reason,
        prompt_tokens=job.prompt_tokens, completion_tokens=job.completion_tokens,
        cached_tokens=job.cached_tokens, error=job.error,
    )


def final_entry(result: FinalResult) -> dict[str, str]:
    return final_entry_from_message(final_from_result(result))


def final_entry_from_message(message: dict[str, Any]) -> dict[str, str]:
    """The stream entry of a final message."""
    return {"type": "final", JOB_STREAM_FIELD_SEQ: str(message["seq"]), JOB_STREAM_FIELD_TEXT: "",
            "data": json.dumps(message)}


def entry_to_message(job_id: str, fields: dict[str, str]) -> dict[str, Any]:
    """A stream entry (decoded strings) as the WebSocket message it stands for."""
    if fields.get("type") == "final":
        return json.loads(fields["data"])
    tokens = fields.get("completion_tokens")
    logprobs = fields.get("logprobs")
    return delta_message(job_id, int(fields[JOB_STREAM_FIELD_SEQ]), fields.get(JOB_STREAM_FIELD_TEXT, ""),
                         int(tokens) if tokens else None, json.loads(logprobs) if logprobs else None,
                         fields.get("model"))
