"""The scheduler: a state machine with no I/O that decides, step by step, which requests run.

* :mod:`.scheduler`: :class:`~.scheduler.Scheduler` (the seed's API) and its one step function;
* :mod:`.waiting_queue`, :mod:`.admission`, :mod:`.pacer`: the queue, the checks a request passes
  before it may wait, and when a step admits;
* :mod:`.memory`: the worker's memory budget and the batch's fit within it;
* :mod:`.stats`: counters and the dashboard's rows.
"""
