"""Webhooks: a job's webhook_url, each key's signing secret (every existing key gets its own), and
the deliveries with their attempts."""

import uuid

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

import api.models


def give_each_key_a_secret(apps, schema_editor) -> None:
    ApiKey = apps.get_model("api", "ApiKey")
    keys = ApiKey.objects.using(schema_editor.connection.alias)
    for key_id in keys.filter(webhook_secret="").values_list("id", flat=True):
        keys.filter(id=key_id).update(webhook_secret=api.models.new_webhook_secret())


class Migration(migrations.Migration):

    dependencies = [
        ('api', '0011_cancel_requested_jobs_left_queued'),
    ]

    operations = [
        migrations.AddField(
            model_name='apikey',
            name='webhook_secret',
            # A callable default would give every existing key the same secret: they get theirs below.
            field=models.CharField(default="", editable=False, max_length=100),
            preserve_default=False,
        ),
        migrations.RunPython(give_each_key_a_secret, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='apikey',
            name='webhook_secret',
            field=models.CharField(default=api.models.new_webhook_secret, editable=False, max_length=100),
        ),
        migrations.AddField(
            model_name='job',
            name='webhook_url',
            field=models.CharField(blank=True, default='', max_length=2048),
        ),
        migrations.CreateModel(
            name='WebhookDelivery',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('event_id', models.CharField(max_length=128, unique=True)),
                ('event_type', models.CharField(max_length=64)),
                ('url', models.CharField(max_length=2048)),
                ('payload', models.TextField(blank=True)),
                ('status', models.CharField(choices=[('pending', 'Pending'), ('delivered', 'Delivered'), ('failed', 'Failed')], default='pending', max_length=16)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('next_attempt_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, editable=False)),
                ('retry_until', models.DateTimeField(default=django.utils.timezone.now)),
                ('delivered_at', models.DateTimeField(blank=True, null=True)),
                ('last_status_code', models.PositiveSmallIntegerField(blank=True, null=True)),
                ('last_error', models.TextField(blank=True)),
                ('api_key', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='webhook_deliveries', to='api.apikey')),
                ('job', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='webhook_deliveries', to='api.job')),
            ],
            options={
                'verbose_name_plural': 'webhook deliveries',
                'ordering': ['-created_at'],
            },
        ),
        migrations.CreateModel(
            name='WebhookAttempt',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('number', models.PositiveIntegerField()),
                ('started_at', models.DateTimeField()),
                ('duration_ms', models.FloatField()),
                ('status_code', models.PositiveSmallIntegerField(blank=True, null=True)),
                ('error', models.TextField(blank=True)),
                ('response_excerpt', models.TextField(blank=True)),
                ('delivery', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='attempt_log', to='api.webhookdelivery')),
            ],
            options={
                'ordering': ['delivery', 'number'],
            },
        ),
        migrations.AddIndex(
            model_name='webhookdelivery',
            index=models.Index(condition=models.Q(('status', 'pending')), fields=['next_attempt_at'], name='webhook_delivery_due'),
        ),
        migrations.AddConstraint(
            model_name='webhookattempt',
            constraint=models.UniqueConstraint(fields=('delivery', 'number'), name='webhook_attempt_unique_number'),
        ),
    ]
