"""Prefix-affinity routing over a model's live workers (api/jobs/services/queue_routing.py), with real
Redis (heartbeats, the prefix map) and the database (the workers' loads)."""

from __future__ import annotations

import pytest
import redis
import redis.client

from api.jobs.services.queue_routing import (
    BLOCK_TOKENS,
    MAX_EXTRA_JOBS,
    PENDING_PREFIX,
    Route,
    job_route,
    job_route_settled,
)
from api.models import ApiKey, Job, JobStatus
from api.serving.workers import worker_ids_forget
from tests.api.factories import heartbeat, make_job, publish_heartbeat

pytestmark = pytest.mark.django_db

SYSTEM = list(range(10, 10 + 10 * BLOCK_TOKENS))  # a shared system prompt of ten blocks
CAPACITY = 32  # the requests a test worker's batch runs at once (its heartbeat's capacity)


@pytest.fixture
def live(redis_client):
    """Publish heartbeats of workers of the tiny model, each with a batch of CAPACITY; returns a
    function doing it."""
    def start(*worker_ids: str, capacity: int = CAPACITY) -> None:
        for worker_id in worker_ids:
            publish_heartbeat(redis_client, heartbeat(worker_id=worker_id, model="tiny", capacity=capacity))
        worker_ids_forget()

    return start


def _turn(conversation: int, turn: int) -> list[int]:
    """The prompt of a conversation's turn: the system prompt, then every earlier turn's message
    and answer, then this turn's message (two blocks each)."""
    tokens = list(SYSTEM)
    for t in range(turn + 1):
        tokens += [5000 + conversation * 100 + t] * (2 * BLOCK_TOKENS)
    return tokens


def _route(tokens: list[int]) -> Route:
    route = job_route(model="tiny", prompt_token_ids=tokens)
    if route.worker_id is not None:  # the job now counts in its worker's load, as job_create inserts it
        make_job(model="tiny", routed_worker=route.worker_id)
        job_route_settled(model="tiny", route=route)
    return route


def test_every_turn_of_a_conversation_goes_to_the_worker_that_served_its_first(live):
    live("w-a", "w-b")

    routes = []
    for turn in range(4):
        routes.append(_route(_turn(7, turn)))
        Job.objects.update(status=JobStatus.COMPLETED)  # the next turn follows the answer

    assert routes[0].worker_id in {"w-a", "w-b"}
    assert {r.worker_id for r in routes} == {routes[0].worker_id}
    assert routes[0].queue == f"engine.tiny.{routes[0].worker_id}"


def test_routing_sends_redis_a_few_commands_whatever_the_prompts_length(live, monkeypatch):
    """Routing runs on every submission, in the web tier's one thread for sync code: its Redis work
    must not grow with the prompt. A turn deep in a conversation (32 blocks) is looked up and
    recorded in a few commands, not one or two per block."""
    live("w-a", "w-b")
    sent: list[str] = []
    execute_command = redis.Redis.execute_command
    execute_pipeline = redis.client.Pipeline.execute

    def count_command(self, *args, **options):
        sent.append(str(args[0]))
        return execute_command(self, *args, **options)

    def count_pipeline(self, raise_on_error=True):
        sent.extend(str(command[0][0]) for command in self.command_stack)
        return execute_pipeline(self, raise_on_error)

    monkeypatch.setattr(redis.Redis, "execute_command", count_command)
    monkeypatch.setattr(redis.client.Pipeline, "execute", count_pipeline)
    first = _route(_turn(3, 0))
    Job.objects.update(status=JobStatus.COMPLETED)
    sent.clear()

    later = _route(_turn(3, 10))

    assert len(_turn(3, 10)) // BLOCK_TOKENS == 32 and later.worker_id == first.worker_id
    assert len(sent) <= 4, sent  # the lookup, the record and the settle


def test_new_conversations_over_one_system_prompt_spread_over_the_workers_and_keep_to_them(live):
    live("w-a", "w-b")

    first = [_route(_turn(c, 0)).worker_id for c in range(24)]
    Job.objects.update(status=JobStatus.COMPLETED)  # the first turns were answered
    later = [_route(_turn(c, 1)).worker_id for c in range(24)]

    counts = {w: first.count(w) for w in ("w-a", "w-b")}
    assert abs(counts["w-a"] - counts["w-b"]) <= 1, counts
    assert later == first  # each conversation's second turn where its first ran


def test_a_burst_of_new_conversations_routed_before_any_counts_in_the_loads_splits_evenly(live):
    """Submissions that arrive together are routed before any of their jobs is inserted: every one
    sees the same loads. The worker that got the system prompt first must not take them all."""
    live("w-a", "w-b")

    first = [job_route(model="tiny", prompt_token_ids=_turn(c, 0)).worker_id for c in range(24)]

    assert first.count("w-a") == first.count("w-b") == 12, first


def test_a_burst_routed_before_its_rows_commit_counts_itself_in_the_loads(live):
    """The database shows the burst one job on w-b (a job of an earlier burst still running), and
    none of the burst's own rows: the jobs routed but not yet inserted count, so the burst evens the
    workers out instead of all going to w-a."""
    live("w-a", "w-b")
    make_job(model="tiny", status=JobStatus.IN_PROGRESS, worker_id="w-b")

    first = [job_route(model="tiny", prompt_token_ids=_turn(c, 0)).worker_id for c in range(23)]

    assert first.count("w-a") == 12 and first.count("w-b") == 11, first


def test_a_submission_settles_its_pending_route_whether_its_row_commits_or_not(
        live, api_client, broker, redis_client, django_capture_on_commit_callbacks):
    live("w-a", "w-b")
    body = {"messages": [{"role": "user", "content": "Tell me about the sea. " * 20}], "max_tokens": 4}
    with django_capture_on_commit_callbacks(execute=True):
        assert api_client.post("/api/v1/jobs", body, format="json").status_code == 202
    ApiKey.objects.update(max_concurrent_jobs=1)  # the first job is queued: the second is refused
    refused = api_client.post("/api/v1/jobs", body, format="json")

    assert refused.status_code == 429
    assert {w: int(n) for w, n in redis_client.hgetall(PENDING_PREFIX + "tiny").items()} in (
        {"w-a": 0, "w-b": 0}, {"w-a": 0}, {"w-b": 0}), "a routed job still counts as pending"


def test_a_continuation_whose_worker_is_full_goes_to_a_worker_with_room(live):
    """A turn sent to a worker whose batch is full would wait there while the other runs
    nothing; the other starts it at once (recomputing the prefix), and keeps the conversation."""
    live("w-a", "w-b")
    owner = _route(_turn(1, 0)).worker_id
    other = ({"w-a", "w-b"} - {owner}).pop()
    Job.objects.update(status=JobStatus.COMPLETED)
    for _ in range(CAPACITY):  # its batch full: one more job would wait
        make_job(model="tiny", status=JobStatus.IN_PROGRESS, worker_id=owner)

    assert _route(_turn(1, 1)).worker_id == other
    assert _route(_turn(1, 2)).worker_id == other  # its prefix is the other worker's now


def test_with_every_batch_full_a_continuation_stays_unless_its_worker_is_much_busier(live):
    """With no room anywhere the turn waits wherever it goes: on its worker it waits with its
    prefix cached (not on the shared queue, which any worker takes, room or not), unless more
    than MAX_EXTRA_JOBS more jobs wait there."""
    live("w-a", "w-b", capacity=2)
    owner = _route(_turn(4, 0)).worker_id
    other = ({"w-a", "w-b"} - {owner}).pop()
    Job.objects.update(status=JobStatus.COMPLETED)
    for worker in ("w-a", "w-b"):
        for _ in range(2):
            make_job(model="tiny", status=JobStatus.IN_PROGRESS, worker_id=worker)

    assert _route(_turn(4, 1)) == Route(f"engine.tiny.{owner}", owner)

    Job.objects.filter(routed_worker=owner).update(status=JobStatus.COMPLETED)
    for _ in range(MAX_EXTRA_JOBS + 1):
        make_job(model="tiny", status=JobStatus.IN_PROGRESS, worker_id=owner)
    assert _route(_turn(4, 2)).worker_id == other


def test_a_worker_that_died_loses_its_affinity(live, redis_client):
    live("w-a", "w-b", "w-c")
    owner = _route(_turn(3, 0)).worker_id
    redis_client.delete(f"engine:workers:{owner}")  # its heartbeat expired
    worker_ids_forget()

    route = _route(_turn(3, 1))

    assert route.worker_id in {"w-a", "w-b", "w-c"} - {owner}


def test_one_live_worker_a_short_prompt_or_affinity_off_use_the_models_shared_queue(live, settings):
    shared = Route("engine.tiny", None)
    live("w-a")
    assert _route(_turn(1, 0)) == shared

    live("w-b")
    assert _route(list(range(BLOCK_TOKENS - 1))) == shared
    settings.ROUTING_AFFINITY = False
    assert _route(_turn(1, 0)) == shared


def test_a_submitted_conversation_is_routed_to_one_worker_and_sent_to_its_queue(
        live, api_client, broker, django_capture_on_commit_callbacks):
    live("w-a", "w-b")
    system = {"role": "system", "content": "You are a careful assistant who answers in one line. " * 20}
    history = [system, {"role": "user", "content": "Tell me about the sea."}]
    ids = []
    for turn in range(3):
        with django_capture_on_commit_callbacks(execute=True):
            ids.append(api_client.post("/api/v1/jobs", {"messages": history, "max_tokens": 4},
                                       format="json").json()["id"])
        history += [{"role": "assistant", "content": f"Answer {turn}."}, {"role": "user", "content": "And then?"}]

    workers = {Job.objects.get(id=job_id).routed_worker for job_id in ids}
    assert len(workers) == 1 and workers <= {"w-a", "w-b"}
    (worker,) = workers
    assert [options for _name, _args, options in broker.messages] == [{"queue": f"engine.tiny.{worker}"}] * 3


def test_a_continuation_stays_with_a_busier_worker_whose_batch_has_room(redis_client):
    """Only a full batch makes a worker too busy: one that runs more jobs than the other but
    still has room starts the turn at once, with its prefix cached."""
    for worker_id in ("w-a", "w-b"):
        publish_heartbeat(redis_client, heartbeat(worker_id=worker_id, model="tiny", capacity=8))
    worker_ids_forget()
    owner = _route(_turn(2, 0)).worker_id
    other = ({"w-a", "w-b"} - {owner}).pop()
    Job.objects.update(status=JobStatus.COMPLETED)
    for _ in range(7):  # much busier than the other (which runs nothing), one place left in its batch
        make_job(model="tiny", status=JobStatus.IN_PROGRESS, worker_id=owner)

    assert _route(_turn(2, 1)).worker_id == owner

    Job.objects.update(status=JobStatus.COMPLETED)
    for _ in range(8):  # its batch full
        make_job(model="tiny", status=JobStatus.IN_PROGRESS, worker_id=owner)

    assert _route(_turn(2, 2)).worker_id == other
