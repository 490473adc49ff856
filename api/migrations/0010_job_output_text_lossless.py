"""``Job.output_text`` stores any text, NUL included (api/model_fields.py).

The column stays ``text``; only the rows that hold the escape character U+FFFF change, to its
escaped form, so every existing row reads back exactly as before. Reversing it fails on
PostgreSQL while a row holds a NUL, which the old field cannot store."""

from __future__ import annotations

from django.db import migrations

import api.jobs.fields
from api.jobs.fields import ESCAPE, decode_text, encode_text


def _rewrite(apps, schema_editor, convert) -> None:
    # The historical model's field is the plain TextField here (the state changes separately):
    # it reads and writes the stored form as it is.
    Job = apps.get_model("api", "Job")
    jobs = Job.objects.using(schema_editor.connection.alias)
    # Read first, then write: rows holding U+FFFF are rare, and SQLite should not be written
    # through while the same connection still reads the query.
    for job_id, text in list(jobs.filter(output_text__contains=ESCAPE).values_list("id", "output_text")):
        jobs.filter(id=job_id).update(output_text=convert(text))


def escape_rows(apps, schema_editor) -> None:
    _rewrite(apps, schema_editor, encode_text)


def unescape_rows(apps, schema_editor) -> None:
    _rewrite(apps, schema_editor, decode_text)


class Migration(migrations.Migration):

    dependencies = [
        ("api", "0009_job_attempts_drop_queued_notify"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(escape_rows, unescape_rows)],
            state_operations=[
                migrations.AlterField(
                    model_name="job",
                    name="output_text",
                    field=api.jobs.fields.LosslessTextField(blank=True),
                ),
            ],
        ),
    ]
