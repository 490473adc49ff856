"""Failures stay local: typed errors, one failed request never disturbs the others."""

from __future__ import annotations

import pytest

from engine_worker.cache.protocol import PrefixCacheBackend
from engine_worker.common.errors import DuplicateRequest, PromptTooLong, RequestError, UnsupportedInput
from engine_worker.common.request import Request, RequestStatus
from engine_worker.sched.admission import RequestValidator
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, greedy, prompt_ids, run_scheduler, solo_tokens


class PickyTokenizer:
    """Wraps the real tokenizer; fails on one prompt, as a broken tokenizer would."""

    def __init__(self, inner):
        self._inner = inner

    def encode(self, text, **kw):
        if "\x00" in text:
            raise RuntimeError("cannot encode NUL")
        return self._inner.encode(text, **kw)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _with_healthy_neighbour(model, tokenizer, bad: Request, scheduler_tokenizer=None):
    good_prompt = prompt_ids(tokenizer, 9)
    scheduler = Scheduler(model, scheduler_tokenizer or tokenizer)
    outputs = run_scheduler(scheduler, {0: [Request("good", good_prompt, greedy(8))], 1: [bad]})
    assert final(outputs["good"]).output_token_ids == solo_tokens(model, tokenizer, good_prompt, 8)
    out = final(outputs[bad.request_id])
    assert out.finish_reason == "error" and out.output_token_ids == []
    assert scheduler.get_request(bad.request_id).status == RequestStatus.FINISHED_ERROR
    return out


def test_prompt_longer_than_the_context_fails_alone_with_a_message(tiny_model):
    model, tokenizer = tiny_model
    out = _with_healthy_neighbour(model, tokenizer, Request("huge", [5] * 4097, greedy(4)))
    assert "4097" in out.error and "4096" in out.error


def test_tokenizer_error_fails_only_that_request(tiny_model):
    model, tokenizer = tiny_model
    out = _with_healthy_neighbour(model, tokenizer, Request("nul", "a\x00b", greedy(4)),
                                  scheduler_tokenizer=PickyTokenizer(tokenizer))
    assert "tokenizer" in out.error


@pytest.mark.parametrize("fields", [{"images": ["cat.png"]}, {"videos": ["cat.mp4"]}, {"pixel_values": [[0.5]]},
                                    {"is_multimodal": True}])
def test_multimodal_request_is_refused_with_a_typed_error_naming_its_input(tiny_model, fields):
    model, tokenizer = tiny_model
    [(name, _)] = fields.items()
    with pytest.raises(UnsupportedInput) as refused:
        RequestValidator(tokenizer, None, None).prepare(Request("mm", "describe", greedy(4), **fields))
    assert refused.value.what == name and refused.value.request_id == "mm"
    out = _with_healthy_neighbour(model, tokenizer, Request("mm", "describe", greedy(4), **fields))
    assert out.error == str(refused.value) and name in out.error and "multimodal" in out.error


@pytest.mark.parametrize("bad", [
    Request("empty", [], greedy(4)),
    Request("zero", [5, 6], greedy(0)),
    Request("oov", [5, 999_999], greedy(4)),
])
def test_invalid_requests_fail_alone(tiny_model, bad):
    model, tokenizer = tiny_model
    assert _with_healthy_neighbour(model, tokenizer, bad).error


def test_duplicate_request_id_is_refused_without_disturbing_the_first(tiny_model):
    model, tokenizer = tiny_model
    p = prompt_ids(tokenizer, 7)
    scheduler = Scheduler(model, tokenizer)
    scheduler.add_request(Request("same", p, greedy(6)))
    scheduler.step()
    with pytest.raises(DuplicateRequest) as info:
        scheduler.add_request(Request("same", prompt_ids(tokenizer, 3), greedy(2)))
    assert isinstance(info.value, RequestError) and info.value.request_id == "same"
    assert final(run_scheduler(scheduler)["same"]).output_token_ids == solo_tokens(model, tokenizer, p, 6)


def test_prompt_too_long_carries_its_numbers():
    err = PromptTooLong(limit=10, length=12)
    assert (err.limit, err.length) == (10, 12) and isinstance(err, ValueError)


class BrokenCache(PrefixCacheBackend):
    name = "prefix_cache"
    active = True

    def fetch(self, tokens):
        raise OSError("disk gone")

    def store(self, tokens, cache_layers):
        raise MemoryError("no room")

    def get_stats(self):
        return {}

    def clear(self):
        pass


def test_a_failing_prefix_cache_never_fails_a_request(tiny_model):
    model, tokenizer = tiny_model
    p = prompt_ids(tokenizer, 10)
    scheduler = Scheduler(model, tokenizer, prefix_cache=BrokenCache())
    out = final(run_scheduler(scheduler, {0: [Request("r", p, greedy(5))]})["r"])
    assert out.output_token_ids == solo_tokens(model, tokenizer, p, 5)
    assert scheduler.get_stats()["counters"]["num_cache_errors"] == 2


def test_an_unbatchable_cache_hit_is_dropped_instead_of_failing_the_batch(tiny_model):
    from mlx_lm.models.cache import QuantizedKVCache

    model, tokenizer = tiny_model
    p = prompt_ids(tokenizer, 12)

    class QuantizedHit(BrokenCache):
        def fetch(self, tokens):
            return [QuantizedKVCache() for _ in model.layers], list(tokens[4:]), "prefix"

        def store(self, tokens, cache_layers):
            pass

    scheduler = Scheduler(model, tokenizer, prefix_cache=QuantizedHit())
    outputs = run_scheduler(scheduler, {0: [Request("r", p, greedy(5)), Request("n", prompt_ids(tokenizer, 7), greedy(3))]})
    out = final(outputs["r"])
    assert out.output_token_ids == solo_tokens(model, tokenizer, p, 5) and out.cached_tokens == 0
    assert final(outputs["n"]).finish_reason in ("stop", "length")


def test_a_raising_logits_processor_fails_only_its_own_request(tiny_model):
    model, tokenizer = tiny_model
    p = prompt_ids(tokenizer, 9)
    calls = {"n": 0}

    def flaky(tokens, logits):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyError("boom")
        return logits

    scheduler = Scheduler(model, tokenizer)
    outputs = run_scheduler(scheduler, {0: [
        Request("good", p, greedy(8)),
        Request("bad", prompt_ids(tokenizer, 6), greedy(8, ignore_eos=True, logits_processors=[flaky])),
    ]})
    assert final(outputs["good"]).output_token_ids == solo_tokens(model, tokenizer, p, 8)
    bad = final(outputs["bad"])
    assert bad.finish_reason == "error" and "boom" in bad.error
    assert bad.completion_tokens < 8
