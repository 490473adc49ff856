"""ChunkCoalescer: one chunk per job per batch, seq 1, 2, 3..., finals carry the streamed text."""

from __future__ import annotations

from engine_worker.common.request import RequestOutput
from engine_worker.runtime.coalesce import ChunkCoalescer


def out(rid: str, text: str, n: int, *, finished: bool = False, reason: str | None = None) -> RequestOutput:
    return RequestOutput(
        request_id=rid, new_token_ids=[1] if text else [], new_text=text, completion_tokens=n,
        prompt_tokens=5, finished=finished, finish_reason=reason,
    )


def test_tokens_of_one_step_become_one_chunk_per_job():
    co = ChunkCoalescer(clock=lambda: 100.0)
    co.track("a", 5)
    co.track("b", 5)
    batch = co.fold([[out("a", "He", 1), out("b", "X", 1), out("a", "llo", 2)]])
    assert [(c.job_id, c.seq, c.text) for c in batch.chunks] == [("a", 1, "Hello"), ("b", 1, "X")]
    assert {f.job_id for f in batch.first_tokens} == {"a", "b"}


def test_several_steps_folded_when_the_io_thread_lags_still_number_chunks_consecutively():
    co = ChunkCoalescer()
    co.track("a", 5)
    first = co.fold([[out("a", "x", 1)]])
    lagged = co.fold([[out("a", "y", 2)], [out("a", "z", 3)]])
    assert [c.seq for c in first.chunks + lagged.chunks] == [1, 2]
    assert lagged.chunks[0].text == "yz"
    assert lagged.chunks[0].completion_tokens == 3
    assert lagged.first_tokens == ()


def test_final_follows_its_last_chunk_and_holds_exactly_the_streamed_text():
    co = ChunkCoalescer()
    co.track("a", 5)
    b1 = co.fold([[out("a", "ab", 1)]])
    b2 = co.fold([[out("a", "", 2)], [out("a", "c", 3, finished=True, reason="length")]])
    assert [c.text for c in b2.chunks] == ["c"]
    final = b2.finals[0]
    assert final.text == "".join(c.text for c in b1.chunks + b2.chunks) == "abc"
    assert (final.finish_reason, final.last_seq, final.completion_tokens, final.prompt_tokens) == ("length", 2, 3, 5)


def test_steps_without_new_text_emit_no_chunk():
    co = ChunkCoalescer()
    co.track("a", 5)
    batch = co.fold([[out("a", "", 1)]])  # e.g. half of a multi-byte character
    assert batch.chunks == ()
    assert len(batch.first_tokens) == 1


def test_cancel_ends_with_streamed_text_and_later_outputs_are_dropped():
    co = ChunkCoalescer()
    co.track("a", 5)
    co.fold([[out("a", "hi", 1)]])
    final = co.cancel("a")
    assert (final.finish_reason, final.text, final.last_seq) == ("abort", "hi", 1)
    assert not co.fold([[out("a", "late", 2, finished=True, reason="abort")]])
    assert co.cancel("a") is None


def test_untracked_jobs_are_ignored():
    co = ChunkCoalescer()
    assert not co.fold([[out("ghost", "boo", 1, finished=True, reason="stop")]])


def test_a_jobs_log_probabilities_collect_over_its_steps_into_its_final_and_a_cancel_keeps_them():
    from engine_worker.runner.logprobs import TokenLogprob

    def asking(rid: str, n: int, **kw) -> RequestOutput:
        o = out(rid, "t", n, **kw)
        o.new_logprobs = [TokenLogprob(n, -0.5 * n, ((n, -0.5 * n), (9, -3.0)))]
        return o

    co = ChunkCoalescer()
    for rid in ("a", "b", "plain"):
        co.track(rid, 5)
    co.fold([[asking("a", 1), asking("b", 1), out("plain", "p", 1)]])
    batch = co.fold([[asking("a", 2)], [asking("a", 3, finished=True, reason="length"),
                                       out("plain", "q", 2, finished=True, reason="length")]])

    finals = {f.job_id: f for f in batch.finals}
    assert finals["a"].logprobs == ((1, -0.5, ((1, -0.5), (9, -3.0))), (2, -1.0, ((2, -1.0), (9, -3.0))),
                                    (3, -1.5, ((3, -1.5), (9, -3.0))))
    assert finals["plain"].logprobs is None  # it did not ask
    assert co.cancel("b").logprobs == ((1, -0.5, ((1, -0.5), (9, -3.0))),)


def test_each_chunk_carries_its_tokens_log_probabilities_and_a_token_without_text_goes_with_the_next():
    from engine_worker.runner.logprobs import TokenLogprob

    def asking(rid: str, text: str, n: int, **kw) -> RequestOutput:
        o = out(rid, text, n, **kw)
        o.new_logprobs = [TokenLogprob(n, -float(n))]
        return o

    co = ChunkCoalescer()
    co.track("a", 5)
    first = co.fold([[asking("a", "x", 1)], [asking("a", "", 2)]])  # token 2's text is held back
    second = co.fold([[asking("a", "yz", 3, finished=True, reason="length")]])

    assert [c.logprobs for c in first.chunks] == [((1, -1.0, ()), (2, -2.0, ()))]
    assert [c.logprobs for c in second.chunks] == [((3, -3.0, ()),)]
    assert second.finals[0].logprobs == ((1, -1.0, ()), (2, -2.0, ()), (3, -3.0, ()))
    plain = ChunkCoalescer()
    plain.track("b", 5)
    assert plain.fold([[out("b", "x", 1)]]).chunks[0].logprobs is None


def test_log_probabilities_of_last_tokens_without_text_go_out_in_an_empty_last_chunk():
    from engine_worker.runner.logprobs import TokenLogprob

    co = ChunkCoalescer()
    co.track("a", 5)
    o1 = out("a", "x", 1)
    o1.new_logprobs = [TokenLogprob(1, -1.0)]
    o2 = out("a", "", 2, finished=True, reason="stop")  # e.g. the token that completed a stop string
    o2.new_logprobs = [TokenLogprob(2, -2.0)]

    first = co.fold([[o1]])
    last = co.fold([[o2]])

    assert [(c.text, c.logprobs) for c in last.chunks] == [("", ((2, -2.0, ()),))]
    assert last.finals[0].text == "x" and last.finals[0].last_seq == 2
    assert [e for c in first.chunks + last.chunks for e in c.logprobs] == list(last.finals[0].logprobs)
