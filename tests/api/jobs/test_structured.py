"""``response_format`` on POST /api/v1/jobs: stored on the row with the constraint it compiled to,
sent to the engine with the job, shown by GET; a schema the engine cannot follow is a 400 that
names the parameter, and no job is made."""

from __future__ import annotations

import json

import pytest

from api.jobs.services.claim import job_spec
from api.models import Job
from engine_worker.common.grammar import JSON_OBJECT_LARK

pytestmark = pytest.mark.django_db

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}, "required": ["name"]}


def test_a_json_schema_job_keeps_its_response_format_and_sends_its_constraint_to_the_engine(api_client):
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    body = api_client.post("/api/v1/jobs", {"prompt": "Who?", "max_tokens": 8, "response_format": response_format},
                           format="json").json()

    job = Job.objects.get(id=body["id"])
    assert job.response_format == response_format
    spec = job_spec(job)
    assert spec.constraint_kind == "json_schema" and json.loads(spec.constraint) == SCHEMA
    assert api_client.get(f"/api/v1/jobs/{job.id}").json()["response_format"] == response_format


def test_json_object_sends_the_bounded_json_grammar(api_client):
    body = api_client.post("/api/v1/jobs", {"prompt": "Who?", "max_tokens": 8,
                                            "response_format": {"type": "json_object"}}, format="json").json()

    spec = job_spec(Job.objects.get(id=body["id"]))
    assert (spec.constraint_kind, spec.constraint) == ("lark", JSON_OBJECT_LARK)


def test_text_and_no_response_format_send_no_constraint(api_client):
    for extra in ({}, {"response_format": {"type": "text"}}):
        body = api_client.post("/api/v1/jobs", {"prompt": "x", "max_tokens": 4, **extra}, format="json").json()
        assert job_spec(Job.objects.get(id=body["id"])).constraint_kind == ""


@pytest.mark.parametrize("response_format, code", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}, "invalid_schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/missing"}}}, "invalid_schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(?=a)"}}},
     "invalid_schema"),
    ({"type": "json_schema", "json_schema": {"name": "x y", "schema": {}}}, "invalid"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": []}}, "invalid"),
    ({"type": "json_object", "json_schema": {}}, "invalid"),
    ("json", "invalid"),
])
def test_a_bad_response_format_is_a_400_naming_it_and_makes_no_job(api_client, response_format, code):
    response = api_client.post("/api/v1/jobs", {"prompt": "x", "max_tokens": 4, "response_format": response_format},
                               format="json")

    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("response_format", code)
    assert not Job.objects.exists()
