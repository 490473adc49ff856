"""Sampling settings are per request: they never leak, greedy stays greedy, seeds reproduce."""

from __future__ import annotations

import pytest

from engine_worker.common.request import Request, SamplingParams
from engine_worker.runner.sampling import SamplingFactory
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, greedy, prompt_ids, run_scheduler, solo_tokens

N = 24


def _run(model, tokenizer, requests):
    scheduler = Scheduler(model, tokenizer)
    outputs = run_scheduler(scheduler, {0: requests})
    return {rid: final(outs).output_token_ids for rid, outs in outputs.items()}


def test_greedy_request_is_identical_to_its_solo_run_beside_sampled_ones(tiny_model):
    model, tokenizer = tiny_model
    p = prompt_ids(tokenizer, 20)
    hot = dict(max_tokens=N, temperature=1.5, ignore_eos=True)
    got = _run(model, tokenizer, [
        Request("hot1", prompt_ids(tokenizer, 9), SamplingParams(top_p=0.95, **hot)),
        Request("greedy", p, greedy(N)),
        Request("hot2", prompt_ids(tokenizer, 14), SamplingParams(top_k=50, min_p=0.01, repetition_penalty=1.3, **hot)),
    ])
    assert got["greedy"] == solo_tokens(model, tokenizer, p, N)


def test_seeded_request_is_reproducible_whatever_runs_beside_it(tiny_model):
    model, tokenizer = tiny_model
    p = prompt_ids(tokenizer, 15)
    seeded = dict(max_tokens=N, temperature=1.0, top_p=1.0, seed=1234, ignore_eos=True)
    alone = _run(model, tokenizer, [Request("s", p, SamplingParams(**seeded))])["s"]
    crowded = _run(model, tokenizer, [
        Request("noise1", prompt_ids(tokenizer, 8), SamplingParams(max_tokens=N, temperature=1.0, ignore_eos=True)),
        Request("s", p, SamplingParams(**seeded)),
        Request("noise2", prompt_ids(tokenizer, 30), greedy(N)),
    ])["s"]
    other_seed = _run(model, tokenizer, [Request("s", p, SamplingParams(**{**seeded, "seed": 99}))])["s"]
    assert alone == crowded
    assert alone != other_seed  # the seed is really what decides the draws
    assert alone != solo_tokens(model, tokenizer, p, N)  # and it really sampled


def test_top_k_of_one_samples_the_argmax_so_per_request_top_k_reaches_the_sampler(tiny_model):
    model, tokenizer = tiny_model
    p = prompt_ids(tokenizer, 12)
    got = _run(model, tokenizer, [
        Request("k1", p, SamplingParams(max_tokens=N, temperature=2.0, top_k=1, ignore_eos=True)),
        Request("free", p, SamplingParams(max_tokens=N, temperature=2.0, ignore_eos=True)),
    ])
    assert got["k1"] == solo_tokens(model, tokenizer, p, N)
    assert got["free"] != got["k1"]


def test_repetition_penalty_applies_only_to_its_own_request(tiny_model):
    model, tokenizer = tiny_model
    p = prompt_ids(tokenizer, 10)
    got = _run(model, tokenizer, [
        Request("plain", p, greedy(N, ignore_eos=True)),
        Request("penalized", list(p), greedy(N, ignore_eos=True, repetition_penalty=5.0)),
    ])
    plain = solo_tokens(model, tokenizer, p, N)
    assert got["plain"] == plain
    assert got["penalized"] != plain
    # A strong penalty stops the random model's habit of repeating one token back to back.
    repeats = sum(a == b for a, b in zip(got["penalized"], got["penalized"][1:], strict=False))
    assert repeats < sum(a == b for a, b in zip(plain, plain[1:], strict=False))


def test_logit_bias_forces_or_bans_tokens_of_its_own_request_only(tiny_model):
    model, tokenizer = tiny_model
    p = prompt_ids(tokenizer, 10)
    plain = solo_tokens(model, tokenizer, p, N)
    banned = sorted(set(plain))[:3]  # tokens the greedy run emits
    got = _run(model, tokenizer, [
        Request("plain", p, greedy(N, ignore_eos=True)),
        Request("forced", list(p), greedy(N, ignore_eos=True, logit_bias={77: 100.0})),
        Request("banned", list(p), greedy(N, ignore_eos=True, logit_bias={t: -100.0 for t in banned})),
    ])
    assert got["plain"] == plain
    assert got["forced"] == [77] * N
    assert got["banned"] != plain and not set(got["banned"]) & set(banned)


def test_frequency_and_presence_penalties_keep_tokens_of_the_last_20_from_coming_back(tiny_model):
    # Far above the API's range of [-2, 2], so that the effect is certain: a token seen in the
    # last 20 of the sequence (prompt included, as mlx-lm counts) is never picked again.
    model, tokenizer = tiny_model
    p = prompt_ids(tokenizer, 10)
    plain = solo_tokens(model, tokenizer, p, N)
    got = _run(model, tokenizer, [
        Request("frequency", p, greedy(N, ignore_eos=True, frequency_penalty=1000.0)),
        Request("presence", list(p), greedy(N, ignore_eos=True, presence_penalty=1000.0)),
        Request("plain", list(p), greedy(N, ignore_eos=True)),
    ])
    assert got["plain"] == plain and len(set(plain[-20:])) < 20  # the random model repeats itself
    for name in ("frequency", "presence"):
        sequence = p + got[name]
        for i in range(len(p), len(sequence)):
            assert sequence[i] not in sequence[max(0, i - 20):i], (name, i)


def test_identical_settings_share_one_sampler_object_so_batches_sample_in_one_call():
    factory = SamplingFactory([2])
    a = factory.sampler(SamplingParams(temperature=0.8, top_p=0.9))
    b = factory.sampler(SamplingParams(temperature=0.8, top_p=0.9))
    c = factory.sampler(SamplingParams(temperature=0.8, top_p=0.5))
    assert a is b and a is not c
    assert factory.sampler(SamplingParams(temperature=0.0)) is None  # the generator's greedy default
    s1 = factory.sampler(SamplingParams(temperature=0.8, seed=1))
    s2 = factory.sampler(SamplingParams(temperature=0.8, seed=1))
    assert s1 is not s2  # each seeded request owns its key chain


def test_log_probabilities_come_with_each_token_of_a_request_that_asks_and_only_of_that_one(tiny_model):
    model, tokenizer = tiny_model
    p = prompt_ids(tokenizer, 10)
    scheduler = Scheduler(model, tokenizer)
    outputs = run_scheduler(scheduler, {0: [
        Request("asks", p, greedy(N, ignore_eos=True, logprobs=3)),
        Request("own", list(p), greedy(N, ignore_eos=True, logprobs=0)),
        Request("plain", list(p), greedy(N, ignore_eos=True)),
        Request("forced", list(p), greedy(N, ignore_eos=True, logprobs=1, logit_bias={77: 100.0})),
    ]})
    entries = {rid: [e for o in outs for e in (o.new_logprobs or [])] for rid, outs in outputs.items()}

    tokens = final(outputs["asks"]).output_token_ids
    assert tokens == solo_tokens(model, tokenizer, p, N)  # asking changes nothing about the tokens
    assert [e.token_id for e in entries["asks"]] == tokens
    for e in entries["asks"]:
        assert len(e.top) == 3 and e.logprob <= 0
        assert e.top[0] == (e.token_id, pytest.approx(e.logprob))  # greedy: the chosen token is the likeliest
        assert [lp for _, lp in e.top] == sorted((lp for _, lp in e.top), reverse=True)
    assert [(e.token_id, e.top) for e in entries["own"]] == [(t, ()) for t in tokens]
    assert [e.logprob for e in entries["own"]] == pytest.approx([e.logprob for e in entries["asks"]], abs=1e-5)
    assert all(o.new_logprobs is None for o in outputs["plain"])
    # A +100 bias makes token 77 all but certain: its log probability is ~0.
    assert all(e.token_id == 77 and e.logprob > -1e-3 for e in entries["forced"])


def test_a_logprobs_count_out_of_range_fails_the_request_alone(tiny_model):
    model, tokenizer = tiny_model
    outputs = run_scheduler(Scheduler(model, tokenizer), {0: [
        Request("bad", prompt_ids(tokenizer, 5), greedy(4, logprobs=21)),
        Request("good", prompt_ids(tokenizer, 5), greedy(4)),
    ]})
    assert final(outputs["bad"]).finish_reason == "error" and "logprobs" in final(outputs["bad"]).error
    assert final(outputs["good"]).finish_reason in {"stop", "length"}
