"""scheduler_node.schedule_keys: the beat_schedule entries each worker's configuration has,
so that a worker removes an entry only once no running worker's beat_schedule has it."""

from __future__ import annotations

from django.db import migrations

from celery_ratchet.contrib.django.schema import apply_schema


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("celery_ratchet", "0001_job_store")]
    operations = [apply_schema()]
