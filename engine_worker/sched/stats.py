"""Scheduler counters and the dashboard rows of ``get_running_requests_info`` (seed §5.1)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from engine_worker.common.config import SchedulerConfig
from engine_worker.common.request import Request

logger = logging.getLogger(__name__)


@dataclass
class SchedulerCounters:
    """Totals since the scheduler started (or was reset)."""

    num_requests_processed: int = 0  # finished with stop/length
    num_requests_aborted: int = 0
    num_requests_failed: int = 0  # finished with an error
    total_prompt_tokens: int = 0  # counted once, when a request is admitted
    total_prefilled_tokens: int = 0  # prompt tokens actually computed (prefix-cache hits excluded)
    total_cached_tokens: int = 0
    total_completion_tokens: int = 0
    # Tokens the generator sampled, counted at every step (finished requests or not): the rate the
    # dashboard draws; total_completion_tokens grows only as requests end.
    total_generated_tokens: int = 0
    num_steps: int = 0
    num_step_errors: int = 0  # generator steps that raised (allocation failures included)
    num_allocation_failures: int = 0  # steps that ran out of device memory and were survived
    num_preemptions: int = 0  # requests taken out of the batch to wait again (memory, priority)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def waiting_row(req: Request, now: float) -> dict[str, Any]:
    return {
        "request_id": req.request_id,
        "status": "waiting",
        # A preempted request waits again with the output it already has.
        "phase": "preempted" if req.num_output_tokens else "queued",
        "elapsed_s": round(now - req.arrival_time, 2),
        "prompt_tokens": req.num_prompt_tokens,
        "completion_tokens": req.num_output_tokens,
        "max_tokens": req.max_tokens,
        "progress": 0.0,
        "tokens_per_second": None,
        "ttft_s": None,
        "cache_hit_type": req.cache_hit_type,
        "cached_tokens": req.cached_tokens,
    }


def running_row(req: Request, now: float) -> dict[str, Any]:
    n_out = req.num_output_tokens
    max_tokens = req.max_tokens
    first = req.first_token_time
    tps = None
    # The rate excludes the wait for the first token (that is TTFT): tokens after the first, over
    # the time since the first arrived. The seed counted the first token too (defect 16).
    if first is not None and n_out > 1 and now > first:
        tps = round((n_out - 1) / (now - first), 1)
    return {
        "request_id": req.request_id,
        "status": "running",
        "phase": "prefill" if n_out == 0 else "generation",
        "elapsed_s": round(now - req.arrival_time, 2),
        "prompt_tokens": req.num_prompt_tokens,
        "completion_tokens": n_out,
        "max_tokens": max_tokens,
        "progress": min(round(n_out / max_tokens, 3), 1.0) if max_tokens > 0 else 0.0,
        "tokens_per_second": tps,
        "ttft_s": round(first - req.arrival_time, 3) if first is not None else None,
        "cache_hit_type": req.cache_hit_type,
        "cached_tokens": req.cached_tokens,
    }


def request_rows(waiting: Iterable[Request], running: Iterable[Request], now: float) -> list[dict[str, Any]]:
    """Waiting requests first (admission order), then running ones (admission order)."""
    return [waiting_row(r, now) for r in waiting] + [running_row(r, now) for r in running]


def mtp_status(model: Any, config: SchedulerConfig) -> dict[str, Any] | None:
    """How ``enable_mtp`` turned out, for ``get_stats()["mtp"]`` (None when not asked for).

    Multi-token prediction would need hooks inside mlx-lm's generator that its public API does
    not offer, so it is reported as disabled, with the reason, and a warning as in the seed.
    """
    if not config.enable_mtp:
        return None
    if getattr(model, "mtp", None) is None:
        reason = "model has no MTP head (model.mtp is None)"
    else:
        reason = "MTP decoding is not available through mlx-lm's public BatchGenerator API"
    logger.warning("enable_mtp is set but %s; MTP is disabled", reason)
    return {"enabled": False, "requested": True, "reason": reason,
            "requested_draft_tokens": config.mtp_num_draft_tokens, "optimistic": config.mtp_optimistic}
