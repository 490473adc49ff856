"""On PostgreSQL, a NOTIFY on ``engine_jobs_queued`` whenever a job row becomes queued.

Inserted jobs notify once per statement, jobs handed back to the queue (reconciler, a stopping
worker) once per row; the payload is empty, so PostgreSQL folds every notice of one transaction
into one, delivered at its commit. Engine workers listen (api/streaming/queue_listener.py, which
names the same channel) and claim the queue's head at once instead of waiting for the job's
Celery message. Nothing depends on the notice arriving: Celery still delivers every job.
"""

from django.db import migrations

CREATE_SQL = """
CREATE FUNCTION api_job_queued_notify() RETURNS trigger AS $$
BEGIN
  PERFORM pg_notify('engine_jobs_queued', '');
  RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER api_job_queued_insert AFTER INSERT ON api_job
FOR EACH STATEMENT EXECUTE FUNCTION api_job_queued_notify();

CREATE TRIGGER api_job_queued_requeue AFTER UPDATE OF status ON api_job
FOR EACH ROW WHEN (NEW.status = 'queued' AND OLD.status IS DISTINCT FROM 'queued')
EXECUTE FUNCTION api_job_queued_notify();
"""

DROP_SQL = """
DROP TRIGGER IF EXISTS api_job_queued_requeue ON api_job;
DROP TRIGGER IF EXISTS api_job_queued_insert ON api_job;
DROP FUNCTION IF EXISTS api_job_queued_notify();
"""


def _on_postgresql(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("api", "0002_key_day_tokens")]

    operations = [migrations.RunPython(_on_postgresql(CREATE_SQL), _on_postgresql(DROP_SQL))]
