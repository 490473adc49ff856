"""The SSD cold tier: entries evicted from RAM live on disk and come back in the background.

* Writes: the memory-aware cache hands an evicted entry to :meth:`SSDCacheTier.spill`, which
  only enqueues it (zero-copy numpy views); the I/O thread writes the file and the index.
* Reads: a lookup (:meth:`best_match`) uses the in-memory copy of the index only.
  :meth:`request_load` enqueues a read; the I/O thread reads and verifies the file, and the engine
  later collects it with :meth:`take_loaded`, which never blocks. So no disk read ever happens on
  the engine thread, and decoding of other requests never waits for a disk.
* The index (``index.json``, rewritten atomically) survives a restart; :meth:`reconcile` drops
  rows whose file is missing or has the wrong size and deletes files no row names.
* A file that fails its checksum or cannot be parsed is a miss: it is deleted, logged and
  counted in ``failures``.
* ``max_size_gb`` caps the files' total size: the least recently used files go first.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine_worker.cache import entry_io
from engine_worker.cache.index import DEFAULT_INDEX_BLOCK, PrefixIndex
from engine_worker.cache.ssd_index import SSDIndex, SSDRow
from engine_worker.cache.store import classify
from engine_worker.cache.types import CacheEntryCorrupt, EntryInfo, MatchType

logger = logging.getLogger(__name__)

GB = 1024**3
_READ, _WRITE, _STOP = 0, 1, 2  # queue priorities: reads overtake pending writes


@dataclass(frozen=True, slots=True)
class SSDCacheConfig:
    cache_dir: str
    max_size_gb: float = 10.0


@dataclass(frozen=True, slots=True)
class SSDCandidate:
    """A disk entry that would serve a prompt (the seed's candidate dict, typed)."""

    key: str
    matched_tokens: int
    memory_bytes: int
    file_path: str
    match_type: MatchType


@dataclass(frozen=True, slots=True)
class LoadedEntry:
    key: str
    host: entry_io.HostEntry


class SSDCacheTier:
    def __init__(self, config: SSDCacheConfig, index_block: int = DEFAULT_INDEX_BLOCK) -> None:
        self.config = config
        self.directory = Path(config.cache_dir)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = int(config.max_size_gb * GB)
        self._lock = threading.Lock()
        # Serialises index-file writes, which happen OUTSIDE self._lock: serialising a large index
        # must never hold up the engine thread's lookups.
        self._save_lock = threading.Lock()
        self._rows = SSDIndex(self.directory / "index.json")
        self._prefix = PrefixIndex(index_block)
        self._queue: queue.PriorityQueue[tuple[int, int, Any]] = queue.PriorityQueue()
        self._seq = itertools.count()
        self._pending_reads: set[str] = set()
        self._pending_writes: set[str] = set()
        self._loaded: list[LoadedEntry] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self._stats = {"ssd_hits": 0, "promotions": 0, "ssd_failures": 0, "ssd_writes": 0,
                       "ssd_evictions": 0, "ssd_dropped_writes": 0}

    # ---- lifecycle -------------------------------------------------------------------------
    def start_writer(self) -> None:
        """Start the background I/O thread (idempotent; reopens a closed tier)."""
        self._closed = False
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="ssd-cache-io", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Finish pending writes, persist the index, stop the thread. Later spills are dropped."""
        self._closed = True
        if self._thread is not None and self._thread.is_alive():
            self._queue.put((_STOP, next(self._seq), None))
            self._thread.join(timeout)
        self._thread = None
        self._persist_index()

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until queued work is done (tests and shutdown; never called inside a step)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                idle = not self._pending_reads and not self._pending_writes
            if idle and self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.01)
        return False

    def reconcile(self) -> int:
        """Make the index and the directory agree; returns the number of entries kept."""
        with self._lock:
            kept = self._rows.load_and_reconcile()
            self._prefix.clear()
            for row in self._rows.rows():
                self._prefix.add(row.key, np.asarray(row.tokens, dtype=np.int64))
            self._enforce_cap_locked(0)
        self._persist_index()
        return kept

    # ---- engine-thread API (no disk I/O) -------------------------------------------------------
    def spill(self, key: str, host: entry_io.HostEntry, memory_bytes: int, quantized: bool) -> bool:
        """Queue an evicted entry for writing; False when it is already on disk or queued, or
        the tier is closed."""
        with self._lock:
            if self._closed or key in self._pending_writes:
                return False
            if key in self._rows:
                self._rows.touch(key)
                return False
            self._pending_writes.add(key)
        self._queue.put((_WRITE, next(self._seq), (key, host, memory_bytes, quantized)))
        return True

    def best_match(self, tokens: np.ndarray) -> SSDCandidate | None:
        with self._lock:
            found = self._prefix.best_match(tokens)
            if found is None:
                return None
            key, lcp = found
            row = self._rows.get(key)
            if row is None:
                return None
            match_type, covered = classify(len(row.tokens), lcp, len(tokens), row.trimmable)
            if not match_type.is_hit:
                return None
            return SSDCandidate(key, covered, row.memory_bytes, str(self.directory / row.file), match_type)

    def request_load(self, candidate: SSDCandidate) -> bool:
        """Queue a background read of ``candidate``; False when already pending or closed."""
        with self._lock:
            if self._closed or candidate.key in self._pending_reads or candidate.key not in self._rows:
                return False
            self._pending_reads.add(candidate.key)
        self._queue.put((_READ, next(self._seq), candidate.key))
        return True

    def take_loaded(self) -> list[LoadedEntry]:
        """Entries read since the last call (never blocks)."""
        with self._lock:
            loaded, self._loaded = self._loaded, []
            return loaded

    def remove(self, key: str) -> bool:
        with self._lock:
            row = self._rows.pop(key)
            self._prefix.remove(key)
            if row is not None:
                self._unlink(row)
        if row is not None:
            self._persist_index()
        return row is not None

    def clear(self) -> int:
        with self._lock:
            rows = list(self._rows.rows())
            for row in rows:
                self._rows.pop(row.key)
                self._unlink(row)
            self._prefix.clear()
        self._persist_index()
        return len(rows)

    def entries(self) -> list[EntryInfo]:
        with self._lock:
            return [row.info() for row in self._rows.rows()]

    def count(self, name: str, n: int = 1) -> None:
        """Bump a counter (``ssd_hits``, ``promotions``, ``ssd_failures``...) from any thread."""
        with self._lock:
            self._stats[name] = self._stats.get(name, 0) + n

    def get_stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "ssd_entries": len(self._rows),
                "ssd_bytes": self._rows.total_bytes,
                "ssd_limit_bytes": self.max_bytes,
                "ssd_pending_reads": len(self._pending_reads),
                "ssd_pending_writes": len(self._pending_writes),
                **self._stats,
            }

    # ---- I/O thread -------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            kind, _seq, item = self._queue.get()
            try:
                if kind == _STOP:
                    return
                if kind == _WRITE:
                    self._write(*item)
                else:
                    self._read(item)
            except OSError as exc:
                # A full or failing disk must not take the engine down: the entry is just lost.
                logger.warning("SSD cache I/O failed: %s", exc)
                with self._lock:
                    self._stats["ssd_failures"] += 1
            finally:
                self._queue.task_done()

    def _write(self, key: str, host: entry_io.HostEntry, memory_bytes: int, quantized: bool) -> None:
        try:
            size_estimate = sum(a.nbytes for a in host.arrays.values()) + host.tokens.nbytes
            with self._lock:
                if size_estimate > self.max_bytes:
                    self._stats["ssd_dropped_writes"] += 1
                    return
                self._enforce_cap_locked(size_estimate)
            file_name = f"{key}.safetensors"
            size, digest = entry_io.write_file(self.directory / file_name, host)
            row = SSDRow(key=key, file=file_name, tokens=host.tokens.tolist(), file_bytes=size,
                         checksum=digest, memory_bytes=memory_bytes, quantized=quantized,
                         last_used=time.time(), trimmable=entry_io.is_trimmable(host))
            with self._lock:
                self._rows.put(row)
                self._prefix.add(key, host.tokens)
                self._stats["ssd_writes"] += 1
                self._enforce_cap_locked(0)
            self._persist_index()
        finally:
            with self._lock:
                self._pending_writes.discard(key)

    def _read(self, key: str) -> None:
        try:
            with self._lock:
                row = self._rows.get(key)
            if row is None:
                return
            try:
                host = entry_io.read_file(self.directory / row.file, row.checksum)
            except (CacheEntryCorrupt, FileNotFoundError) as exc:
                logger.warning("SSD cache entry %s dropped: %s", key, exc)
                with self._lock:
                    self._stats["ssd_failures"] += 1
                    if self._rows.pop(key) is not None:
                        self._prefix.remove(key)
                        self._unlink(row)
                self._persist_index()
                return
            with self._lock:
                self._rows.touch(key)
                self._loaded.append(LoadedEntry(key, host))
        finally:
            with self._lock:
                self._pending_reads.discard(key)

    def _persist_index(self) -> None:
        with self._save_lock:
            with self._lock:
                document = self._rows.document()
            self._rows.write(document)

    def _enforce_cap_locked(self, incoming: int) -> None:
        while self._rows.total_bytes + incoming > self.max_bytes and len(self._rows):
            victim = self._rows.least_recent()
            self._rows.pop(victim.key)
            self._prefix.remove(victim.key)
            self._unlink(victim)
            self._stats["ssd_evictions"] += 1

    def _unlink(self, row: SSDRow) -> None:
        try:
            os.unlink(self.directory / row.file)
        except FileNotFoundError:
            pass
