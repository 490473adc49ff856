"""Timing knobs of the engine worker and the reconciler, read from the environment.

Short values make the durability tests fast (a killed worker's jobs are re-dispatched within
seconds); the defaults suit production.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

from django.conf import settings

from inference_service.env import env_float, env_str


@dataclass(frozen=True)
class WorkerConfig:
    worker_id: str
    model_path: str
    lease_s: float  # a held job's lease; renewed every heartbeat
    heartbeat_s: float  # heartbeat, lease renewal and cancel fallback period
    drain_s: float  # on SIGTERM, how long running jobs may finish before they are handed back
    redispatch_after_s: float  # a queued job not claimed this long after dispatch is sent again

    @classmethod
    def from_env(cls) -> WorkerConfig:
        default_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        return cls(
            worker_id=env_str("WORKER_ID", default_id),
            model_path=settings.MODEL_PATH,
            lease_s=float(settings.JOB_LEASE_S),
            heartbeat_s=env_float("WORKER_HEARTBEAT_S", 2.0, minimum=0.1),
            drain_s=env_float("WORKER_DRAIN_S", 30.0, minimum=0.0),
            redispatch_after_s=redispatch_after_s(),
        )


def redispatch_after_s() -> float:
    return env_float("JOB_REDISPATCH_AFTER_S", 30.0, minimum=0.5)
