"""Code written against the seed's documented signatures finds the same names and parameters."""

from __future__ import annotations

import inspect

from engine_worker import engine_core, scheduler


def _params(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def test_scheduler_module_exports_and_methods():
    for name in ("Scheduler", "SchedulerConfig", "SchedulerOutput", "SchedulingPolicy"):
        assert hasattr(scheduler, name)
    s = scheduler.Scheduler
    assert _params(s.__init__)[:3] == ["model", "tokenizer", "config"]
    for method in ("add_request", "abort_request", "step", "has_requests", "get_num_waiting", "get_num_running",
                   "get_request", "remove_finished_request", "get_running_requests_info", "get_stats",
                   "get_cache_stats", "clear_runtime_caches", "reset", "deep_reset", "save_cache_to_disk",
                   "load_cache_from_disk", "clear_prefix_cache"):
        assert callable(getattr(s, method)), method
    assert _params(s.step) == ["max_retries"]
    assert list(scheduler.SchedulerOutput.__dataclass_fields__) == [
        "scheduled_request_ids", "num_scheduled_tokens", "finished_request_ids", "outputs", "has_work"]


def test_engine_core_signatures_match_the_seed():
    e = engine_core.EngineCore
    assert _params(e.__init__)[:5] == ["model", "tokenizer", "config", "engine_id", "force_model_ownership"]
    assert _params(e.add_request)[:6] == ["prompt", "sampling_params", "request_id", "images", "videos",
                                          "prefix_boundary"]
    assert _params(e.stream_outputs) == ["request_id", "timeout"]
    assert _params(e.generate) == ["prompt", "sampling_params", "request_id", "kwargs"]
    assert _params(e.generate_batch_sync) == ["prompts", "sampling_params"]
    for method in ("start", "stop", "abort_request", "get_stats", "get_cache_stats", "close", "is_running",
                   "save_cache_to_disk", "load_cache_from_disk", "clear_runtime_caches", "clear_prefix_cache"):
        assert callable(getattr(e, method)), method
    for name in ("EngineConfig", "AsyncEngineCore"):
        assert hasattr(engine_core, name)
    a = engine_core.AsyncEngineCore
    assert _params(a.__init__) == ["model", "tokenizer", "config"]
    assert hasattr(a, "__aenter__") and hasattr(a, "__aexit__")
