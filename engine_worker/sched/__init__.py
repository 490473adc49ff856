"""The scheduler: a state machine with no I/O that decides, step by step, which requests run.

* :mod:`.scheduler`: :class:`~.scheduler.Scheduler` (the seed's API) and its one step function;
* :mod:`.batch`: the running set, its maps and the runner; :mod:`.outputs`: a step's responses as
  the requests' outputs; :mod:`.exits`: how a request finishes, fails or is aborted;
* :mod:`.waiting_queue`, :mod:`.admission`, :mod:`.pacer`: the queue, the checks a request passes
  before it may wait, who joins the batch at a step, and whether a step admits at all;
* :mod:`.preemption`, :mod:`.memory`: requests back to wait for memory or priority, and the
  worker's memory budget that the batch must fit;
* :mod:`.stats`: counters and the dashboard's rows.
"""
