"""Prometheus metrics of the service, read at scrape time from what every process shares: the
jobs' rows and the workers' heartbeats in Redis.

Counting in each process (prometheus_client's usual way) would need its multiprocess mode across
the web processes and would still miss the engine workers; the shared state already holds what
an operator watches (the admin's engine dashboard reads the same), so a scrape costs two
queries and one Redis scan, whichever web process serves it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import redis
from django.db import DatabaseError
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from api.jobs.selectors import job_status_counts, job_throughput
from api.serving.workers import worker_list
from engine_worker.protocol import WorkerHeartbeat

logger = logging.getLogger(__name__)

PREFIX = "inference"
THROUGHPUT_WINDOW_S = 60


class ServiceCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(f"{PREFIX}_component_up", "Whether the service can reach the component (1) or not (0).",
                               labels=["component"])
        yield from self._jobs(up)
        yield from self._workers(up)
        yield up

    def _jobs(self, up: GaugeMetricFamily) -> Iterator[GaugeMetricFamily]:
        try:
            counts = job_status_counts()
            recent = job_throughput(window_s=THROUGHPUT_WINDOW_S)
        except DatabaseError:
            logger.warning("metrics: the database is unreachable", exc_info=True)
            up.add_metric(["database"], 0)
            return
        up.add_metric(["database"], 1)
        jobs = GaugeMetricFamily(f"{PREFIX}_jobs", "Jobs by status (queued is the queue's depth).", labels=["status"])
        for status, count in sorted(counts.items()):
            jobs.add_metric([status], count)
        yield jobs
        yield GaugeMetricFamily(f"{PREFIX}_jobs_finished_last_minute", "Jobs that finished in the last 60 s.",
                                value=recent["jobs"])
        yield GaugeMetricFamily(f"{PREFIX}_completion_tokens_last_minute",
                                "Completion tokens of the jobs that finished in the last 60 s.",
                                value=recent["completion_tokens"])

    def _workers(self, up: GaugeMetricFamily) -> Iterator[GaugeMetricFamily]:
        try:
            workers = worker_list()
        except redis.RedisError:
            logger.warning("metrics: Redis is unreachable", exc_info=True)
            up.add_metric(["redis"], 0)
            return
        up.add_metric(["redis"], 1)
        yield GaugeMetricFamily(f"{PREFIX}_workers", "Engine workers with a live heartbeat.", value=len(workers))
        yield from worker_families(workers, now=time.time())


def worker_families(workers: list[WorkerHeartbeat], *, now: float) -> Iterator[GaugeMetricFamily]:
    """One family per figure of the heartbeats, a sample per worker."""
    info = GaugeMetricFamily(f"{PREFIX}_worker_info", "A live engine worker, its model and device.",
                             labels=["worker", "model", "device"])
    requests = GaugeMetricFamily(f"{PREFIX}_worker_requests", "Requests in a worker's engine.",
                                 labels=["worker", "state"])
    memory = GaugeMetricFamily(f"{PREFIX}_worker_memory_bytes",
                               "A worker's accelerator memory: mlx's allocator (active, peak, cache), "
                               "its budget and the budget's parts (weights, kv, prefix_cache).",
                               labels=["worker", "kind"])
    age = GaugeMetricFamily(f"{PREFIX}_worker_heartbeat_age_seconds", "Seconds since a worker's last heartbeat.",
                            labels=["worker"])
    speed = GaugeMetricFamily(f"{PREFIX}_worker_tokens_per_second",
                              "The generation speed of a worker's running requests, summed.", labels=["worker"])
    cache = GaugeMetricFamily(f"{PREFIX}_worker_cache", "The numeric figures of a worker's prefix cache.",
                              labels=["worker", "stat"])
    for worker in workers:
        name = worker.worker_id
        info.add_metric([name, worker.model, worker.device], 1)
        requests.add_metric([name, "running"], worker.num_running)
        requests.add_metric([name, "waiting"], worker.num_waiting)
        for kind in ("active", "peak", "cache", "budget", "weights", "kv", "prefix_cache"):
            memory.add_metric([name, kind], getattr(worker.memory, f"{kind}_bytes"))
        age.add_metric([name], max(0.0, now - worker.sent_at))
        speed.add_metric([name], sum(float(r.get("tokens_per_second") or 0) for r in worker.requests
                                     if r.get("status") != "waiting"))
        for stat, value in sorted((worker.cache or {}).items()):
            if isinstance(value, int | float) and not isinstance(value, bool):
                cache.add_metric([name, stat], value)
    yield from (info, requests, memory, age, speed, cache)


registry = CollectorRegistry(auto_describe=False)
registry.register(ServiceCollector())
