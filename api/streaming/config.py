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

from inference_service.env import env_bool, env_float, env_int, env_str


@dataclass(frozen=True)
class WorkerConfig:
    worker_id: str
    model_path: str
    lease_s: float  # a held job's lease; renewed every heartbeat
    heartbeat_s: float  # heartbeat, lease renewal and cancel fallback period
    drain_s: float  # on SIGTERM, how long running jobs may finish before they are handed back
    redispatch_after_s: float  # a queued job not claimed this long after dispatch is sent again
    stream_interval_s: float  # least time between two writes of plain deltas (see JobHost)
    prefetch: int  # job messages the Celery consumer takes at once (admission is quick)
    output_process: bool = True  # publish outputs from a child process (engine_worker/runtime/pipe_sink.py)
    intake_process: bool = True  # consume the engine queue in a child process (api/streaming/intake_process.py)
    # Held jobs up to which an admission also claims queued jobs whose message has not arrived yet
    # (job_lifecycle.jobs_claim's ``ahead``); 0 claims only delivered ids. The worker command
    # defaults it to the engine's running batch (SchedulerConfig.max_running).
    claim_ahead: int = 0
    # PostgreSQL: claim ahead as soon as the database notices that jobs were queued
    # (api/streaming/queue_listener.py), instead of at the next Celery message.
    queue_notify: bool = True
    # The least time between two claims; what comes meanwhile waits and joins the next claim
    # (api/streaming/admission.py). Off by default: 4 ms made fewer claims in a burst but no
    # measurable difference end to end (docs/benchmarks.md, twelfth pass).
    claim_interval_s: float = 0.0

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
            # 40 ms: about two steps of a small model; streams stay smooth (25 updates/s) while
            # the messages per token, in every process downstream, drop several times.
            stream_interval_s=env_float("WORKER_STREAM_INTERVAL_MS", 40.0, minimum=0.0) / 1000.0,
            prefetch=env_int("WORKER_PREFETCH", 16, minimum=1),
            output_process=env_bool("WORKER_OUTPUT_PROCESS", True),
            intake_process=env_bool("WORKER_INTAKE_PROCESS", True),
            claim_ahead=env_int("WORKER_CLAIM_AHEAD", -1, minimum=-1),
            queue_notify=env_bool("WORKER_QUEUE_NOTIFY", True),
            claim_interval_s=env_float("WORKER_CLAIM_INTERVAL_MS", 0.0, minimum=0.0) / 1000.0,
        )


def redispatch_after_s() -> float:
    return env_float("JOB_REDISPATCH_AFTER_S", 30.0, minimum=0.5)
