"""The seed's config dataclasses: same fields, same defaults; env helpers fail loudly."""

from __future__ import annotations

import dataclasses

import pytest

from engine_worker.common.config import EngineConfig, SchedulerConfig, SchedulingPolicy

SEED_SCHEDULER_DEFAULTS = {
    "max_num_seqs": 256, "max_num_batched_tokens": 8192, "policy": SchedulingPolicy.FCFS,
    "prefill_batch_size": 8, "completion_batch_size": 32, "prefill_step_size": 2048,
    "mllm_prefill_step_size": None, "enable_prefix_cache": True, "prefix_cache_size": 100,
    "use_memory_aware_cache": True, "cache_memory_mb": None, "cache_memory_percent": 0.2,
    "kv_cache_quantization": False, "kv_cache_quantization_bits": 8,
    "kv_cache_quantization_group_size": 64, "kv_cache_min_quantize_tokens": 256,
    "use_paged_cache": False, "paged_cache_block_size": 64, "max_cache_blocks": 1000,
    "chunked_prefill_tokens": 0, "mid_prefill_save_interval": 8192, "ssd_cache_dir": None,
    "ssd_cache_max_gb": 10.0, "max_kv_size": 0, "enable_mtp": False, "mtp_num_draft_tokens": 1,
    "mtp_optimistic": False,
}


def test_scheduler_config_has_the_seed_27_fields_in_order_with_the_seed_defaults():
    fields = [f.name for f in dataclasses.fields(SchedulerConfig)]
    assert fields == list(SEED_SCHEDULER_DEFAULTS)
    assert len(fields) == 27
    assert dataclasses.asdict(SchedulerConfig()) == SEED_SCHEDULER_DEFAULTS


def test_engine_config_has_the_seed_fields_and_defaults():
    cfg = EngineConfig()
    assert (cfg.model_name, cfg.scheduler_config, cfg.step_interval, cfg.stream_interval,
            cfg.gpu_memory_utilization) == ("", None, 0.001, 1, 0.9)
    assert SchedulingPolicy("priority") is SchedulingPolicy.PRIORITY


def test_invalid_values_are_refused():
    with pytest.raises(ValueError, match="mllm_prefill_step_size"):
        SchedulerConfig(mllm_prefill_step_size=0)
    with pytest.raises(ValueError):
        SchedulerConfig(max_num_seqs=0)
    with pytest.raises(ValueError):
        EngineConfig(stream_interval=0)


def test_from_env_reads_typed_values_and_rejects_bad_ones(monkeypatch):
    monkeypatch.setenv("ENGINE_MAX_NUM_SEQS", "12")
    monkeypatch.setenv("ENGINE_POLICY", "priority")
    monkeypatch.setenv("ENGINE_ENABLE_PREFIX_CACHE", "false")
    monkeypatch.setenv("ENGINE_CACHE_MEMORY_MB", "64")
    monkeypatch.setenv("ENGINE_STREAM_INTERVAL", "3")
    cfg = EngineConfig.from_env()
    sched = cfg.scheduler_config
    assert (sched.max_num_seqs, sched.policy, sched.enable_prefix_cache, sched.cache_memory_mb) == (
        12, SchedulingPolicy.PRIORITY, False, 64)
    assert cfg.stream_interval == 3
    monkeypatch.setenv("ENGINE_MAX_NUM_SEQS", "lots")
    with pytest.raises(ValueError, match="ENGINE_MAX_NUM_SEQS"):
        SchedulerConfig.from_env()


def test_chunked_prefill_budget_becomes_the_prefill_step_and_capacity_follows_the_generator():
    assert SchedulerConfig(chunked_prefill_tokens=64).effective_prefill_step_size == 64
    assert SchedulerConfig().effective_prefill_step_size == 2048
    assert SchedulerConfig().max_running == 32  # seed defaults: 256 seqs, 32 decode slots
    assert SchedulerConfig(max_num_seqs=4).max_running == 4
