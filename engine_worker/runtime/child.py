"""Ending a helper child process that runs until its stdin reaches end of file (the worker's
output and intake processes)."""

from __future__ import annotations

import logging
import subprocess

logger = logging.getLogger(__name__)


def end_child(child: subprocess.Popen[bytes], timeout: float, what: str) -> bool:
    """Close ``child``'s stdin and wait for it to finish what it has. False if it had to be killed
    after ``timeout`` seconds."""
    try:
        child.stdin.close()  # type: ignore[union-attr]
    except OSError:
        pass
    try:
        child.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        logger.error("%s %s did not finish in %.0f s; killed", what, child.pid, timeout)
        child.kill()
        child.wait()
        return False
