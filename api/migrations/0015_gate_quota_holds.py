"""The quota gate's holds, and on PostgreSQL the function that takes one (api/keys/quotas.py).

``api_quota_hold`` runs as one statement of its own transaction: it locks the key's row, counts the
key's usage with a snapshot taken after the lock was granted (``p_usage_sql``, run by EXECUTE:
each statement of a VOLATILE function sees what committed before it), and, when the job fits,
inserts its hold. Run on its own (autocommit), that transaction commits without waiting for the WAL
flush. The key's lock is released when that statement commits, so a key's submissions
wait on each other only while the server runs the check, not while a web process finishes its
request."""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

CREATE_FUNCTION = """
CREATE OR REPLACE FUNCTION api_quota_hold(
    p_key bigint, p_job uuid, p_tokens bigint, p_usage_sql text, p_day_start timestamptz, p_hold_s double precision,
    p_own_transaction boolean,
    OUT max_jobs bigint, OUT max_tokens bigint, OUT active bigint, OUT tokens bigint, OUT held boolean)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_own_transaction THEN
        -- The key's lock lasts until this commit: do not hold it through a WAL flush. A hold that
        -- a crash loses had no job yet (the job's synchronous commit flushes the hold's before it).
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- NO KEY UPDATE: the foreign-key checks (KEY SHARE) of jobs inserting meanwhile do not wait.
    SELECT k.max_concurrent_jobs, k.tokens_per_day INTO max_jobs, max_tokens
      FROM api_apikey k WHERE k.id = p_key FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;  -- the key is gone: every column NULL
    END IF;
    DELETE FROM api_quotahold h
     WHERE h.api_key_id = p_key AND h.created_at < clock_timestamp() - make_interval(secs => p_hold_s);
    EXECUTE p_usage_sql INTO active, tokens USING p_day_start, p_key;
    held := active + 1 <= max_jobs AND tokens + p_tokens <= max_tokens;
    IF held THEN
        INSERT INTO api_quotahold (job_id, api_key_id, tokens, created_at)
        VALUES (p_job, p_key, p_tokens, clock_timestamp());
    END IF;
END
$$;
"""


def create_function(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE_FUNCTION)


def drop_function(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS api_quota_hold")


class Migration(migrations.Migration):

    dependencies = [
        ('api', '0014_job_model'),
    ]

    operations = [
        migrations.CreateModel(
            name='QuotaHold',
            fields=[
                ('job_id', models.UUIDField(primary_key=True, serialize=False)),
                ('tokens', models.PositiveBigIntegerField()),
                ('created_at', models.DateTimeField()),
                ('api_key', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+',
                                              to='api.apikey')),
            ],
        ),
        migrations.RunPython(create_function, drop_function),
    ]
