"""Jobs count their attempts (a job that runs again restarts its stream, api/worker/admission.py),
and the NOTIFY of migration 0003 goes: a job reaches a worker only through its Celery message."""

from django.db import migrations, models

DROP_NOTIFY_SQL = """
DROP TRIGGER IF EXISTS api_job_queued_requeue ON api_job;
DROP TRIGGER IF EXISTS api_job_queued_insert ON api_job;
DROP FUNCTION IF EXISTS api_job_queued_notify();
"""

CREATE_NOTIFY_SQL = """
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


def _on_postgresql(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("api", "0008_drop_key_gate_and_day_tokens")]

    operations = [
        migrations.AddField(model_name="job", name="attempts", field=models.PositiveIntegerField(default=0)),
        migrations.RunPython(_on_postgresql(DROP_NOTIFY_SQL), _on_postgresql(CREATE_NOTIFY_SQL)),
    ]
