"""The SSD tier's index file: one JSON document, rewritten atomically, reconciled at start.

Rows carry each entry's tokens (so lookups never open a data file), its file's size and checksum,
and LRU bookkeeping. Not thread-safe by itself: :class:`SSDCacheTier` holds its lock around every
call.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engine_worker.cache.types import EntryInfo, Tier

logger = logging.getLogger(__name__)

INDEX_VERSION = 1


@dataclass(slots=True)
class SSDRow:
    key: str
    file: str
    tokens: list[int]
    file_bytes: int
    checksum: str
    memory_bytes: int
    quantized: bool
    last_used: float
    hit_count: int = 0
    trimmable: bool = True  # False: a wrapped sliding window, served only to extending prompts

    def info(self) -> EntryInfo:
        return EntryInfo(self.key, len(self.tokens), self.file_bytes, Tier.SSD, self.hit_count,
                         self.last_used, self.quantized)


class SSDIndex:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._rows: dict[str, SSDRow] = {}
        self.total_bytes = 0

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    def rows(self) -> Iterator[SSDRow]:
        return iter(list(self._rows.values()))

    def get(self, key: str) -> SSDRow | None:
        return self._rows.get(key)

    def put(self, row: SSDRow) -> None:
        self.pop(row.key)
        self._rows[row.key] = row
        self.total_bytes += row.file_bytes

    def pop(self, key: str) -> SSDRow | None:
        row = self._rows.pop(key, None)
        if row is not None:
            self.total_bytes -= row.file_bytes
        return row

    def touch(self, key: str) -> None:
        row = self._rows.get(key)
        if row is not None:
            row.last_used = time.time()
            row.hit_count += 1

    def least_recent(self) -> SSDRow:
        return min(self._rows.values(), key=lambda row: row.last_used)

    def document(self) -> dict:
        """The index as a JSON-ready dict; O(rows), not O(tokens): token lists are shared, not
        copied (rows never mutate them), so the caller can serialise it outside its lock."""
        rows = []
        for row in self._rows.values():
            fields = {name: getattr(row, name) for name in SSDRow.__slots__}
            rows.append(fields)
        return {"version": INDEX_VERSION, "rows": rows}

    def write(self, document: dict) -> None:
        """Atomically replace the index file (temp file + rename)."""
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(document))
        os.replace(tmp, self.path)

    def _load_rows(self) -> list[SSDRow]:
        if not self.path.exists():
            return []
        try:
            document = json.loads(self.path.read_text())
            if document.get("version") != INDEX_VERSION:
                raise ValueError(f"index version {document.get('version')!r}")
            return [SSDRow(**row) for row in document["rows"]]
        except (ValueError, KeyError, TypeError) as exc:
            # An unreadable index loses the disk entries, never the engine: start empty and let
            # the orphan sweep below delete the files.
            logger.warning("SSD cache index %s unreadable (%s); starting empty", self.path, exc)
            return []

    def load_and_reconcile(self) -> int:
        """Load the index, drop rows whose file is missing or has another size, delete files no
        row names (including half-written ``.tmp`` files). Returns the rows kept."""
        self._rows.clear()
        self.total_bytes = 0
        for row in self._load_rows():
            path = self.path.parent / row.file
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                logger.info("SSD cache: %s is gone, dropping its index row", row.file)
                continue
            if size != row.file_bytes:
                logger.warning("SSD cache: %s has %d bytes, index says %d; deleting", row.file,
                               size, row.file_bytes)
                path.unlink(missing_ok=True)
                continue
            self.put(row)
        named = {row.file for row in self._rows.values()}
        for path in self.path.parent.iterdir():
            orphan = path.suffix == ".safetensors" and path.name not in named
            if orphan or path.suffix == ".tmp":
                logger.info("SSD cache: deleting orphan %s", path.name)
                path.unlink(missing_ok=True)
        return len(self._rows)
