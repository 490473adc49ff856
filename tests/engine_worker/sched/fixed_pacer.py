"""A pacer whose step times are fixed, so hold decisions do not depend on this machine's speed."""

from __future__ import annotations

from engine_worker.sched.pacer import AdmissionPacer


class FixedPacer(AdmissionPacer):
    def __init__(self, admit_ms: float, decode_ms: float) -> None:
        super().__init__()
        self.admit_s, self.decode_s = admit_ms / 1000, decode_ms / 1000

    def record(self, seconds: float, *, prompt_work: bool) -> None:
        pass
