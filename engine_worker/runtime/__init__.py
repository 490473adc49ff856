"""The worker runtime: hosts jobs on an in-process EngineCore and streams them to a sink.

Django-free; the service side supplies an :class:`OutputSink` (see ``api/streaming``).
"""

from engine_worker.runtime.host import HostedEngine, JobHost
from engine_worker.runtime.sink import MemorySink, OutputSink, SinkError

__all__ = ["HostedEngine", "JobHost", "MemorySink", "OutputSink", "SinkError"]
