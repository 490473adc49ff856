"""Engine configuration: the seed's ``SchedulingPolicy``, ``SchedulerConfig`` and ``EngineConfig``.

Field names and defaults are the seed's (vllm-mlx), so code written against it constructs these
unchanged. Unlike the seed, every field does what it says:

* admission: ``max_num_seqs`` (with the generator's capacity, see :attr:`SchedulerConfig.max_running`),
  ``max_num_batched_tokens`` (prompt tokens admitted per step), ``policy``;
* the generator: ``prefill_batch_size``, ``completion_batch_size``, ``prefill_step_size``,
  ``chunked_prefill_tokens`` (the prefill chunk while others decode), ``max_kv_size`` (rotating
  per-request KV caches);
* the prefix cache (``enable_prefix_cache`` ... ``ssd_cache_max_gb``): read by the back end that
  :func:`engine_worker.cache.build_prefix_cache` builds;
* ``enable_mtp``/``mtp_*``: reported as unavailable (warning + ``get_stats()["mtp"]``);
* ``mllm_prefill_step_size``: validated only; multimodal requests are refused with an error.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, fields
from typing import Any

# The seed's default share of the device's memory an engine may use (its memory budget).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9


class SchedulingPolicy(enum.Enum):
    """Admission order: arrival (FCFS) or priority then arrival (lower value is more urgent)."""

    FCFS = "fcfs"
    PRIORITY = "priority"


@dataclass
class SchedulerConfig:
    """The seed's 27 scheduler fields with the seed's defaults."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    policy: SchedulingPolicy = SchedulingPolicy.FCFS
    prefill_batch_size: int = 8
    completion_batch_size: int = 32
    prefill_step_size: int = 2048
    mllm_prefill_step_size: int | None = None
    enable_prefix_cache: bool = True
    prefix_cache_size: int = 100
    use_memory_aware_cache: bool = True
    cache_memory_mb: int | None = None
    cache_memory_percent: float = 0.2
    kv_cache_quantization: bool = False
    kv_cache_quantization_bits: int = 8
    kv_cache_quantization_group_size: int = 64
    kv_cache_min_quantize_tokens: int = 256
    use_paged_cache: bool = False
    paged_cache_block_size: int = 64
    max_cache_blocks: int = 1000
    chunked_prefill_tokens: int = 0
    mid_prefill_save_interval: int = 8192
    ssd_cache_dir: str | None = None
    ssd_cache_max_gb: float = 10.0
    max_kv_size: int = 0
    enable_mtp: bool = False
    mtp_num_draft_tokens: int = 1
    mtp_optimistic: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.policy, str):
            self.policy = SchedulingPolicy(self.policy)
        if self.mllm_prefill_step_size is not None and self.mllm_prefill_step_size <= 0:
            raise ValueError("mllm_prefill_step_size must be > 0 when provided")
        for name in ("max_num_seqs", "max_num_batched_tokens", "prefill_batch_size",
                     "completion_batch_size", "prefill_step_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        for name in ("chunked_prefill_tokens", "max_kv_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    @property
    def effective_prefill_step_size(self) -> int:
        """Tokens of one prompt processed per step: the chunked-prefill budget when it is on."""
        if self.chunked_prefill_tokens > 0:
            return min(self.prefill_step_size, self.chunked_prefill_tokens)
        return self.prefill_step_size

    @property
    def max_running(self) -> int:
        """Requests handed to the generator at once.

        The generator decodes at most ``max(completion_batch_size, prefill_batch_size)`` sequences;
        admitting more would only park them in its private queue, invisible to priorities and
        reported as "running" while they wait (seed defect 6). So they wait in our queue instead.
        """
        return min(self.max_num_seqs, max(self.completion_batch_size, self.prefill_batch_size))

    @classmethod
    def from_env(cls, prefix: str = "ENGINE_") -> SchedulerConfig:
        """Build from ``<prefix><FIELD>`` environment variables (e.g. ``ENGINE_MAX_NUM_SEQS``)."""
        return cls(**_env_overrides(cls, prefix))


@dataclass
class EngineConfig:
    """The seed's engine fields. ``step_interval`` is kept for compatibility only: the engine
    thread blocks when idle and wakes on a new request instead of polling."""

    model_name: str = ""
    scheduler_config: SchedulerConfig | None = None
    step_interval: float = 0.001
    stream_interval: int = 1
    # The worker's memory budget: this share of the device's memory bounds everything the
    # engine holds (engine_worker.sched.memory).
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION

    def __post_init__(self) -> None:
        if self.stream_interval < 1:
            raise ValueError("stream_interval must be >= 1")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")

    @classmethod
    def from_env(cls, prefix: str = "ENGINE_") -> EngineConfig:
        """Engine and scheduler settings from the environment; bad values raise ``ValueError``."""
        overrides = _env_overrides(cls, prefix, skip={"scheduler_config"})
        return cls(scheduler_config=SchedulerConfig.from_env(prefix), **overrides)


def _parse(raw: str, default: Any, name: str) -> Any:
    try:
        if isinstance(default, bool):
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if isinstance(default, SchedulingPolicy):
            return SchedulingPolicy(raw.lower())
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        return raw or None
    except ValueError as exc:
        raise ValueError(f"environment variable {name}={raw!r} is not a valid value") from exc


def _env_overrides(cls: type, prefix: str, skip: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    defaults = cls()
    out: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in skip:
            continue
        name = prefix + f.name.upper()
        raw = os.environ.get(name)
        if raw is not None:
            default = getattr(defaults, f.name)
            if default is None and "int" in str(f.type):
                default = 0  # Optional[int] field: parse as int
            out[f.name] = _parse(raw, default, name) if default is not None else (raw or None)
    return out
