"""The embedded default database's backend (inference_service/sqlite_backend) queues the service's
writers on its own lock, so no writer of the service meets SQLite's lock and its busy handler.

Each writer here turns SQLite's own wait off (``PRAGMA busy_timeout = 0``): without the backend's
lock, a write while another connection holds the database fails at once with "database is
locked"; with it, the write waits for the holder and then succeeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SETUP = """
import json, os, sys, threading, time
import django
django.setup()
from django.conf import settings
from django.db import connection, connections, transaction
assert settings.DATABASES["default"]["ENGINE"] == "inference_service.sqlite_backend"
"""

HOLDER = SETUP + """
with connection.cursor() as c:
    c.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v INTEGER)")
with transaction.atomic():
    with connection.cursor() as c:
        c.execute("INSERT INTO t (v) VALUES (1)")
    print("held", flush=True)
    sys.stdin.readline()
    released = time.time()
print(json.dumps({"released": released}), flush=True)
"""

WRITER = SETUP + """
with connection.cursor() as c:
    c.execute("PRAGMA busy_timeout = 0")
print("ready", flush=True)
sys.stdin.readline()
start = time.time()
with connection.cursor() as c:
    c.execute("UPDATE t SET v = v + 1")  # a write outside a transaction, as the worker's claim
updated = time.time()
with transaction.atomic():  # a transaction, as a submission
    with connection.cursor() as c:
        c.execute("INSERT INTO t (v) VALUES (2)")
with connection.cursor() as c:
    rows = c.execute("SELECT v FROM t ORDER BY id").fetchall()
print(json.dumps({"start": start, "updated": updated, "rows": [r[0] for r in rows]}), flush=True)
"""

WRITER_TIMEOUT = SETUP + """
from django.db import OperationalError
connection.settings_dict["OPTIONS"]["timeout"] = 0.5
with connection.cursor() as c:
    c.execute("PRAGMA busy_timeout = 0")
start = time.time()
try:
    with connection.cursor() as c:
        c.execute("UPDATE t SET v = v + 1")
    error = None
except OperationalError as exc:
    error = str(exc)
print(json.dumps({"error": error, "waited": time.time() - start}), flush=True)
"""

THREADS = SETUP + """
with connection.cursor() as c:
    c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER)")
held, result = threading.Event(), {}

def other():
    held.wait()
    with connection.cursor() as c:
        c.execute("PRAGMA busy_timeout = 0")
        start = time.time()
        c.execute("INSERT INTO t (v) VALUES (2)")
    result["waited"] = time.time() - start
    connections.close_all()

thread = threading.Thread(target=other)
thread.start()
with transaction.atomic():
    with connection.cursor() as c:
        c.execute("INSERT INTO t (v) VALUES (1)")
    held.set()
    time.sleep(0.5)
thread.join(10)
with connection.cursor() as c:
    result["rows"] = [r[0] for r in c.execute("SELECT v FROM t ORDER BY id").fetchall()]
print(json.dumps(result), flush=True)
"""

FORK = SETUP + """
from inference_service.sqlite_backend.write_lock import WriteLock
path = settings.DATABASES["default"]["NAME"]
lock = WriteLock.for_database(path)
lock.acquire(10)
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # the child: its parent holds the lock
    start = time.time()
    child_lock = WriteLock.for_database(path)
    child_lock.acquire(10)
    os.write(write, json.dumps({"waited": time.time() - start}).encode())
    child_lock.release()
    os._exit(0)
time.sleep(0.5)
lock.release()
os.waitpid(pid, 0)
print(os.read(read, 1000).decode(), flush=True)
"""


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
           "DJANGO_SETTINGS_MODULE": "inference_service.settings"}
    env.pop("TEST_DATABASE_NAME", None)
    return env


def _start(script: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_a_process_write_waits_for_another_process_transaction(tmp_path):
    env = _env(tmp_path)
    holder = _start(HOLDER, env)
    try:
        assert holder.stdout.readline().strip() == "held", holder.stderr.read()
        writer = _start(WRITER, env)
        assert writer.stdout.readline().strip() == "ready", writer.stderr.read()
        writer.stdin.write("\n")
        writer.stdin.flush()
        time.sleep(0.5)
        assert writer.poll() is None, writer.communicate()  # waiting, not failed with "database is locked"
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder_out, holder_err = holder.communicate(timeout=60)
        writer_out, writer_err = writer.communicate(timeout=60)
    finally:
        for process in (holder, locals().get("writer")):
            if process is not None and process.poll() is None:
                process.kill()
    assert holder.returncode == 0, holder_err
    assert writer.returncode == 0, writer_err
    released, written = _last_json(holder_out)["released"], _last_json(writer_out)
    assert written["updated"] >= released  # the UPDATE ran once the holder's transaction ended
    assert written["rows"] == [2, 2]  # the holder's row, updated, and the writer's own


def test_a_write_waits_no_longer_than_the_connection_timeout(tmp_path):
    env = _env(tmp_path)
    holder = _start(HOLDER, env)
    try:
        assert holder.stdout.readline().strip() == "held", holder.stderr.read()
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(WRITER_TIMEOUT)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
    finally:
        holder.kill()
    assert out.returncode == 0, out.stderr
    result = _last_json(out.stdout)
    assert result["error"].startswith("database is locked")  # as SQLite says when its own wait ends
    assert 0.4 <= result["waited"] < 5


def test_a_thread_write_waits_for_another_thread_transaction(tmp_path):
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(THREADS)], cwd=ROOT, env=_env(tmp_path),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    result = _last_json(out.stdout)
    assert result["rows"] == [1, 2]
    assert result["waited"] >= 0.3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_does_not_share_its_parent_lock(tmp_path):
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(FORK)], cwd=ROOT, env=_env(tmp_path),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert _last_json(out.stdout)["waited"] >= 0.3  # it waited for the parent to let go
