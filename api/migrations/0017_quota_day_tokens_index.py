"""The quota gate sums a key's tokens of the day's finished jobs from an index alone.

``job_key_created`` (api_key, created_at) led the gate to every row of the key's day, prompts and
all; ``job_key_day_tokens`` adds the columns that sum reads, and serves the (api_key, created_at)
lookups the old one did.
"""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('api', '0016_merge_gate_structured'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='job',
            name='job_key_created',
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(fields=['api_key', 'created_at', 'status', 'prompt_tokens', 'completion_tokens'], name='job_key_day_tokens'),
        ),
    ]
