"""scheduler_node.task_names: the tasks each worker has registered, so that a worker that
claims a job of a task it does not know (a rolling deploy) hands it to a live worker that
knows it, rather than handing it back for anyone and failing it after a grace period."""

from __future__ import annotations

from django.db import migrations

from celery_ratchet.contrib.django.schema import apply_schema


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("celery_ratchet", "0004_queue_pause")]
    operations = [apply_schema()]
