"""Django's SQLite backend, with every write queued on the database's write lock (write_lock.py).

SQLite lets one connection write at a time. A connection that finds the database locked waits in
SQLite's busy handler, which sleeps between tries in growing steps (1, 2, 5, 10 ... 100 ms) and is
woken by nothing: under load a writer sleeps much longer than the writer before it holds the
lock, and later writers pass it. Here a write first waits for the service's own write lock,
which hands on within 2 ms, so SQLite's lock is free when the writer asks for it. A write is a
transaction (``BEGIN IMMEDIATE``, settings.py: it holds SQLite's write lock from its start) or a
writing statement outside one (the worker's claim, a conditional ``UPDATE``). Reads are not
queued: in WAL mode they go on beside the writer.

A writer waits for the lock as long as it would for SQLite's (the connection's ``timeout``), then
fails with "database is locked", as it would have. Programs that do not use this backend
(``sqlite3``, ``manage.py dbshell``) still meet only SQLite's lock, and its busy handler.
"""

from __future__ import annotations

import re
from typing import Any

from django.db.backends.sqlite3 import base as sqlite3_base

from inference_service.sqlite_backend.write_lock import WriteLock, WriteLockTimeout

_WRITE = re.compile(r"\s*(INSERT|UPDATE|DELETE|REPLACE|CREATE|DROP|ALTER|WITH\b.*\b(INSERT|UPDATE|DELETE)\b)",
                    re.IGNORECASE | re.DOTALL)


class DatabaseWrapper(sqlite3_base.DatabaseWrapper):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._write_held: WriteLock | None = None  # the lock this connection's transaction took

    def write_lock(self) -> WriteLock | None:
        """The database's write lock; None for an in-memory database (one connection writes it)."""
        if self.is_in_memory_db():
            return None
        return WriteLock.for_database(str(self.settings_dict["NAME"]))

    def create_cursor(self, name: str | None = None) -> Any:
        return self.connection.cursor(factory=lambda connection: QueuedCursor(connection, self))

    def _start_transaction_under_autocommit(self) -> None:
        lock = self.write_lock()
        if lock is None or self._write_held is not None:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]  # a hook of Django's that django-stubs omits
            return
        self.acquire_write(lock)
        self._write_held = lock
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]  # a hook of Django's that django-stubs omits
        except BaseException:
            self._release_write()
            raise

    def acquire_write(self, lock: WriteLock) -> None:
        """Take ``lock`` within the connection's timeout (``OPTIONS["timeout"]``, SQLite's own
        wait); past it, "database is locked", as SQLite would say."""
        try:
            lock.acquire(float(self.settings_dict["OPTIONS"].get("timeout", 5)))
        except WriteLockTimeout as exc:
            with self.wrap_database_errors:
                raise self.Database.OperationalError(f"database is locked ({exc})") from exc

    def _commit(self) -> None:
        try:
            super()._commit()  # type: ignore[misc]  # a hook of Django's that django-stubs omits
        finally:
            self._release_write()

    def _rollback(self) -> None:
        try:
            super()._rollback()  # type: ignore[misc]  # a hook of Django's that django-stubs omits
        finally:
            self._release_write()

    def _close(self) -> None:
        try:
            super()._close()  # type: ignore[misc]  # a hook of Django's that django-stubs omits
        finally:
            self._release_write()

    def _release_write(self) -> None:
        lock, self._write_held = self._write_held, None
        if lock is not None:
            lock.release()


class QueuedCursor(sqlite3_base.SQLiteCursorWrapper):
    """A cursor whose writing statements outside a transaction wait for the write lock first."""

    def __init__(self, connection: Any, wrapper: DatabaseWrapper) -> None:
        super().__init__(connection)
        self._wrapper = wrapper

    def execute(self, query: str, params: Any = None) -> Any:
        return self._queued(super().execute, query, params)

    def executemany(self, query: str, param_list: Any) -> Any:
        return self._queued(super().executemany, query, param_list)

    def _queued(self, run: Any, query: str, arguments: Any) -> Any:
        lock = self._lock_for(query)
        if lock is None:
            return run(query, arguments)
        self._wrapper.acquire_write(lock)
        try:
            return run(query, arguments)
        finally:
            lock.release()

    def _lock_for(self, query: str) -> WriteLock | None:
        """The lock to take for ``query``: None inside a transaction (its writer holds the lock
        already, or SQLite's) and for a statement that only reads."""
        if self._wrapper._write_held is not None or self.connection.in_transaction or not _WRITE.match(query):
            return None
        return self._wrapper.write_lock()
