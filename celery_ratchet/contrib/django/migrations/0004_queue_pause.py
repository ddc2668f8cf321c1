"""scheduler_queue_pause: queues an operator paused (``ratchet queues pause``), which no
worker claims from until they are resumed."""

from __future__ import annotations

from django.db import migrations

from celery_ratchet.contrib.django.schema import apply_schema


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("celery_ratchet", "0003_job_fillfactor")]
    operations = [apply_schema()]
