"""The job store's tables, made by celery_ratchet's own schema code (the same as a worker's
first start and ``ratchet schema apply``): created when missing, brought up to date where an
earlier version made them. Only on the database the store uses: ``migrate --database`` on
another alias does nothing here. A release that changes the schema adds a migration that
applies it again."""

from __future__ import annotations

from django.db import migrations

from celery_ratchet.contrib.django.schema import apply_schema


class Migration(migrations.Migration):
    # The store's own connection makes the tables (and takes its schema lock), not Django's
    # transaction: MySQL/MariaDB would commit each CREATE of it anyway.
    atomic = False
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [apply_schema()]
