"""The engine worker's settings, taken from Django settings (inference_service/settings.py reads
the environment)."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

from django.conf import settings

from inference_service.env import check_model_name, model_name_of


@dataclass(frozen=True)
class WorkerConfig:
    worker_id: str
    model_path: str
    model_name: str  # the model's name in job rows, queues and heartbeats (api/serving/catalog.py)
    lease_s: float  # a held job's lease; renewed every heartbeat
    heartbeat_s: float  # heartbeat, lease renewal and cancel fallback period
    drain_s: float  # on SIGTERM, how long running jobs may finish before they are handed back
    redispatch_after_s: float  # a queued job not claimed this long after dispatch is sent again
    stream_interval_s: float  # least time between two writes of plain deltas (see JobHost)
    prefetch: int  # job messages the Celery consumer takes at once

    @classmethod
    def from_settings(cls) -> WorkerConfig:
        return cls(
            worker_id=settings.WORKER_ID or f"{host_worker_id_prefix()}{os.getpid()}-{uuid.uuid4().hex[:6]}",
            model_path=settings.MODEL_PATH,
            model_name=check_model_name(settings.MODEL_NAME or model_name_of(settings.MODEL_PATH),
                                        variable="MODEL_NAME"),
            lease_s=float(settings.JOB_LEASE_S),
            heartbeat_s=float(settings.WORKER_HEARTBEAT_S),
            drain_s=float(settings.WORKER_DRAIN_S),
            redispatch_after_s=float(settings.JOB_REDISPATCH_AFTER_S),
            stream_interval_s=float(settings.WORKER_STREAM_INTERVAL_MS) / 1000.0,
            prefetch=int(settings.WORKER_PREFETCH),
        )


def host_worker_id_prefix() -> str:
    """How the default id of every worker on this host starts (a container's health check finds
    its own worker by it: ``manage.py check_engine_worker``)."""
    return f"{socket.gethostname()}-"
