"""The submission serializers copy their declared fields shallowly (api/serializer_copies.py)."""

from __future__ import annotations

import copy
import threading

from api.serializers import JobCreatedSerializer, JobCreateSerializer, MessageSerializer


def test_validating_a_submission_does_not_deep_copy_the_declared_fields(monkeypatch):
    copied = []
    deepcopy = copy.deepcopy

    def spy(value, *args, **kwargs):
        copied.append(value)
        return deepcopy(value, *args, **kwargs)

    monkeypatch.setattr(copy, "deepcopy", spy)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    serializer = JobCreateSerializer(data=body)
    assert serializer.is_valid(), serializer.errors
    assert JobCreatedSerializer({"id": "1c7c2fe4-5b0e-4b7e-9c43-0d0e2a6a1c11", "object": "job", "status": "queued",
                                 "queue_position": 0, "created_at": None}).data["queue_position"] == 0
    declared = [JobCreateSerializer._declared_fields, MessageSerializer._declared_fields,
                JobCreatedSerializer._declared_fields]
    assert not [value for value in copied if any(value is fields for fields in declared)]


def test_each_instance_binds_copies_of_its_own_and_the_declared_fields_stay_unbound():
    first, second = JobCreateSerializer(data={}), JobCreateSerializer(data={})
    assert first.fields["prompt"] is not second.fields["prompt"]
    assert first.fields["prompt"].parent is first and second.fields["prompt"].parent is second
    assert first.fields["max_tokens"].field_name == "max_tokens"
    declared = JobCreateSerializer._declared_fields["prompt"]
    assert declared.parent is None and declared.field_name is None


def test_validations_on_many_threads_at_once_keep_their_own_results_and_errors():
    bodies = [
        ({"prompt": "a story", "max_tokens": 5}, True),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}, True),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, False),
        ({"prompt": "x", "temperature": -1}, False),
        ({"prompt": "x", "max_token": 3}, False),
    ]
    failures: list[str] = []
    start = threading.Barrier(8)

    def run(offset: int) -> None:
        start.wait()
        for i in range(300):
            body, valid = bodies[(i + offset) % len(bodies)]
            serializer = JobCreateSerializer(data=body)
            ok = serializer.is_valid()
            if ok != valid:
                failures.append(f"{body}: {serializer.errors}")
            elif ok and serializer.validated_data.get("prompt") != body.get("prompt"):
                failures.append(f"{body}: validated as {serializer.validated_data}")
            elif not ok and "messages" in body and "messages" not in serializer.errors:
                failures.append(f"{body}: errors {serializer.errors}")

    threads = [threading.Thread(target=run, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
