"""The engine worker's admission thread: ids handed over by run_job are claimed in batches."""

from __future__ import annotations

import threading
import time

from api.streaming.admission import AdmissionThread


def test_ids_waiting_together_are_admitted_in_one_batch_in_arrival_order():
    batches: list[list[str]] = []
    done = threading.Event()

    def admit(batch: list[str]) -> None:
        batches.append(batch)
        if sum(map(len, batches)) == 5:
            done.set()

    admission = AdmissionThread(admit)
    for i in range(5):  # all queued before the thread runs: one batch
        assert admission.put(f"job-{i}")
    admission.start()
    assert done.wait(5)
    assert batches == [[f"job-{i}" for i in range(5)]]
    assert admission.stop(5) == []


def test_batches_are_capped_and_a_failing_batch_does_not_stop_the_thread():
    batches: list[list[str]] = []
    done = threading.Event()

    def admit(batch: list[str]) -> None:
        batches.append(batch)
        if len(batches) == 1:
            raise RuntimeError("database down")
        if sum(map(len, batches)) == 7:
            done.set()

    admission = AdmissionThread(admit, max_batch=3)
    for i in range(7):
        admission.put(str(i))
    admission.start()
    assert done.wait(5)
    assert batches == [["0", "1", "2"], ["3", "4", "5"], ["6"]]
    admission.stop(5)


def test_stop_finishes_what_was_queued_and_refuses_new_ids():
    started, release = threading.Event(), threading.Event()
    batches: list[list[str]] = []

    def admit(batch: list[str]) -> None:
        batches.append(batch)
        started.set()
        release.wait(5)

    admission = AdmissionThread(admit)
    admission.start()
    admission.put("a")
    assert started.wait(5)
    admission.put("b")  # waits behind the batch in progress
    admission.put("c")
    stopper = threading.Thread(target=lambda: left.extend(admission.stop(5)))
    left: list[str] = []
    stopper.start()
    release.set()
    stopper.join(10)
    # Ids queued before the stop are still admitted (the stop marker is behind them).
    assert batches == [["a"], ["b", "c"]] and left == []
    assert admission.put("d") is False


def test_a_thread_that_never_ran_hands_every_id_back():
    admission = AdmissionThread(lambda batch: None)
    admission.put("x")
    admission.put("y")
    assert admission.stop(0.1) == ["x", "y"]


def test_wake_ups_waiting_together_make_one_claim_with_the_ids_beside_them():
    calls: list[tuple[list[str], bool]] = []
    done = threading.Event()

    def admit(batch: list[str], woken: bool = False) -> None:
        calls.append((batch, woken))
        if len(calls) == 2:
            done.set()

    admission = AdmissionThread(admit)
    admission.wake()
    admission.put("a")
    admission.wake()
    admission.start()
    while not calls:  # the first batch took all three; then a wake-up alone
        threading.Event().wait(0.01)
    admission.wake()
    admission.wake()
    assert done.wait(5)
    assert calls[0] == (["a"], True)
    assert calls[1] == ([], True)
    admission.stop(5)
    admission.wake()  # stopped: ignored, and nothing is handed back for it
    assert admission.stop(0.1) == [] and len(calls) == 2


class TimedBatches:
    """An ``admit_batch`` that records when each batch came; ``claims(batch)`` says whether it
    claimed."""

    def __init__(self, claims) -> None:
        self.batches: list[tuple[float, list[str]]] = []
        self.two = threading.Event()
        self._claims = claims

    def __call__(self, batch: list[str]) -> bool:
        self.batches.append((time.monotonic(), batch))
        if len(self.batches) == 2:
            self.two.set()
        return self._claims(batch)

    def wait_for_first(self) -> None:
        deadline = time.monotonic() + 5
        while not self.batches and time.monotonic() < deadline:
            time.sleep(0.005)


def test_a_claim_sooner_than_the_interval_after_the_last_waits_and_takes_what_came_meanwhile():
    admit = TimedBatches(lambda batch: True)  # each batch claimed
    admission = AdmissionThread(admit, min_interval_s=0.3)
    admission.start()
    admission.put("a")
    admit.wait_for_first()
    admission.put("b")
    time.sleep(0.05)
    admission.put("c")  # arrives while "b" waits out the interval
    assert admit.two.wait(5)
    (first_at, first), (second_at, second) = admit.batches
    assert first == ["a"] and second == ["b", "c"]
    assert second_at - first_at >= 0.3
    admission.stop(5)


def test_a_batch_that_claimed_nothing_does_not_hold_the_next_one_back():
    admit = TimedBatches(lambda batch: batch != ["held"])  # an id the worker held already: no claim
    admission = AdmissionThread(admit, min_interval_s=5.0)
    admission.start()
    admission.put("held")
    admit.wait_for_first()
    admission.put("new")
    assert admit.two.wait(2)  # not 5 s later
    assert admit.batches[1][0] - admit.batches[0][0] < 1.0
    admission.stop(5)
