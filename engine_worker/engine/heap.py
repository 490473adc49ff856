"""The Python heap of an engine process: what the garbage collector has to scan."""

from __future__ import annotations

import gc
import logging

logger = logging.getLogger(__name__)

_frozen = False


def freeze_startup_heap() -> bool:
    """Move every object alive now into the collector's permanent generation, once per process.

    Called when the first engine starts. The model, the tokenizer and the imported modules (tens
    of thousands of objects) live as long as the process, yet every full collection would rescan
    them: tens of milliseconds a collection, triggered every few thousand steps by the outputs the
    engine allocates, and paid by whichever thread allocates, the engine thread mid-step included. vLLM's engine core freezes its start-up heap for the same reason. Frozen objects are
    never collected, so this runs once, not for every engine. Returns True if it froze now.
    """
    global _frozen
    if _frozen:
        return False
    _frozen = True
    gc.collect()
    gc.freeze()
    logger.debug("froze %d start-up objects out of the garbage collector's scans", gc.get_freeze_count())
    return True
