"""The engine worker's host side: everything a worker process does around its engine.

A worker (``python manage.py run_engine_worker``) is one Django process with two threads, and the
engine's own process, which it spawns:

* main thread: the Celery consumer of the model's queues (consumer.py). ``run_job`` claims its
  job, and every other queued job of the model the engine has room for, with one conditional
  UPDATE, and hands them to the engine in one message (service.py, admission.py), then returns;
* the I/O thread (engine_worker's EngineProcess) receives the engine's outputs, writes them through
  the sink (sink.py: the database and each job's Redis stream) and, between batches, runs the
  periodic duties (control.py: heartbeat and its history, lease renewal, cancellations,
  prefix-cache evictions);
* the engine process loads the model; its engine thread (engine_worker's EngineCore) steps the
  continuous batch, and its own I/O thread folds the outputs into batches for this process
  (engine_worker/runtime/engine_process.py).

Nothing here runs in a web process. engine_worker itself stays free of Django.
"""
