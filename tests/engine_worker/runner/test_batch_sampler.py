"""The batch's one sampler: a batch with constrained rows samples in one call a step, every row in
the generator's order, seeded rows on their own key chains."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx_lm.generate import StopSequences

from engine_worker.common.config import SchedulerConfig
from engine_worker.common.request import Constraint, Request
from engine_worker.runner.batch_sampler import BatchSampler, RowOrder, RowOrderLost, _sample_grouped
from engine_worker.runner.generator import MlxBatchRunner
from engine_worker.runner.grammar import ConstrainedRows
from engine_worker.runner.loader import vocab_size
from engine_worker.runner.sampling import make_seeded_sampler
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, greedy, prompt_ids, run_scheduler

INTS = Constraint("json_schema", json.dumps({"type": "array", "items": {"type": "integer"}, "minItems": 500}))


def _ints_prefix(text: str) -> bool:
    body = text.removeprefix("[")
    return text.startswith("[") and all(p.strip().lstrip("-").isdigit() for p in body.split(",")[:-1])


@pytest.fixture
def calls(monkeypatch):
    """The row count of every BatchSampler call."""
    seen: list[int] = []
    call = BatchSampler.__call__

    def spy(self, logprobs):
        seen.append(logprobs.shape[0])
        return call(self, logprobs)

    monkeypatch.setattr(BatchSampler, "__call__", spy)
    return seen


def test_a_half_constrained_batch_samples_all_its_rows_in_one_call_a_step(tiny_model, calls):
    model, tokenizer = tiny_model
    scheduler = Scheduler(model, tokenizer, SchedulerConfig(max_num_seqs=16))
    prompt = tokenizer.encode("def parse(data):\n    return")
    rows = [Request(f"r{i}", prompt, greedy(12, constraint=INTS if i % 2 else None, ignore_eos=True))
            for i in range(8)]
    outputs = run_scheduler(scheduler, {0: rows})
    # All eight prompts end in one step (one call of 8 rows: their first tokens), then 12 decoding
    # steps of 8 rows (each returns a token and samples the next).
    assert calls == [8] * 13
    for r in rows[1::2]:
        assert _ints_prefix(final(outputs[r.request_id]).output_text)
    masks = scheduler._sampling.constrained.mask_steps
    assert masks == 13
    # The same generator with free rows only: one call a step still, and no mask work at all.
    calls.clear()
    run_scheduler(scheduler, {0: [Request(f"free{i}", prompt, greedy(12, ignore_eos=True)) for i in range(8)]})
    assert calls == [8] * 13
    assert scheduler._sampling.constrained.mask_steps == masks


def test_free_rows_write_in_a_half_constrained_batch_what_they_write_in_a_free_one(tiny_model):
    model, tokenizer = tiny_model
    scheduler = Scheduler(model, tokenizer, SchedulerConfig(max_num_seqs=16))
    prompt = tokenizer.encode("def parse(data):\n    return")

    def batch(constrained: bool) -> dict[str, list[int]]:
        kind = "mixed" if constrained else "free"
        rows = [Request(f"{kind}-g{i}", prompt, greedy(16, constraint=INTS if constrained and i % 2 else None))
                for i in range(6)]
        seeded = Request(f"{kind}-seeded", prompt, greedy(16, seed=7, ignore_eos=True))
        seeded.sampling_params.temperature = 1.0
        outputs = run_scheduler(scheduler, {0: [*rows, seeded]})
        return {rid.removeprefix(f"{kind}-"): final(out).output_token_ids for rid, out in outputs.items()}

    free, mixed = batch(False), batch(True)
    for rid in ("g0", "g2", "g4", "seeded"):
        assert mixed[rid] == free[rid], rid


def test_a_seeded_constrained_row_draws_from_its_own_key_chain(tiny_model):
    model, tokenizer = tiny_model
    scheduler = Scheduler(model, tokenizer, SchedulerConfig(max_num_seqs=16))
    prompt = tokenizer.encode("def parse(data):\n    return")

    def seeded(request_id: str) -> Request:
        r = Request(request_id, prompt, greedy(16, seed=3, constraint=INTS))
        r.sampling_params.temperature = 1.0
        return r

    alone = seeded("alone")
    out_alone = final(run_scheduler(scheduler, {0: [alone]})[alone.request_id]).output_token_ids
    crowded = seeded("crowded")
    others = [Request(f"o{i}", prompt, greedy(16, constraint=INTS)) for i in range(3)]
    out_crowded = final(run_scheduler(scheduler, {0: [*others, crowded]})[crowded.request_id]).output_token_ids
    assert out_crowded == out_alone


def test_row_order_follows_the_generator_as_prompts_end_at_different_steps(tiny_model, monkeypatch):
    """Prompts of different lengths end in different steps (a later short one before an earlier
    long one), rows finish and are removed: every call of the decoding batch sees its rows in the
    generator's own order (read here, in the test only, from its private batch)."""
    model, tokenizer = tiny_model
    runner = MlxBatchRunner(model, SchedulerConfig(prefill_step_size=16, prefill_batch_size=3))
    mismatches: list[tuple[list[int], list[int]]] = []
    decoding_calls = []
    rows_of = RowOrder.rows

    def checked(self, count):
        rows = rows_of(self, count)
        live = list(runner.generator._generation_batch.uids)
        if self._calls == 1 and live:
            decoding_calls.append(rows)
            if rows != live:
                mismatches.append((rows, live))
        return rows

    monkeypatch.setattr(RowOrder, "rows", checked)
    constrained = ConstrainedRows(tokenizer, vocab_size(model))
    stops = StopSequences([])  # rows end by max_tokens, or by removal
    uids: dict[int, bool] = {}
    for i, (length, max_tokens) in enumerate([(60, 20), (5, 30), (1, 12), (33, 25), (9, 16), (1, 40)]):
        row = constrained.row(INTS, None) if i % 2 == 0 else None
        uid = runner.insert(prompt_ids(tokenizer, length), max_tokens=max_tokens, cache=None, all_tokens=None,
                            sampler=row, logits_processors=[], stop_sequences=stops)
        uids[uid] = row is not None
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    removed = list(uids)[4]
    for step in range(60):
        if step == 8:
            runner.remove([removed])
        for r in runner.step().generated:
            tokens[r.uid].append(r.token)
    runner.close()
    assert not mismatches
    assert any(rows != sorted(rows) for rows in decoding_calls)  # the order is not the uid order
    for uid, is_constrained in uids.items():
        if is_constrained and uid != removed:
            assert _ints_prefix(tokenizer.decode(tokens[uid])), tokenizer.decode(tokens[uid])


def test_a_batch_that_samples_alike_never_asks_for_its_row_order(tiny_model, monkeypatch):
    """Free rows of one sampler (the usual batch) are sampled as a whole: a row order out of step
    with the generator could not fail their steps."""
    model, tokenizer = tiny_model
    runner = MlxBatchRunner(model, SchedulerConfig(prefill_step_size=16, prefill_batch_size=3))

    def lost(self, count):
        raise RowOrderLost("asked")

    monkeypatch.setattr(RowOrder, "rows", lost)
    stops = StopSequences([])
    uids = [runner.insert(prompt_ids(tokenizer, length), max_tokens=8, cache=None, all_tokens=None, sampler=None,
                          logits_processors=[], stop_sequences=stops) for length in (1, 9, 33)]
    written: dict[int, int] = dict.fromkeys(uids, 0)
    for _ in range(40):
        for r in runner.step().generated:
            written[r.uid] += 1
    runner.close()
    assert written == dict.fromkeys(uids, 8)


def test_a_call_of_unexpected_rows_is_refused_not_sampled():
    order = RowOrder()
    order.inserted(0, 1)
    order.inserted(1, 5)
    with pytest.raises(RuntimeError):
        order.rows(2)  # one prompt has one token left, not two


def test_rows_are_sampled_by_their_own_sampler_and_come_back_in_row_order():
    logprobs = mx.array([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0], [1.0, 2.0, 0.0], [0.0, 2.0, 1.0]])

    def lowest(x: mx.array) -> mx.array:
        return mx.argmin(x, axis=-1)

    def highest(x: mx.array) -> mx.array:
        return mx.argmax(x, axis=-1)

    sampled = _sample_grouped(logprobs, [highest, lowest, lowest, highest])
    assert sampled.tolist() == [2, 2, 2, 1]
    seeded = make_seeded_sampler(1.0, 0.0, 0, 0.0, seed=5)
    alone = make_seeded_sampler(1.0, 0.0, 0, 0.0, seed=5)(logprobs[2:3]).tolist()
    assert _sample_grouped(logprobs, [highest, lowest, seeded, highest]).tolist()[2] == alone[0]
