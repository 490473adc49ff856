"""Jobs name their model, and keys may be restricted to some models. Existing jobs take the first
configured model (api.models._default_model: the one model at MODEL_PATH when MODELS is unset),
which is the model they were submitted for; queued ones are sent again to its queue by the
reconciler."""

from __future__ import annotations

from django.conf import settings
from django.db import migrations, models

import api.models


class Migration(migrations.Migration):

    dependencies = [
        ('api', '0013_files_batches'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='apikey',
            name='allowed_models',
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name='job',
            name='model',
            field=models.CharField(default=api.models._default_model, max_length=128),
        ),
        migrations.AddField(
            model_name='job',
            name='routed_worker',
            field=models.CharField(blank=True, max_length=128, null=True),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('status__in', ['queued', 'in_progress'])), fields=['model'], name='job_model_active'),
        ),
    ]
