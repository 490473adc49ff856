"""Constrained rows through the real tiny model: every answer parses and validates, in the same
batch as free rows, and a preempted row resumes in its grammar state."""

from __future__ import annotations

import json

import jsonschema
import pytest

from engine_worker.common.config import SchedulerConfig
from engine_worker.common.grammar import ConstraintError, check
from engine_worker.common.request import Constraint, Request
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, greedy, run_scheduler
from tests.engine_worker.runner.schemas import SCHEMAS


def _schema(schema: dict) -> Constraint:
    return Constraint("json_schema", json.dumps(schema))


def _prompt(tokenizer) -> list[int]:
    return tokenizer.encode("def parse(data):\n    return")


@pytest.fixture(scope="module")
def scheduler(tiny_model):
    model, tokenizer = tiny_model
    return Scheduler(model, tokenizer, SchedulerConfig(max_num_seqs=64))


def test_twenty_schemas_answer_json_that_validates_every_time(scheduler, tiny_model):
    assert len(SCHEMAS) == 20
    prompt = _prompt(tiny_model[1])
    requests = [Request(f"s{i}", prompt, greedy(400, constraint=_schema(s))) for i, s in enumerate(SCHEMAS)]
    # Free rows in the same batch: they must come out as they would alone (unconstrained).
    free = [Request(f"free{i}", prompt, greedy(24)) for i in range(4)]
    outputs = run_scheduler(scheduler, {0: requests + free})
    for i, schema in enumerate(SCHEMAS):
        out = final(outputs[f"s{i}"])
        assert out.finish_reason == "stop", (i, out.output_text)
        jsonschema.validate(json.loads(out.output_text), schema)
    alone = run_scheduler(scheduler, {0: [Request("alone", prompt, greedy(24))]})
    assert final(outputs["free0"]).output_token_ids == final(alone["alone"]).output_token_ids


def test_sampled_rows_stay_within_the_schema(scheduler, tiny_model):
    prompt = _prompt(tiny_model[1])
    schema = SCHEMAS[3]
    requests = [Request(f"t{i}", prompt, greedy(400, constraint=_schema(schema), seed=i)) for i in range(6)]
    for r in requests:
        r.sampling_params.temperature = 1.0
    outputs = run_scheduler(scheduler, {0: requests})
    for r in requests:
        out = final(outputs[r.request_id])
        jsonschema.validate(json.loads(out.output_text), schema)


def test_a_constrained_row_that_reaches_max_tokens_ends_with_length_and_what_it_wrote(scheduler, tiny_model):
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 50}
    outputs = run_scheduler(scheduler, {0: [Request("long", _prompt(tiny_model[1]), greedy(8, constraint=_schema(schema)))]})
    out = final(outputs["long"])
    assert out.finish_reason == "length" and out.completion_tokens == 8
    assert out.output_text.startswith("[")


def test_a_preempted_constrained_row_resumes_in_its_grammar_state(scheduler, tiny_model):
    schema = SCHEMAS[5]
    request = Request("pre", _prompt(tiny_model[1]), greedy(400, constraint=_schema(schema)))
    preempted = []

    def preempt_once(step, _result):
        if step == 6 and not preempted:
            preempted.append(len(request.output_token_ids))
            scheduler._preemptor.preempt([request])

    outputs = run_scheduler(scheduler, {0: [request]}, on_step=preempt_once)
    assert preempted and preempted[0] > 0
    out = final(outputs["pre"])
    assert out.finish_reason == "stop"
    jsonschema.validate(json.loads(out.output_text), schema)
    assert scheduler.counters.num_preemptions >= 1


def test_an_invalid_constraint_fails_its_request_alone(scheduler, tiny_model):
    prompt = _prompt(tiny_model[1])
    bad = Request("bad", prompt, greedy(8, constraint=Constraint("lark", "start: nope")))
    good = Request("good", prompt, greedy(8))
    outputs = run_scheduler(scheduler, {0: [bad, good]})
    assert final(outputs["bad"]).finish_reason == "error"
    assert final(outputs["good"]).finish_reason in ("length", "stop")


@pytest.mark.parametrize("schema", ['{"type": "strin"}', '{"$ref": "#/missing"}', "[1", '{"type": "object", "propertyNames": {}}'])
def test_a_bad_schema_is_refused_with_a_reason(schema):
    with pytest.raises(ConstraintError) as err:
        check(Constraint("json_schema", schema))
    assert err.value.reason
