"""The engine worker's host side: everything a worker process does around its engine.

A worker (``python manage.py run_engine_worker``) is one process with three threads:

* main: the Celery consumer of the ``engine`` queue (consumer.py). ``run_job`` claims its job with
  one conditional UPDATE and submits it to the engine (service.py, admission.py), then returns;
* the engine thread (engine_worker's EngineCore) steps the continuous batch;
* the I/O thread (engine_worker's JobHost) writes the engine's outputs through the sink (sink.py:
  the database and each job's Redis stream) and, between batches, runs the periodic duties
  (control.py: heartbeat, lease renewal, cancellations).

Nothing here runs in a web process. engine_worker itself stays free of Django.
"""
