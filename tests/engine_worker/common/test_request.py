"""Request types: step outputs are O(1) snapshots that behave exactly like eagerly built outputs."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import threading

import pytest

from engine_worker.common.request import (
    OutputText,
    Request,
    RequestOutput,
    RequestStatus,
    SamplingParams,
    step_output,
)
from engine_worker.engine.collectors import merge_outputs


def _running(tokens: list[int], pieces: list[str]) -> Request:
    request = Request("r", [1, 2, 3], SamplingParams(max_tokens=10), num_prompt_tokens=3, cached_tokens=1)
    for token in tokens:
        request.append_output_token(token)
    for piece in pieces:
        request.append_output_text(piece)
    return request


def _eager(request: Request, new_ids: list[int], new_text: str, reason: str | None = None) -> RequestOutput:
    return RequestOutput(request.request_id, new_ids, new_text, list(request.output_token_ids), request.output_text,
                         reason is not None, reason, request.num_prompt_tokens, request.num_output_tokens,
                         cached_tokens=request.cached_tokens)


def test_step_output_equals_reprs_and_asdicts_like_an_eager_output():
    request = _running([7, 8], ["a", "b"])
    expected = _eager(request, [8], "b", "length")
    for read_first in (False, True):
        out = step_output(request, [8], "b", "length")
        if read_first:
            assert out.output_token_ids == [7, 8]
        assert out == expected and expected == out
        assert repr(out) == repr(expected)
        assert dataclasses.asdict(out) == dataclasses.asdict(expected)
        assert dataclasses.astuple(out) == dataclasses.astuple(expected)
        assert out.usage == expected.usage and out.finished


def test_step_output_is_a_snapshot_that_later_appends_never_reach():
    request = _running([7, 8], ["a", "b"])
    out = step_output(request, [8], "b", None)
    request.append_output_token(9)
    request.append_output_text("c")
    assert request.output_text == "abc"  # the join is cached at three pieces now
    assert out.output_token_ids == [7, 8] and out.output_text == "ab"
    assert out.output_token_ids is not request.output_token_ids
    assert out.output_token_ids is out.output_token_ids  # built once
    out.output_token_ids.append(99)  # a consumer's own copy: the request is untouched
    assert request.output_token_ids == [7, 8, 9]


def test_text_reassigned_on_the_request_leaves_earlier_outputs_alone():
    request = _running([7], ["a"])
    out = step_output(request, [7], "a", None)
    request.output_text = "replaced"
    request.append_output_text("!")
    assert out.output_text == "a" and request.output_text == "replaced!"


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_unread_step_output_pickles_its_values_not_the_live_request_state(protocol):
    request = _running([7, 8], ["a", "b"])
    out = step_output(request, [8], "b", None)
    request.append_output_token(9)
    request.append_output_text("c")
    loaded = pickle.loads(pickle.dumps(out, protocol))
    assert loaded == _eager(_running([7, 8], ["a", "b"]), [8], "b")
    assert vars(loaded).keys() == {f.name for f in dataclasses.fields(RequestOutput)}


def test_unread_step_output_copies_and_deep_copies_to_equal_outputs():
    request = _running([7, 8], ["a", "b"])
    out = step_output(request, [8], "b", None)
    expected = _eager(request, [8], "b")
    shallow, deep = copy.copy(out), copy.deepcopy(out)
    request.append_output_token(9)
    assert shallow == expected and deep == expected
    assert dataclasses.replace(out, finished=True) == dataclasses.replace(expected, finished=True)


def test_missing_attributes_still_raise_attribute_error():
    out = step_output(_running([7], ["a"]), [7], "a", None)
    for o in (out, RequestOutput("x")):
        assert not hasattr(o, "no_such_field")
        with pytest.raises(AttributeError, match="no_such_field"):
            _ = o.no_such_field


def test_merging_lagging_step_outputs_keeps_the_totals_lazy_and_right():
    request = _running([], [])
    outs = []
    for token, piece in ((7, "a"), (8, "b"), (9, "c")):
        request.append_output_token(token)
        request.append_output_text(piece)
        outs.append(step_output(request, [token], piece, None))
    request.append_output_token(10)
    merged = merge_outputs(outs[1:])
    assert "output_token_ids" not in vars(merged)  # nothing was copied by the merge
    assert (merged.new_token_ids, merged.new_text) == ([8, 9], "bc")
    assert (merged.output_token_ids, merged.output_text, merged.completion_tokens) == ([7, 8, 9], "abc", 3)
    assert outs[2].new_token_ids == [9]  # the merge did not touch its inputs


def test_snapshots_read_concurrently_get_one_and_the_same_value():
    request = _running(list(range(1000)), [str(i) for i in range(1000)])
    out = step_output(request, [999], "999", None)
    seen: list[tuple[int, int]] = []
    threads = [threading.Thread(target=lambda: seen.append((id(out.output_token_ids), id(out.output_text))))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen)) == 1


def test_request_output_text_reads_writes_and_serializes_as_a_str():
    assert Request("r", "p").output_text == ""
    request = Request("r", "p", output_text="he")
    request.append_output_text("llo")
    assert request.output_text == "hello" and isinstance(request.output_text, str)
    assert "output_text='hello'" in repr(request)
    assert dataclasses.asdict(request)["output_text"] == "hello"
    assert pickle.loads(pickle.dumps(request)).output_text == "hello"
    assert copy.deepcopy(request).output_text == "hello"
    assert dataclasses.replace(request, request_id="s").output_text == "hello"
    assert dataclasses.replace(request, output_text="help").output_text == "help"
    assert "output_text" in {f.name for f in dataclasses.fields(Request)}


def test_output_text_joins_any_prefix_of_its_pieces():
    text = OutputText("a")
    for piece in ("b", "c", "d"):
        text.append(piece)
    assert (text.join(), text.join(2), text.join(0), text.join(4), len(text)) == ("abcd", "ab", "", "abcd", 4)
    assert OutputText().join() == ""


def test_requests_are_equal_and_hashed_by_request_id_alone():
    a = Request("r1", [1, 2], SamplingParams())
    b = Request("r1", "another prompt", SamplingParams(max_tokens=3), priority=5)
    a.append_output_token(9)
    assert a == b and hash(a) == hash(b)
    assert a != Request("r2", [1, 2], SamplingParams()) and a != "r1"
    assert len({a, b, Request("r2", [1])}) == 2
    assert {a: "first"}[b] == "first"
    running = {a}
    a.status = RequestStatus.RUNNING  # its state changes; it stays findable
    a.append_output_token(10)
    assert b in running


def test_num_computed_tokens_starts_as_given_and_counts_every_output_token():
    request = Request("r", [1, 2, 3])
    assert request.num_computed_tokens == 0
    request.append_output_token(5)
    request.output_token_ids.append(6)  # the scheduler's per-token path
    assert request.num_computed_tokens == 2
    resumed = Request("s", [1], num_computed_tokens=7)
    resumed.append_output_token(1)
    assert resumed.num_computed_tokens == 8
    resumed.num_computed_tokens = 3
    assert resumed.num_computed_tokens == 3
    assert dataclasses.asdict(resumed)["num_computed_tokens"] == 3
    assert pickle.loads(pickle.dumps(resumed)).num_computed_tokens == 3
    assert dataclasses.replace(resumed).num_computed_tokens == 3


@pytest.mark.parametrize(("fields", "kind"), [
    ({"images": ["cat.png"]}, "images"),
    ({"videos": ["cat.mp4"]}, "videos"),
    ({"pixel_values": [[0.5]]}, "pixel_values"),
    ({"is_multimodal": True}, "is_multimodal"),
    ({"images": []}, None),
    ({}, None),
])
def test_multimodal_input_names_the_field_that_makes_a_request_multimodal(fields, kind):
    assert Request("r", "describe", **fields).multimodal_input() == kind
