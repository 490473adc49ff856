"""A job's metadata: stored with it, shown with it, a filter of the list; bad metadata is a 400."""

from __future__ import annotations

import pytest

from api.models import Job, JobStatus
from tests.api.factories import make_api_key, make_job

pytestmark = pytest.mark.django_db


def _submit(client, **fields):
    return client.post("/api/v1/jobs", {"prompt": "hello", "max_tokens": 4, **fields}, format="json")


def test_metadata_is_stored_and_shown_with_the_job(api_client):
    response = _submit(api_client, metadata={"order": "A-17", "team": "search"})

    assert response.status_code == 202, response.content
    job = Job.objects.get(id=response.json()["id"])
    assert job.metadata == {"order": "A-17", "team": "search"}
    assert api_client.get(f"/api/v1/jobs/{job.id}").json()["metadata"] == {"order": "A-17", "team": "search"}
    assert _submit(api_client).status_code == 202
    assert [j["metadata"] for j in api_client.get("/api/v1/jobs").json()["results"]] == [
        {}, {"order": "A-17", "team": "search"}]


def test_the_list_keeps_only_jobs_with_every_pair_asked_for(api_client, api_key):
    both = make_job(api_key=api_key, metadata={"order": "A-17", "team": "search"})
    one = make_job(api_key=api_key, metadata={"order": "A-17"})
    make_job(api_key=api_key, metadata={"order": "B-2", "team": "search"})
    make_job(api_key=api_key)
    other_key, _ = make_api_key()
    make_job(api_key=other_key, metadata={"order": "A-17"})  # someone else's: never listed

    def listed(query: str) -> set[str]:
        response = api_client.get(f"/api/v1/jobs?{query}")
        assert response.status_code == 200, response.content
        return {j["id"] for j in response.json()["results"]}

    assert listed("metadata[order]=A-17") == {str(both.id), str(one.id)}
    assert listed("metadata[order]=A-17&metadata[team]=search") == {str(both.id)}
    assert listed("metadata[order]=nope") == set()
    assert listed("metadata[order]=A-17&status=queued") == {str(both.id), str(one.id)}


@pytest.mark.parametrize("key", ["0", "2024", "-1", " 7", "1_0", 'a"b', "a.b", "$", "*", "é"])
def test_any_key_filters_as_itself_even_one_that_looks_like_an_index_or_a_path(api_client, api_key, key):
    match = make_job(api_key=api_key, metadata={key: "x"})
    make_job(api_key=api_key, metadata={key: "y"})
    make_job(api_key=api_key, metadata={"other": "x"})

    response = api_client.get("/api/v1/jobs", {f"metadata[{key}]": "x"})

    assert response.status_code == 200, response.content
    assert [j["id"] for j in response.json()["results"]] == [str(match.id)]


@pytest.mark.parametrize("query", ["metadata=x", "metadata[]=x", "metadata[a][b]=x", "metadata[a]=1&metadata[a]=2",
                                   f"metadata[{'k' * 65}]=x", "metadata[a]=%00", "metadata[a%00]=x",
                                   f"metadata[a]={'v' * 513}", "metadata[a]=line%0Abreak"])
def test_a_malformed_metadata_filter_is_400_naming_it(api_client, query):
    response = api_client.get(f"/api/v1/jobs?{query}")

    assert response.status_code == 400
    assert response.json()["error"]["param"].startswith("metadata")


@pytest.mark.parametrize("metadata", [
    "order", ["order"], {"order": 17}, {"order": None}, {"": "x"}, {"k" * 65: "x"}, {"order": "v" * 513},
    {f"k{i}": "v" for i in range(17)}, {"order": "line\nbreak"}, {"a[b]": "x"},
])
def test_bad_metadata_is_400_and_makes_no_job(api_client, metadata):
    response = _submit(api_client, metadata=metadata)

    assert response.status_code == 400, response.content
    assert response.json()["error"]["param"] == "metadata"
    assert not Job.objects.exists()


def test_metadata_is_part_of_an_idempotent_body(api_client):
    headers = {"HTTP_IDEMPOTENCY_KEY": "k-1"}
    first = api_client.post("/api/v1/jobs", {"prompt": "hello", "metadata": {"order": "A-17"}}, format="json", **headers)
    replay = api_client.post("/api/v1/jobs", {"prompt": "hello", "metadata": {"order": "A-17"}}, format="json", **headers)
    changed = api_client.post("/api/v1/jobs", {"prompt": "hello", "metadata": {"order": "B-2"}}, format="json", **headers)

    assert (first.status_code, replay.status_code, changed.status_code) == (202, 200, 422)
    assert replay.json()["id"] == first.json()["id"]


def test_a_deleted_job_loses_its_metadata(api_client, api_key):
    job = make_job(api_key=api_key, status=JobStatus.COMPLETED, metadata={"customer": "private"})

    assert api_client.delete(f"/api/v1/jobs/{job.id}").status_code == 200

    assert Job.objects.get(id=job.id).metadata == {}


def test_the_list_filter_is_in_the_schema(api_client):
    parameters = api_client.get("/api/v1/schema").json()["paths"]["/api/v1/jobs"]["get"]["parameters"]
    assert any(p["name"] == "metadata" and p.get("style") == "deepObject" for p in parameters)
