"""The engine worker's output process: ``python -m api.streaming.sink_process --worker-id ID``.

The worker starts it (engine_worker/runtime/pipe_sink.py) and writes every output batch to its
stdin; it publishes them with :class:`RedisJobSink` (database, job streams, channel layer), so
none of that work competes with the engine thread for the worker's GIL. It exits at end of file,
after the last batch is written: when the worker closes the pipe on an orderly stop, or when the
worker dies.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker-id", required=True, help="The worker whose jobs these outputs are.")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inference_service.settings")
    import django

    django.setup()
    from django.db import connections

    from api.redis_client import get_redis
    from api.streaming.fanout import GroupSender
    from api.streaming.sink import RedisJobSink
    from api.streaming.worker import keep_database_connections
    from engine_worker.runtime.pipe_sink import serve_pipe

    keep_database_connections()
    sender = GroupSender()
    sink = RedisJobSink(worker_id=args.worker_id, redis_client=get_redis(), sender=sender)
    published = serve_pipe(sink, sys.stdin.buffer)
    sender.close()
    connections.close_all()
    logger.info("output process of %s: %s batches published; stopping", args.worker_id, published)
    return 0


def argv(worker_id: str) -> list[str]:
    """The command line that starts this process with the current interpreter."""
    return [sys.executable, "-m", "api.streaming.sink_process", "--worker-id", worker_id]


def project_root() -> str:
    """Where ``-m api.streaming.sink_process`` imports from, whatever the worker's cwd."""
    from pathlib import Path

    return str(Path(__file__).resolve().parents[2])


if __name__ == "__main__":
    sys.exit(main())
