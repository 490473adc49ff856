"""The rule for holding admission in a step that hands out first tokens."""

from __future__ import annotations

import pytest

from engine_worker.sched.pacer import AdmissionPacer


def _pacer(admit_ms: float, decode_ms: float) -> AdmissionPacer:
    pacer = AdmissionPacer()
    pacer.record(admit_ms / 1000, prompt_work=True)
    pacer.record(decode_ms / 1000, prompt_work=False)
    return pacer


def test_it_holds_until_both_kinds_of_step_have_been_measured():
    pacer = AdmissionPacer()
    assert pacer.hold(due=1, waiting=500)
    pacer.record(0.010, prompt_work=True)
    assert pacer.hold(due=1, waiting=500)
    pacer.record(0.002, prompt_work=False)
    assert not pacer.hold(due=1, waiting=500)


def test_it_holds_while_the_due_first_tokens_gain_more_than_the_queue_pays():
    pacer = _pacer(admit_ms=10, decode_ms=2)  # holding gains each due request 8 ms, costs each waiter 2
    assert pacer.hold(due=8, waiting=31)
    assert not pacer.hold(due=8, waiting=32)
    assert not pacer.hold(due=8, waiting=200)
    assert pacer.hold(due=1, waiting=3) and not pacer.hold(due=1, waiting=4)


def test_nothing_is_held_without_first_tokens_due_or_anyone_waiting():
    pacer = _pacer(admit_ms=10, decode_ms=2)
    assert not pacer.hold(due=0, waiting=5)
    assert not pacer.hold(due=8, waiting=0)


def test_admission_steps_no_dearer_than_decodes_are_never_held():
    assert not _pacer(admit_ms=2, decode_ms=2).hold(due=8, waiting=1)


def test_the_averages_follow_the_recent_steps():
    pacer = _pacer(admit_ms=10, decode_ms=2)
    for _ in range(30):
        pacer.record(0.040, prompt_work=True)
    assert pacer.admit_s == pytest.approx(0.040, rel=0.01)
    assert pacer.decode_s == pytest.approx(0.002)
