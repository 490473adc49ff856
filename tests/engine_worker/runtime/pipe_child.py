"""A child for tests/engine_worker/runtime/test_pipe_sink.py: serve_pipe into a JSON-lines file."""

from __future__ import annotations

import json
import sys
import time

from engine_worker.runtime.pipe_sink import serve_pipe


class FileSink:
    def __init__(self, path: str, delay_s: float) -> None:
        self._file = open(path, "a")  # noqa: SIM115 - open for the child's lifetime
        self._delay_s = delay_s

    def publish(self, batch) -> None:
        time.sleep(self._delay_s)  # a slow sink: the parent may close before the writes are done
        if any(c.text == "boom" for c in batch.chunks):
            raise RuntimeError("this batch fails")
        line = {"chunks": [[c.job_id, c.seq, c.text] for c in batch.chunks], "finals": [f.job_id for f in batch.finals]}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()


if __name__ == "__main__":
    serve_pipe(FileSink(sys.argv[1], float(sys.argv[2])), sys.stdin.buffer)
