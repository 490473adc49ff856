"""The quota gate counts a key's usage from its jobs with one query on every backend
(api/services/quotas.py), so PostgreSQL's copies of that rule go: migration 0004's ``api_key_gate``
function, and migration 0002's KeyDayTokens table with the trigger that kept it.

Reversing recreates them as those migrations made them (the trigger's table refilled from the jobs).
"""

import importlib

from django.db import migrations

_day_tokens = importlib.import_module("api.migrations.0002_key_day_tokens")
_key_gate = importlib.import_module("api.migrations.0004_key_gate_function")


def _on_postgresql(*sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            for statement in sql:
                schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [("api", "0007_job_logprobs")]

    operations = [
        migrations.RunPython(_on_postgresql(_key_gate.DROP_SQL, _day_tokens.DROP_SQL),
                             _on_postgresql(_day_tokens.CREATE_SQL, _key_gate.CREATE_SQL)),
        migrations.DeleteModel(name="KeyDayTokens"),
    ]
