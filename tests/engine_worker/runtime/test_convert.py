"""JobSpec (the wire form a worker gets for a job) -> the engine's Request."""

from __future__ import annotations

import json

from engine_worker.protocol import JobSpec, from_dict, to_dict
from engine_worker.runtime.convert import spec_to_request


def test_every_sampling_setting_survives_the_wire_and_reaches_the_request():
    spec = JobSpec(job_id="j", prompt_token_ids=(1, 2, 3), max_tokens=9, temperature=0.5, top_p=0.8, top_k=4,
                   min_p=0.1, repetition_penalty=1.2, seed=7, stop=("END",), priority=3, ignore_eos=True,
                   presence_penalty=0.5, frequency_penalty=-1.0, logit_bias=((7, -100.0), (42, 3.5)))
    wired = from_dict(JobSpec, json.loads(json.dumps(to_dict(spec))))

    request = spec_to_request(wired)

    sp = request.sampling_params
    assert (request.request_id, request.prompt, request.priority) == ("j", [1, 2, 3], 3)
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.repetition_penalty, sp.seed) == (
        9, 0.5, 0.8, 4, 0.1, 1.2, 7)
    assert (sp.stop, sp.ignore_eos, sp.presence_penalty, sp.frequency_penalty) == (["END"], True, 0.5, -1.0)
    assert sp.logit_bias == {7: -100.0, 42: 3.5}


def test_a_spec_without_a_logit_bias_gives_none_so_the_request_keeps_the_fast_path():
    request = spec_to_request(JobSpec(job_id="j", prompt_token_ids=(1,), max_tokens=2))

    assert request.sampling_params.logit_bias is None and request.sampling_params.frequency_penalty == 0.0


def test_a_constraint_survives_the_wire_and_reaches_the_request():
    spec = JobSpec(job_id="j", prompt_token_ids=(1,), max_tokens=2, constraint_kind="json_schema",
                   constraint='{"type": "integer"}')
    request = spec_to_request(from_dict(JobSpec, json.loads(json.dumps(to_dict(spec)))))

    constraint = request.sampling_params.constraint
    assert (constraint.kind, constraint.text) == ("json_schema", '{"type": "integer"}')
    assert spec_to_request(JobSpec(job_id="k", prompt_token_ids=(1,), max_tokens=2)).sampling_params.constraint is None
