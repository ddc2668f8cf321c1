"""PostgreSQL: scheduler_job leaves room in each page (``fillfactor``), so that a job's new
versions are written beside the old ones, where PostgreSQL logs only the bytes that changed.
A table an earlier version made is given the storage parameters it lacks."""

from __future__ import annotations

from django.db import migrations

from celery_ratchet.contrib.django.schema import apply_schema


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("celery_ratchet", "0002_node_schedule_keys")]
    operations = [apply_schema()]
