"""``python manage.py check_engine_worker``: exit 0 when this host's engine worker is alive (its
heartbeat is in Redis), 1 otherwise. The engine worker's container health check (docker-compose.yml).

The worker is ``--worker-id``, else WORKER_ID, else any worker whose default id names this host
(``<hostname>-<pid>-<random>``: one container, one host name)."""

from __future__ import annotations

from typing import Any

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from api.serving.workers import worker_ids_alive
from api.worker.config import host_worker_id_prefix


class Command(BaseCommand):
    help = "Exit 0 if this host's engine worker has a live heartbeat, 1 if not."
    requires_system_checks: list[str] = []  # a health check runs often: only what it needs

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--worker-id", default=None, help="The worker to look for (default: WORKER_ID, "
                                                               "else any worker of this host)")

    def handle(self, *args: Any, **options: Any) -> None:
        worker_id = options["worker_id"] or settings.WORKER_ID or None
        prefix = host_worker_id_prefix()
        try:
            alive = worker_ids_alive(worker_id=worker_id, id_prefix=prefix)
        except redis.RedisError as exc:
            raise CommandError(f"Redis is unreachable ({type(exc).__name__}): no heartbeat can be read") from exc
        if not alive:
            raise CommandError(f"no live heartbeat of engine worker {worker_id or prefix + '*'}")
        self.stdout.write(f"engine worker alive: {', '.join(alive)}")
