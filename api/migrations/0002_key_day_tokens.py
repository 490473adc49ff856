"""KeyDayTokens, and on PostgreSQL the trigger that keeps it (see the model's docstring).

The trigger fires only for rows that are, or were, no longer queued or running: the hot updates
of running jobs (claim, progress, first token) never run it. A key's row gets the difference of
the job's counted tokens (prompt + completion once the job is finished, else 0) on its creation
day. A negative difference never creates a row: when a key is deleted, Django removes its
KeyDayTokens rows and sets its jobs' key to NULL, in either order.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

ACTIVE = "('queued', 'in_progress')"  # JobStatus.QUEUED, JobStatus.IN_PROGRESS

CREATE_SQL = f"""
CREATE FUNCTION api_key_day_tokens_add(key_id bigint, created timestamptz, delta bigint) RETURNS void AS $$
BEGIN
  IF delta > 0 THEN
    INSERT INTO api_keydaytokens (api_key_id, day, tokens) VALUES (key_id, (created AT TIME ZONE 'UTC')::date, delta)
    ON CONFLICT (api_key_id, day) DO UPDATE SET tokens = api_keydaytokens.tokens + EXCLUDED.tokens;
  ELSIF delta < 0 THEN
    UPDATE api_keydaytokens SET tokens = tokens + delta
    WHERE api_key_id = key_id AND day = (created AT TIME ZONE 'UTC')::date;
  END IF;
END $$ LANGUAGE plpgsql;

CREATE FUNCTION api_job_day_tokens() RETURNS trigger AS $$
DECLARE
  old_tokens bigint := 0;
  new_tokens bigint := 0;
BEGIN
  IF TG_OP <> 'INSERT' THEN
    IF OLD.api_key_id IS NOT NULL AND OLD.status NOT IN {ACTIVE} THEN
      old_tokens := OLD.prompt_tokens + OLD.completion_tokens;
    END IF;
  END IF;
  IF TG_OP <> 'DELETE' THEN
    IF NEW.api_key_id IS NOT NULL AND NEW.status NOT IN {ACTIVE} THEN
      new_tokens := NEW.prompt_tokens + NEW.completion_tokens;
    END IF;
  END IF;
  IF TG_OP = 'UPDATE' THEN
    IF OLD.api_key_id IS NOT DISTINCT FROM NEW.api_key_id
       AND (OLD.created_at AT TIME ZONE 'UTC')::date = (NEW.created_at AT TIME ZONE 'UTC')::date THEN
      PERFORM api_key_day_tokens_add(NEW.api_key_id, NEW.created_at, new_tokens - old_tokens);
      RETURN NULL;
    END IF;
  END IF;
  IF TG_OP <> 'INSERT' THEN
    PERFORM api_key_day_tokens_add(OLD.api_key_id, OLD.created_at, -old_tokens);
  END IF;
  IF TG_OP <> 'DELETE' THEN
    PERFORM api_key_day_tokens_add(NEW.api_key_id, NEW.created_at, new_tokens);
  END IF;
  RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER api_job_day_tokens_insert AFTER INSERT ON api_job FOR EACH ROW
  WHEN (NEW.status NOT IN {ACTIVE}) EXECUTE FUNCTION api_job_day_tokens();
CREATE TRIGGER api_job_day_tokens_update AFTER UPDATE ON api_job FOR EACH ROW
  WHEN (OLD.status NOT IN {ACTIVE} OR NEW.status NOT IN {ACTIVE}) EXECUTE FUNCTION api_job_day_tokens();
CREATE TRIGGER api_job_day_tokens_delete AFTER DELETE ON api_job FOR EACH ROW
  WHEN (OLD.status NOT IN {ACTIVE}) EXECUTE FUNCTION api_job_day_tokens();

INSERT INTO api_keydaytokens (api_key_id, day, tokens)
SELECT api_key_id, (created_at AT TIME ZONE 'UTC')::date, SUM(prompt_tokens + completion_tokens)
FROM api_job WHERE api_key_id IS NOT NULL AND status NOT IN {ACTIVE}
GROUP BY 1, 2 HAVING SUM(prompt_tokens + completion_tokens) <> 0;
"""

DROP_SQL = """
DROP TRIGGER IF EXISTS api_job_day_tokens_insert ON api_job;
DROP TRIGGER IF EXISTS api_job_day_tokens_update ON api_job;
DROP TRIGGER IF EXISTS api_job_day_tokens_delete ON api_job;
DROP FUNCTION IF EXISTS api_job_day_tokens();
DROP FUNCTION IF EXISTS api_key_day_tokens_add(bigint, timestamptz, bigint);
"""


def _on_postgresql(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)
    return run


class Migration(migrations.Migration):

    dependencies = [
        ('api', '0001_initial'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='KeyDayTokens',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('day', models.DateField()),
                ('tokens', models.BigIntegerField(default=0)),
            ],
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('status__in', ['queued', 'in_progress'])), fields=['api_key'], name='job_key_active'),
        ),
        migrations.AddField(
            model_name='keydaytokens',
            name='api_key',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='day_tokens', to='api.apikey'),
        ),
        migrations.AddConstraint(
            model_name='keydaytokens',
            constraint=models.UniqueConstraint(fields=('api_key', 'day'), name='key_day_tokens_unique'),
        ),
        migrations.RunPython(_on_postgresql(CREATE_SQL), _on_postgresql(DROP_SQL)),
    ]
