"""Jobs: submission, dispatch to the engine workers, the state changes of a job's life (each a
conditional UPDATE), reads, deletion, and their HTTP views, admin and Celery tasks."""
