"""Files and batches (OpenAI's Files and Batch APIs), and the jobs of a batch."""

from __future__ import annotations

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

import api.batches.models


class Migration(migrations.Migration):

    dependencies = [
        ('api', '0012_webhooks'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='File',
            fields=[
                ('id', models.CharField(default=api.batches.models._file_id, editable=False, max_length=40, primary_key=True, serialize=False)),
                ('purpose', models.CharField(choices=[('batch', 'Batch'), ('batch_output', 'Batch Output')], max_length=16)),
                ('filename', models.CharField(max_length=255)),
                ('bytes', models.PositiveBigIntegerField(default=0)),
                ('lines', models.PositiveIntegerField(default=0)),
                ('storage_name', models.CharField(editable=False, max_length=512)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, editable=False)),
            ],
            options={
                'ordering': ['-created_at'],
            },
        ),
        migrations.AddField(
            model_name='job',
            name='custom_id',
            field=models.CharField(blank=True, max_length=255),
        ),
        migrations.CreateModel(
            name='Batch',
            fields=[
                ('id', models.CharField(default=api.batches.models._batch_id, editable=False, max_length=40, primary_key=True, serialize=False)),
                ('input_file_id', models.CharField(max_length=40)),
                ('endpoint', models.CharField(max_length=32)),
                ('completion_window', models.CharField(default='24h', max_length=8)),
                ('metadata', models.JSONField(blank=True, null=True)),
                ('webhook_url', models.CharField(blank=True, max_length=2048)),
                ('model', models.CharField(blank=True, max_length=255)),
                ('status', models.CharField(choices=[('validating', 'Validating'), ('failed', 'Failed'), ('in_progress', 'In Progress'), ('finalizing', 'Finalizing'), ('completed', 'Completed'), ('expired', 'Expired'), ('cancelling', 'Cancelling'), ('cancelled', 'Cancelled')], default='validating', max_length=16)),
                ('errors', models.JSONField(blank=True, null=True)),
                ('request_counts', models.JSONField(blank=True, null=True)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, editable=False)),
                ('expires_at', models.DateTimeField()),
                ('in_progress_at', models.DateTimeField(blank=True, null=True)),
                ('finalizing_at', models.DateTimeField(blank=True, null=True)),
                ('completed_at', models.DateTimeField(blank=True, null=True)),
                ('failed_at', models.DateTimeField(blank=True, null=True)),
                ('expired_at', models.DateTimeField(blank=True, null=True)),
                ('cancelling_at', models.DateTimeField(blank=True, null=True)),
                ('cancelled_at', models.DateTimeField(blank=True, null=True)),
                ('api_key', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='batches', to='api.apikey')),
                ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='batches', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'verbose_name_plural': 'batches',
                'ordering': ['-created_at'],
            },
        ),
        migrations.AddField(
            model_name='job',
            name='batch',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='jobs', to='api.batch'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('batch__isnull', False), models.Q(('status', 'in_progress'), models.Q(('dispatch_count__gt', 0), ('status', 'queued')), _connector='OR')), fields=['api_key'], name='job_key_batch_in_flight'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('batch__isnull', False), ('dispatch_count', 0), ('status', 'queued')), fields=['api_key', 'created_at'], name='job_key_batch_held'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('batch__isnull', False), ('status__in', ['queued', 'in_progress'])), fields=['batch'], name='job_batch_active'),
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.UniqueConstraint(condition=models.Q(('batch__isnull', False)), fields=('batch', 'custom_id'), name='job_unique_custom_id_per_batch'),
        ),
        migrations.AddField(
            model_name='file',
            name='owner',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='files', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='batch',
            name='error_file',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='api.file'),
        ),
        migrations.AddField(
            model_name='batch',
            name='output_file',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='api.file'),
        ),
        migrations.AddIndex(
            model_name='file',
            index=models.Index(fields=['owner', '-created_at'], name='file_owner_created'),
        ),
        migrations.AddIndex(
            model_name='batch',
            index=models.Index(fields=['owner', '-created_at'], name='batch_owner_created'),
        ),
        migrations.AddIndex(
            model_name='batch',
            index=models.Index(fields=['status'], name='batch_status'),
        ),
    ]
