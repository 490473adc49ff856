"""``save_cache_to_disk`` / ``load_cache_from_disk``: a directory of entry files plus a manifest.

Synchronous by design: the scheduler calls these at shutdown and start-up, never inside a step.
The files use :mod:`entry_io`'s format; the manifest (``manifest.json``) holds each file's
checksum, so a truncated or corrupted file is skipped (and logged) on load.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from engine_worker.cache import entry_io
from engine_worker.cache.types import CacheEntryCorrupt

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1


def save_entries(directory: str, entries: list[tuple[str, entry_io.HostEntry, int]]) -> bool:
    """Write ``(key, host_entry, hit_count)`` rows; replaces what an earlier save left there."""
    root = Path(directory)
    try:
        root.mkdir(parents=True, exist_ok=True)
        rows = []
        for key, host, hits in entries:
            file_name = f"{key}.safetensors"
            size, digest = entry_io.write_file(root / file_name, host)
            rows.append({"key": key, "file": file_name, "bytes": size, "checksum": digest,
                         "tokens": len(host.tokens), "hit_count": hits})
        tmp = root / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps({"version": MANIFEST_VERSION, "entries": rows}))
        os.replace(tmp, root / MANIFEST)
        named = {row["file"] for row in rows}
        for path in root.glob("*.safetensors"):
            if path.name not in named:
                path.unlink(missing_ok=True)
    except OSError as exc:
        logger.error("saving the prefix cache to %s failed: %s", directory, exc)
        return False
    logger.info("saved %d prefix-cache entries to %s", len(rows), directory)
    return True


def load_entries(directory: str) -> Iterator[tuple[str, entry_io.HostEntry]]:
    """Yield the verified entries of a saved directory, skipping (and logging) bad files."""
    root = Path(directory)
    try:
        document = json.loads((root / MANIFEST).read_text())
        rows = document["entries"] if document.get("version") == MANIFEST_VERSION else []
    except FileNotFoundError:
        logger.info("no saved prefix cache in %s", directory)
        return
    except (OSError, ValueError, KeyError) as exc:
        logger.warning("prefix-cache manifest in %s unreadable: %s", directory, exc)
        return
    for row in rows:
        try:
            yield row["key"], entry_io.read_file(root / row["file"], row["checksum"])
        except (CacheEntryCorrupt, OSError, KeyError) as exc:
            logger.warning("skipping saved prefix-cache entry %s: %s", row.get("file"), exc)
