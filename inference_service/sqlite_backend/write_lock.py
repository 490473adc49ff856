"""One SQLite database's write lock, shared by every thread and process of the service that writes it.

The threads of a process queue on a lock of the process; the thread at its head then takes an
``flock`` of a file beside the database, for which the processes' head threads wait, trying it
every 0.1-2 ms. The kernel drops an ``flock`` when its holder dies, so a crashed writer never
leaves the database locked. A wait longer than the caller's timeout raises
:class:`WriteLockTimeout`, as SQLite's own wait ends with "database is locked".
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from typing import IO

_FIRST_PAUSE_S, _LONGEST_PAUSE_S = 0.0001, 0.002


class WriteLockTimeout(Exception):
    """The write lock was not had within the timeout."""


class WriteLock:
    """The write lock of the database at ``path`` (its file ``<path>-writelock``). Reentrant in a
    thread: a thread that holds it may take it again (a second connection of the same thread)."""

    _by_path: dict[str, WriteLock] = {}
    _registry_lock = threading.Lock()

    def __init__(self, path: str) -> None:
        self._path = f"{path}-writelock"
        self._threads = threading.RLock()
        self._depth = 0
        self._file: IO[bytes] | None = None

    @classmethod
    def for_database(cls, path: str) -> WriteLock:
        """This process's lock of the database at ``path``: one per database, whatever the connection."""
        key = os.path.realpath(path)
        with cls._registry_lock:
            lock = cls._by_path.get(key)
            if lock is None:
                lock = cls._by_path[key] = cls(key)
            return lock

    def acquire(self, timeout_s: float) -> None:
        """Wait for the lock, first behind this process's other writers, then behind other
        processes', for ``timeout_s`` at most in all."""
        deadline = time.monotonic() + timeout_s
        if not self._threads.acquire(timeout=timeout_s):
            raise WriteLockTimeout(f"{self._path}: held by another thread of this process for {timeout_s} s")
        try:
            if self._depth == 0:
                self._lock_file(deadline)
            self._depth += 1
        except BaseException:
            self._threads.release()
            raise

    def release(self) -> None:
        self._depth -= 1
        try:
            if self._depth == 0 and self._file is not None:
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
        finally:
            self._threads.release()

    def _lock_file(self, deadline: float) -> None:
        if self._file is None:
            self._file = open(self._path, "ab")  # noqa: SIM115 - kept for the process's life
        pause = _FIRST_PAUSE_S
        while True:
            try:
                fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise WriteLockTimeout(f"{self._path}: held by another process") from None
                time.sleep(pause)
                pause = min(2 * pause, _LONGEST_PAUSE_S)

    @classmethod
    def _forget_after_fork(cls) -> None:
        # A forked child shares its parent's open file, and with it the parent's flock: the child
        # opens a file of its own instead, and starts with no lock held.
        cls._by_path = {}
        cls._registry_lock = threading.Lock()


os.register_at_fork(after_in_child=WriteLock._forget_after_fork)
