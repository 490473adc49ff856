"""Stops: EOS, per-request stop token ids and stop strings; the stop itself is never returned."""

from __future__ import annotations

from engine_worker.common.request import Request, SamplingParams
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, force_tokens, greedy, prompt_ids, run_scheduler

EOS = 2
NIHON_E = [167, 250, 103, 167, 255, 110, 132, 107]  # "日本é", one token per UTF-8 byte


def _one(model, tokenizer, sp: SamplingParams, prompt=None):
    scheduler = Scheduler(model, tokenizer)
    prompt = prompt or prompt_ids(tokenizer, 12)
    outs = run_scheduler(scheduler, {0: [Request("r", prompt, sp)]})["r"]
    return outs, final(outs)


def test_eos_token_finishes_with_stop_and_is_neither_output_nor_text(tiny_model):
    model, tokenizer = tiny_model
    forced = [11, 12, 13, EOS, 14]
    outs, out = _one(model, tokenizer, greedy(20, logits_processors=[force_tokens(forced)]))
    assert out.finish_reason == "stop"
    assert out.output_token_ids == [11, 12, 13]
    assert out.completion_tokens == 3
    assert "eos" not in out.output_text
    assert "".join(o.new_text for o in outs) == out.output_text == tokenizer.decode([11, 12, 13])


def test_ignore_eos_runs_to_max_tokens(tiny_model):
    model, tokenizer = tiny_model
    forced = [11, EOS, 12, EOS]
    _, out = _one(model, tokenizer, greedy(6, ignore_eos=True, logits_processors=[force_tokens(forced)]))
    assert out.finish_reason == "length"
    assert out.output_token_ids[:4] == forced and len(out.output_token_ids) == 6


def test_per_request_stop_token_id_stops_only_that_request(tiny_model):
    model, tokenizer = tiny_model
    prompt = prompt_ids(tokenizer, 12)
    forced = [21, 22, 23, 24, 25, 26]
    scheduler = Scheduler(model, tokenizer)
    outs = run_scheduler(scheduler, {0: [
        Request("stops", prompt, greedy(10, stop_token_ids=[24], logits_processors=[force_tokens(forced)])),
        Request("goes_on", list(prompt), greedy(10, ignore_eos=True, logits_processors=[force_tokens(forced)])),
    ]})
    stopped, other = final(outs["stops"]), final(outs["goes_on"])
    assert stopped.finish_reason == "stop" and stopped.output_token_ids == [21, 22, 23]
    assert other.finish_reason == "length" and other.output_token_ids[:6] == forced


def test_stop_string_truncates_text_and_is_never_streamed(tiny_model):
    model, tokenizer = tiny_model
    prompt = prompt_ids(tokenizer, 12)
    # Words of several tokens each, so the stop string spans token boundaries.
    words = tokenizer.encode("alpha beta gamma delta epsilon zeta", add_special_tokens=False)
    full_text = tokenizer.decode(words)
    stop = "mma del"
    cut = full_text.index(stop)
    outs, out = _one(model, tokenizer, greedy(len(words) + 5, stop=[stop], logits_processors=[force_tokens(words)]),
                     prompt)
    assert out.finish_reason == "stop"
    assert out.output_text == full_text[:cut]
    streamed = "".join(o.new_text for o in outs)
    assert streamed == out.output_text
    assert all(stop not in o.new_text for o in outs)


def test_length_finish_reports_length_and_full_text(tiny_model):
    model, tokenizer = tiny_model
    outs, out = _one(model, tokenizer, greedy(5, ignore_eos=True))
    assert out.finish_reason == "length" and out.completion_tokens == 5
    assert "".join(o.new_text for o in outs) == out.output_text == tokenizer.decode(out.output_token_ids)


def test_multibyte_characters_split_across_tokens_never_stream_broken(tiny_model):
    model, tokenizer = tiny_model
    outs, out = _one(model, tokenizer, greedy(len(NIHON_E), logits_processors=[force_tokens(NIHON_E)]))
    pieces = [o.new_text for o in outs]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == out.output_text == "日本é"
    # The bytes really arrived one per step: some steps released no text at all.
    assert "" in pieces[:-1]
