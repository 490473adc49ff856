"""The suite under pytest-xdist (``make test`` runs it on several workers): each worker gets Redis
databases of its own, and tests that share a fixture beyond one test stay on one worker.

pytest-django gives each worker its own test database (``<name>_gw<N>``). Redis needs the same:
the unit tests flush REDIS_URL's database and the integration tests ``INTEGRATION_REDIS_DB``, so
worker ``gwN`` uses those numbers minus ``2N``. The environment is rewritten when pytest imports
this plugin (``-p tests.xdist_env`` in the ini's addopts), before pytest-django imports the
settings, which read REDIS_URL once.

With ``--dist loadscope`` a worker runs whole groups (``SuiteScheduling``): a module's tests
together (a module-scoped fixture is set up once), and all the drills together (their service is
shared by the whole package, and its PostgreSQL database has one name). The groups that take
longest come first (``SLOW_FIRST``), so no worker starts one near the end while the others idle.
(xdist's own ``loadgroup`` marks cannot do this under pytest 9, which no longer reads the node
id that xdist rewrites.)"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import pytest

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/15"
DEFAULT_INTEGRATION_DB = 14

# Package or module paths whose tests take the most wall time (subprocess stacks, the demo
# model's evaluation), in the order their groups are handed out.
SLOW_FIRST = ("tests/drills/", "tests/integration/", "tests/scripts/", "tests/demo_model/")


def _own_redis_databases() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    shift = 2 * int(worker.removeprefix("gw"))
    parts = urlsplit(os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL)
    unit = int(parts.path.lstrip("/") or 0) - shift
    integration = int(os.environ.get("INTEGRATION_REDIS_DB") or DEFAULT_INTEGRATION_DB) - shift
    if min(unit, integration) < 1 or unit == integration:
        raise pytest.UsageError(
            f"xdist worker {worker} would use Redis databases {unit} and {integration}: "
            "run fewer workers, or start from higher REDIS_URL / INTEGRATION_REDIS_DB numbers")
    os.environ["REDIS_URL"] = urlunsplit(parts._replace(path=f"/{unit}"))
    os.environ["INTEGRATION_REDIS_DB"] = str(integration)


_own_redis_databases()


def _group(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "drills" if path.startswith("tests/drills/") else path


def _rank(nodeid: str) -> int:
    return next((i for i, prefix in enumerate(SLOW_FIRST) if nodeid.startswith(prefix)), len(SLOW_FIRST))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The workers' collection order is the order xdist hands out the groups (``--no-loadscope-
    # reorder``); every worker sorts alike, so their collections stay equal.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: _rank(item.nodeid))  # stable: collection order within a rank


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SuiteScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return SuiteScheduling(config, log)

