"""Code written against the seed's documented signatures finds the same names and parameters."""

from __future__ import annotations

import dataclasses
import inspect
import time

from engine_worker import engine_core, scheduler
from engine_worker.common.config import EngineConfig, SchedulerConfig, SchedulingPolicy
from engine_worker.request import Request, RequestOutput, RequestStatus, SamplingParams


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


# ---------------------------------------------------------------------------------------------
# Every public name of the seed's documentation (vllm_mlx.scheduler, vllm_mlx.engine_core and the
# request types they use), with the seed's defaults. ``REQUIRED`` marks a parameter without one.
# Additions of ours may follow the seed's parameters; they never replace or reorder them.

REQUIRED = inspect.Parameter.empty

SEED_SCHEDULER_CONFIG = {
    "max_num_seqs": 256, "max_num_batched_tokens": 8192, "policy": SchedulingPolicy.FCFS, "prefill_batch_size": 8,
    "completion_batch_size": 32, "prefill_step_size": 2048, "mllm_prefill_step_size": None,
    "enable_prefix_cache": True, "prefix_cache_size": 100, "use_memory_aware_cache": True, "cache_memory_mb": None,
    "cache_memory_percent": 0.2, "kv_cache_quantization": False, "kv_cache_quantization_bits": 8,
    "kv_cache_quantization_group_size": 64, "kv_cache_min_quantize_tokens": 256, "use_paged_cache": False,
    "paged_cache_block_size": 64, "max_cache_blocks": 1000, "chunked_prefill_tokens": 0,
    "mid_prefill_save_interval": 8192, "ssd_cache_dir": None, "ssd_cache_max_gb": 10.0, "max_kv_size": 0,
    "enable_mtp": False, "mtp_num_draft_tokens": 1, "mtp_optimistic": False,
}
SEED_ENGINE_CONFIG = {"model_name": "", "scheduler_config": None, "step_interval": 0.001, "stream_interval": 1,
                      "gpu_memory_utilization": 0.9}
SEED_SCHEDULER_OUTPUT = {"scheduled_request_ids": [], "num_scheduled_tokens": 0, "finished_request_ids": set(),
                         "outputs": [], "has_work": False}
SEED_SAMPLING_PARAMS = {"max_tokens": 256, "temperature": 0.7, "top_p": 0.9, "top_k": 0, "min_p": 0.0,
                        "presence_penalty": 0.0, "repetition_penalty": 1.0, "stop": [], "stop_token_ids": [],
                        "logits_processors": None}
SEED_REQUEST = {
    "priority": 0, "prompt_token_ids": None, "num_prompt_tokens": 0, "status": RequestStatus.WAITING,
    "num_computed_tokens": 0, "output_token_ids": [], "output_text": "", "batch_uid": None, "prompt_cache": None,
    "cached_tokens": 0, "remaining_tokens": None, "prefix_boundary": 0, "block_table": None,
    "shared_prefix_blocks": 0, "images": None, "videos": None, "pixel_values": None, "is_multimodal": False,
    "finish_reason": None, "first_token_time": None, "cache_hit_type": None,
}
SEED_REQUEST_OUTPUT = {"new_token_ids": [], "new_text": "", "output_token_ids": [], "output_text": "",
                       "finished": False, "finish_reason": None, "prompt_tokens": 0, "completion_tokens": 0,
                       "mtp_drafts": 0, "mtp_accepted": 0}
SEED_SCHEDULER_METHODS = {
    "__init__": [("model", REQUIRED), ("tokenizer", REQUIRED), ("config", None)],
    "add_request": [("request", REQUIRED)], "abort_request": [("request_id", REQUIRED)], "has_requests": [],
    "get_num_waiting": [], "get_num_running": [], "step": [("max_retries", 1)],
    "get_request": [("request_id", REQUIRED)], "remove_finished_request": [("request_id", REQUIRED)],
    "get_running_requests_info": [], "get_stats": [], "get_cache_stats": [], "clear_runtime_caches": [],
    "reset": [], "deep_reset": [], "save_cache_to_disk": [("cache_dir", REQUIRED)],
    "load_cache_from_disk": [("cache_dir", REQUIRED)], "clear_prefix_cache": [], "close_ssd_tier": [],
}
# Documented by the seed, deliberately absent here. promote_from_ssd: the seed's engine never calls
# it; an SSD entry is promoted inside step(), on its own I/O thread (engine_worker/cache/hooks.py).
# CACHE_CORRUPTION_PATTERNS: errors are types here, never matched by message (STYLE.md).
NOT_PORTED = {"Scheduler.promote_from_ssd", "scheduler.CACHE_CORRUPTION_PATTERNS"}
SEED_ENGINE_METHODS = {
    "__init__": [("model", REQUIRED), ("tokenizer", REQUIRED), ("config", None), ("engine_id", None),
                 ("force_model_ownership", True)],
    "start": [], "stop": [], "is_running": [],
    "add_request": [("prompt", REQUIRED), ("sampling_params", None), ("request_id", None), ("images", None),
                    ("videos", None), ("prefix_boundary", 0)],
    "abort_request": [("request_id", REQUIRED)], "stream_outputs": [("request_id", REQUIRED), ("timeout", None)],
    "generate": [("prompt", REQUIRED), ("sampling_params", None), ("request_id", None), ("kwargs", REQUIRED)],
    "generate_batch_sync": [("prompts", REQUIRED), ("sampling_params", None)], "get_stats": [],
    "get_cache_stats": [], "save_cache_to_disk": [("cache_dir", REQUIRED)],
    "load_cache_from_disk": [("cache_dir", REQUIRED)], "clear_runtime_caches": [], "clear_prefix_cache": [],
    "close": [],
}
SEED_ASYNC_ENGINE_METHODS = {
    "__init__": [("model", REQUIRED), ("tokenizer", REQUIRED), ("config", None)],
    "__aenter__": [], "__aexit__": [], "start": [], "stop": [],
    "add_request": [("prompt", REQUIRED), ("sampling_params", None), ("request_id", None), ("kwargs", REQUIRED)],
    "abort_request": [("request_id", REQUIRED)], "stream_outputs": [("request_id", REQUIRED), ("timeout", None)],
    "generate": [("prompt", REQUIRED), ("sampling_params", None)], "get_stats": [], "get_cache_stats": [],
    "save_cache_to_disk": [("cache_dir", REQUIRED)], "load_cache_from_disk": [("cache_dir", REQUIRED)],
    "clear_runtime_caches": [],
}
SEED_COROUTINES = {"add_request", "abort_request", "generate", "stop", "__aenter__", "__aexit__"}


def _defaults(fn) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()
            if p.name != "self" and p.kind is not inspect.Parameter.VAR_POSITIONAL]


def _check_methods(cls, expected: dict[str, list[tuple[str, object]]]) -> None:
    for name, params in expected.items():
        method = getattr(cls, name, None)
        assert callable(method), f"{cls.__name__}.{name} is missing"
        assert _defaults(method)[: len(params)] == params, f"{cls.__name__}.{name}"


def test_seed_dataclasses_have_every_field_with_its_default():
    for cls, fields, build in ((SchedulerConfig, SEED_SCHEDULER_CONFIG, SchedulerConfig),
                               (EngineConfig, SEED_ENGINE_CONFIG, EngineConfig),
                               (scheduler.SchedulerOutput, SEED_SCHEDULER_OUTPUT, scheduler.SchedulerOutput),
                               (SamplingParams, SEED_SAMPLING_PARAMS, SamplingParams)):
        instance = build()
        for name, default in fields.items():
            assert getattr(instance, name) == default, f"{cls.__name__}.{name}"
    assert [m.value for m in SchedulingPolicy] == ["fcfs", "priority"]


def test_request_has_the_seeds_arguments_fields_and_defaults():
    assert [name for name, _ in _defaults(Request)[:5]] == [
        "request_id", "prompt", "sampling_params", "arrival_time", "priority"]
    before = time.time()
    request = Request("r", "p", SamplingParams())
    assert before <= request.arrival_time <= time.time()
    for name, default in SEED_REQUEST.items():
        assert getattr(request, name) == default, f"Request.{name}"
        assert name in {f.name for f in dataclasses.fields(Request)}, f"Request.{name} is not a field"
    assert (request.num_output_tokens, request.num_tokens, request.max_tokens) == (0, 0, 256)
    for method in ("is_finished", "get_finish_reason", "append_output_token", "set_finished"):
        assert callable(getattr(request, method)), method
    assert _defaults(Request.set_finished) == [("status", REQUIRED), ("reason", None)]
    assert Request("b", "p", priority=-1) < Request("a", "p")  # a lower value is more urgent


def test_request_output_and_status_match_the_seed():
    out = RequestOutput("r")
    for name, default in SEED_REQUEST_OUTPUT.items():
        assert getattr(out, name) == default, f"RequestOutput.{name}"
    assert out.usage["total_tokens"] == 0 and {"prompt_tokens", "completion_tokens"} <= set(out.usage)
    seed_order = ["WAITING", "RUNNING", "PREEMPTED", "FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED", "FINISHED_ABORTED"]
    assert [s.name for s in RequestStatus][:6] == seed_order
    assert [RequestStatus.is_finished(RequestStatus[n]) for n in seed_order] == [False] * 3 + [True] * 3
    assert [RequestStatus.get_finish_reason(RequestStatus[n]) for n in seed_order] == [None] * 3 + [
        "stop", "length", "abort"]


def test_scheduler_engine_and_async_engine_have_every_seed_method_with_its_defaults():
    _check_methods(scheduler.Scheduler, SEED_SCHEDULER_METHODS)
    _check_methods(engine_core.EngineCore, SEED_ENGINE_METHODS)
    _check_methods(engine_core.AsyncEngineCore, SEED_ASYNC_ENGINE_METHODS)
    assert isinstance(engine_core.EngineCore.engine_id, property)
    for cls in (engine_core.EngineCore, engine_core.AsyncEngineCore):
        for name in SEED_COROUTINES & set(dir(cls)) - {"stop"}:
            assert inspect.iscoroutinefunction(getattr(cls, name)), f"{cls.__name__}.{name}"
        assert inspect.isasyncgenfunction(cls.stream_outputs)
    missing = {f"Scheduler.{n}" for n in ("promote_from_ssd",) if not hasattr(scheduler.Scheduler, n)}
    missing |= {f"scheduler.{n}" for n in ("CACHE_CORRUPTION_PATTERNS",) if not hasattr(scheduler, n)}
    assert missing == NOT_PORTED
