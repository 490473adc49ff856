"""The start-up heap is frozen out of the garbage collector's scans once per process."""

from __future__ import annotations

import gc

from engine_worker.engine import core as engine_module
from engine_worker.engine import heap


def test_the_first_freeze_moves_live_objects_out_of_gc_scans_and_later_calls_do_nothing(monkeypatch):
    monkeypatch.setattr(heap, "_frozen", False)
    gc.unfreeze()
    try:
        assert heap.freeze_startup_heap() is True
        frozen = gc.get_freeze_count()
        assert frozen > 0
        # A second call freezes nothing more. (The count itself may drop: a frozen object that
        # another thread releases leaves the permanent generation.)
        freezes = []
        monkeypatch.setattr(gc, "freeze", lambda: freezes.append(1))
        assert heap.freeze_startup_heap() is False
        assert freezes == []
        assert gc.get_freeze_count() <= frozen
    finally:
        monkeypatch.undo()
        gc.freeze()  # leave the process frozen, as the first engine start left it


def test_starting_an_engine_freezes_the_heap(monkeypatch, tiny_model):
    calls = []
    monkeypatch.setattr(engine_module, "freeze_startup_heap", lambda: calls.append(1))
    model, tokenizer = tiny_model
    engine = engine_module.EngineCore(model, tokenizer)
    try:
        engine.start()
        assert calls == [1]
    finally:
        engine.close()
