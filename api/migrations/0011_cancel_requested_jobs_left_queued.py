"""Jobs whose worker died after their cancellation was requested went back to the queue, where
nothing takes a cancel-requested job: they end ``cancelled`` now, as job_requeue ends them."""

from __future__ import annotations

from django.db import migrations
from django.utils import timezone


def cancel_them(apps, schema_editor) -> None:
    Job = apps.get_model("api", "Job")
    Job.objects.using(schema_editor.connection.alias).filter(status="queued", cancel_requested=True).update(
        status="cancelled", finish_reason="abort", finished_at=timezone.now(), lease_expires_at=None)


class Migration(migrations.Migration):

    dependencies = [
        ("api", "0010_job_output_text_lossless"),
    ]

    operations = [
        migrations.RunPython(cancel_them, migrations.RunPython.noop),
    ]
