"""drf-spectacular hooks: what the OpenAPI schema cannot learn from the DRF views.

``GET /api/v1/jobs/{job_id}/events`` (server-sent events, api/streaming/sse.py) is a Channels consumer, not
a DRF view, so the generator does not see it; a hook adds it to every schema it builds, the
offline docs page included. Another states the job body's rules that its serializer checks in
code (api/jobs/serializers.py): exactly one of ``prompt`` and ``messages``, no unknown field, and
``top_p`` above 0.
"""

from __future__ import annotations

from typing import Any

# An Idempotency-Key as api/jobs/services/submission.py accepts it: 1 to 255 printable ASCII characters.
IDEMPOTENCY_KEY_SCHEMA: dict[str, Any] = {"type": "string", "pattern": "^[ -~]{1,255}$"}


def error_response(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


EVENTS_PATH = "/api/v1/jobs/{job_id}/events"
EVENTS_OPERATION: dict[str, Any] = {
    "operationId": "jobs_events",
    "summary": "Stream a job as server-sent events",
    "description": (
        "`text/event-stream`, the same messages as the WebSocket `/ws/v1/jobs/{job_id}/`, one event each "
        "(`data` is the message's JSON, `id` its seq), every one exactly once and in order:\n\n"
        "- `delta` (`seq`, `text`, `completion_tokens`, and `logprobs` when the job asks for them): append "
        "`text` to the text you have.\n"
        "- `reset` (`job_id`, `seq`): drop the text you have. The job runs again from the start (its worker "
        "died or was stopped, and another worker took it over), and its deltas continue after this seq. "
        "Only a client that holds text from before the restart gets one.\n"
        "- `final` (`status`, `finish_reason`, `usage`, `error`; id `<seq>:final`): the job has ended, and "
        "the response ends. The text you have is now the job's `output_text`.\n\n"
        "Reconnect with `Last-Event-ID` (an EventSource does by itself) or `?after=<the last seq you saw>` to "
        "resume; that is always correct, also across a reset. After the final a reconnect is answered 204. "
        "A comment line is sent every `SSE_KEEPALIVE_S` seconds (15 by default) while nothing else is."
    ),
    "tags": ["jobs"],
    "security": [{"ApiKey": []}],
    "parameters": [
        {"in": "path", "name": "job_id", "required": True, "schema": {"type": "string", "format": "uuid"}},
        {"in": "query", "name": "after", "required": False, "schema": {"type": "integer", "minimum": 0},
         "description": "Send only chunks with a greater seq."},
        {"in": "header", "name": "Last-Event-ID", "required": False,
         "schema": {"type": "string", "pattern": "^([0-9]+(:final)?)?$"},
         "description": "The id of the last event received (wins over after; empty: none yet)."},
        {"in": "query", "name": "api_key", "required": False, "schema": {"type": "string"},
         "description": "The API key, for clients that cannot send Authorization (a browser's EventSource)."},
    ],
    "responses": {
        "200": {"description": "The event stream",
                "content": {"text/event-stream": {"schema": {"type": "string"}}}},
        "204": {"description": "The client already had the final event"},
        "400": error_response("Invalid after or Last-Event-ID"),
        "401": error_response("Missing, invalid or revoked API key"),
        "404": error_response("No such job (or not yours)"),
        "503": error_response("No stream to follow right now (Redis is down); poll the job instead"),
    },
}


def add_job_events(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """POSTPROCESSING_HOOKS entry: the job event stream, next to the other job paths."""
    paths = result.setdefault("paths", {})
    paths[EVENTS_PATH] = {"get": EVENTS_OPERATION}
    result["paths"] = dict(sorted(paths.items()))
    return result


def add_job_create_rules(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """POSTPROCESSING_HOOKS entry: JobCreateRequest's cross-field rule, its closed set of fields
    and top_p's open bound."""
    body = result.get("components", {}).get("schemas", {}).get("JobCreateRequest")
    if body is not None:
        body["oneOf"] = [{"required": ["prompt"]}, {"required": ["messages"]}]
        body["additionalProperties"] = False  # an unknown field is a 400 unknown_field
        body["properties"]["top_p"]["exclusiveMinimum"] = True  # OpenAPI 3.0: a flag on minimum
    return result
