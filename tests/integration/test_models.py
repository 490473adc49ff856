"""Several models and several workers, with real parts: engine worker subprocesses on two local
models built with different seeds, Postgres and Redis. Jobs are submitted through ``job_create``
(model resolution and prefix-affinity routing as the API does them); the reconciler runs in the
test process, as celery beat would run it."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

from api.jobs.services.submission import JobRequest, job_create
from api.jobs.tasks import reconcile_jobs
from api.models import Job, JobStatus
from api.serving.workers import worker_ids_forget
from tests.api.factories import make_api_key
from tests.conftest import TINY_MODEL_DIR
from tests.integration.jobs import FINISHED, job, wait_status
from tests.integration.procs import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

OTHER_MODEL_DIR = TINY_MODEL_DIR.parent / "tiny-b"
PROMPTS = ["Once upon a time", "The quick brown fox", "def main():"]
SYSTEM = "You are a helpful assistant. Answer briefly and precisely, in plain words. " * 12


@pytest.fixture(scope="session")
def other_model_path() -> Path:
    """The test model's shape with other weights (seed 1): the same prompt, another answer."""
    from demo_model.builder import ModelSpec, ensure_model

    return ensure_model(OTHER_MODEL_DIR, ModelSpec(seed=1))


@pytest.fixture
def two_models(service_env, other_model_path, tiny_model_path, monkeypatch):
    monkeypatch.setattr(settings, "MODELS", [("tiny", str(tiny_model_path)), ("tiny-b", str(other_model_path))])
    return {"tiny": tiny_model_path, "tiny-b": other_model_path}


def _start(workers, worker_id: str, model_path: Path):
    proc = workers.start(worker_id, MODEL_PATH=str(model_path))
    worker_ids_forget()  # route with the new worker at once, not after the heartbeat cache's second
    return proc


def _submit(api_key, *, model: str | None = None, prompt: str | None = None, messages=None,
            max_tokens: int = 16, **sampling) -> str:
    request = JobRequest(prompt=prompt, messages=messages, model=model, max_tokens=max_tokens,
                         sampling={"temperature": 0.0, **sampling})
    return str(job_create(owner=api_key.owner, api_key=api_key, request=request).job.id)


def _in_process_text(model_path: Path, token_ids: list[int], max_tokens: int) -> str:
    """What the engine, run in this process on ``model_path``, writes for these tokens (greedy)."""
    import engine_worker.runner.mlx_core  # noqa: F401  (OpenBLAS before mlx-lm loads mlx)

    from mlx_lm import load

    from engine_worker.common.request import SamplingParams
    from engine_worker.engine.core import EngineCore

    model, tokenizer = load(str(model_path))
    engine = EngineCore(model, tokenizer)
    try:
        (out,) = engine.generate_batch_sync([token_ids], SamplingParams(max_tokens=max_tokens, temperature=0.0))
    finally:
        engine.close()
    return out.output_text


def test_each_models_jobs_run_on_its_own_workers_with_that_models_greedy_output(workers, two_models):
    _start(workers, "w-tiny", two_models["tiny"])
    _start(workers, "w-b", two_models["tiny-b"])
    api_key, _secret = make_api_key()

    ids = {(model, prompt): _submit(api_key, model=model, prompt=prompt) for model in two_models for prompt in PROMPTS}

    for (model, prompt), job_id in ids.items():
        done = wait_status(job_id, FINISHED)
        assert done.status == JobStatus.COMPLETED and done.model == model
        assert done.worker_id == {"tiny": "w-tiny", "tiny-b": "w-b"}[model]
        assert done.output_text == _in_process_text(two_models[model], done.prompt_token_ids, 16), (model, prompt)
    # Two models, two answers: a job answered by the other model's worker would show here.
    assert any(job(ids[("tiny", p)]).output_text != job(ids[("tiny-b", p)]).output_text for p in PROMPTS)


def test_killing_one_models_worker_stalls_none_of_the_other_models_jobs(workers, two_models):
    killed = _start(workers, "w-tiny", two_models["tiny"])
    _start(workers, "w-b", two_models["tiny-b"])
    api_key, _secret = make_api_key()
    stalled = [_submit(api_key, model="tiny", prompt=p, max_tokens=2000, ignore_eos=True) for p in PROMPTS]
    wait_for(lambda: job(stalled[0]).status == JobStatus.IN_PROGRESS, 120, "the tiny worker to start a job")
    killed.kill9()

    others = [_submit(api_key, model="tiny-b", prompt=p, max_tokens=24) for p in PROMPTS * 2]

    for job_id in others:
        assert wait_status(job_id, FINISHED, tick=reconcile_jobs).status == JobStatus.COMPLETED
    # The dead model's jobs wait for a worker of their own model: none ran on the other one.
    for job_id in stalled:
        row = job(job_id)
        assert row.status in (JobStatus.QUEUED, JobStatus.IN_PROGRESS) and row.worker_id in (None, "w-tiny")


def test_the_turns_of_a_conversation_go_to_one_worker_and_reuse_its_prefix_cache(workers, service_env,
                                                                              tiny_model_path):
    _start(workers, "w-1", tiny_model_path)
    _start(workers, "w-2", tiny_model_path)
    api_key, _secret = make_api_key()

    served: dict[int, list[Job]] = {}
    # Each conversation its own system prompt: new prefixes go to the least-loaded worker.
    histories = {c: [{"role": "system", "content": f"Conversation {c}. {SYSTEM}"},
                     {"role": "user", "content": f"Question {c}?"}] for c in range(4)}
    for _turn in range(3):
        ids = {c: _submit(api_key, messages=history, max_tokens=8) for c, history in histories.items()}
        for c, job_id in ids.items():
            done = wait_status(job_id, FINISHED)
            assert done.status == JobStatus.COMPLETED
            served.setdefault(c, []).append(done)
            histories[c] += [{"role": "assistant", "content": done.output_text}, {"role": "user", "content": "Why?"}]

    for turns in served.values():
        assert len({t.worker_id for t in turns}) == 1, [t.worker_id for t in turns]
        # Each later turn starts with the earlier turn's prompt, cached on that worker.
        assert all(t.cached_tokens >= len(turns[0].prompt_token_ids) // 2 for t in turns[1:])
    assert {turns[0].worker_id for turns in served.values()} == {"w-1", "w-2"}  # the conversations are shared


def test_a_worker_that_dies_midway_leaves_no_job_stuck(workers, tiny_model_path):
    doomed = workers.start("w-doomed", MODEL_PATH=str(tiny_model_path))
    _start(workers, "w-survivor", tiny_model_path)
    api_key, _secret = make_api_key()
    # Conversations spread over both workers; the doomed one holds running jobs and has more
    # routed to its own queue when it dies.
    ids = [_submit(api_key, prompt=f"Conversation {c}. {SYSTEM}", max_tokens=300, ignore_eos=True) for c in range(8)]
    assert {job(j).routed_worker for j in ids} == {"w-doomed", "w-survivor"}
    wait_for(lambda: Job.objects.filter(worker_id="w-doomed", status=JobStatus.IN_PROGRESS).exists(), 120,
             "the doomed worker to run a job")
    doomed.kill9()
    # Next turns: those of the doomed worker's conversations go to its queue until its heartbeat
    # expires; the reconciler sends them on to the shared queue when their claim deadline passes.
    ids += [_submit(api_key, prompt=f"Conversation {c}. {SYSTEM} More?", max_tokens=8) for c in range(8)]

    for job_id in ids:
        done = wait_status(job_id, FINISHED, tick=reconcile_jobs)
        assert done.status == JobStatus.COMPLETED and done.worker_id == "w-survivor"
