"""The worker runtime: hosts jobs on an EngineCore (in this process, or in a child process of
its own) and streams their outputs to a sink.

Django-free; the service side supplies an :class:`OutputSink` (see ``api/worker``).
"""

from engine_worker.runtime.engine_process import ChildSpec, EngineChild, EngineProcess
from engine_worker.runtime.host import Host, HostedEngine, JobHost
from engine_worker.runtime.sink import MemorySink, OutputSink, SinkError

__all__ = ["ChildSpec", "EngineChild", "EngineProcess", "Host", "HostedEngine", "JobHost", "MemorySink", "OutputSink", "SinkError"]
