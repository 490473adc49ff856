"""The drills' service: one per database (PostgreSQL, and the SQLite file ``make run`` uses),
shared by every drill of the package on it, with the workers each drill asks for.

PostgreSQL: a database of its own, ``<DATABASE_URL's name>_drills`` on DATABASE_URL's server,
created and dropped here (not pytest-django's test database: the service's own processes write
it, and its rows would outlive the drills). Redis: the integration tests' DB
(``INTEGRATION_REDIS_DB``, 14 unless set), flushed before and after."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from tests.drills.stack import Stack, postgres_database

DATABASES = ("postgresql", "sqlite")
REDIS_DB = int(os.environ.get("INTEGRATION_REDIS_DB", "14"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "drill: runs the real service and attacks it (tests/drills/)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    stack = getattr(item, "funcargs", {}).get("stack")
    if report.when == "call" and report.failed and isinstance(stack, Stack):
        report.sections.append(("service logs", stack.logs()))
    return report


@contextmanager
def _database(kind: str, directory: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{directory / 'db.sqlite3'}"
        return
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        pytest.skip("DATABASE_URL names no PostgreSQL server")
    with postgres_database(url, f"{urlsplit(url).path.lstrip('/') or 'postgres'}_drills") as drill_url:
        yield drill_url


def _redis_url() -> str:
    if REDIS_DB == 0:
        pytest.fail("INTEGRATION_REDIS_DB=0 looks like a real database")
    base = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")
    return urlunsplit(urlsplit(base)._replace(path=f"/{REDIS_DB}"))


@pytest.fixture(scope="package", params=DATABASES)
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          tiny_model_path: Path) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp(f"drills-{request.param}")
    url = _redis_url()
    client = redis.Redis.from_url(url)
    client.flushdb()
    with _database(request.param, directory) as database_url:
        service = Stack(database_url=database_url, redis_url=url, model_path=tiny_model_path, log_dir=directory)
        try:
            service.start(workers=2)
            yield service
        finally:
            service.stop()
            client.flushdb()


@pytest.fixture(scope="package")
def tokens(tiny_model_path: Path) -> dict[str, int]:
    """Token ids of the tiny model the drills force with ``logit_bias``: ``eos`` (banned, so a
    job runs to its ``max_tokens``) and ``nul`` (the token whose text is "\\x00")."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path))
    [nul] = [i for i in range(len(tokenizer)) if tokenizer.decode([i]) == "\x00"]
    return {"eos": int(tokenizer.eos_token_id), "nul": nul}
