"""A streamed completion across its job's restart: the new attempt's repeat of what was sent is
held back, what follows it is sent, and other text is an error (api/openai_api/continuity.py)."""

from __future__ import annotations

import pytest

from api.openai_api.continuity import Diverged, StreamContinuity


def _sent_then_reset(*chunks: str) -> StreamContinuity:
    stream = StreamContinuity()
    assert [stream.text(c) for c in chunks] == list(chunks)
    stream.reset()
    return stream


def test_a_new_attempt_that_repeats_the_text_sends_only_what_comes_after_it():
    stream = _sent_then_reset("Once", " upon")

    sent = [stream.text(c) for c in ("On", "ce up", "on a", " time")]

    assert sent == ["", "", " a", " time"]
    assert stream.sent == "Once upon a time"
    stream.end()


def test_a_new_attempt_that_ends_where_the_first_did_ends_the_stream_normally():
    stream = _sent_then_reset("Once", " upon")

    assert stream.text("Once upon") == ""
    stream.end()


@pytest.mark.parametrize("chunks", [["Twice"], ["Once", " up", "side"], ["Once up", "ward"]])
def test_a_new_attempt_with_other_text_diverges(chunks):
    stream = _sent_then_reset("Once", " upon")

    with pytest.raises(Diverged):
        for chunk in chunks:
            stream.text(chunk)


def test_a_new_attempt_that_ends_short_of_what_was_sent_diverges():
    stream = _sent_then_reset("Once", " upon")
    stream.text("Once")

    with pytest.raises(Diverged):
        stream.end()


def test_a_reset_before_any_text_changes_nothing():
    stream = StreamContinuity()
    stream.reset()

    assert stream.text("Once") == "Once"
    stream.end()
