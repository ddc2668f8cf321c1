"""The migrations' one operation: the job store's tables made, or brought up to date, by
celery_ratchet's own schema code (the same as a worker's first start and ``ratchet schema
apply``), only on the database the store uses. Each release that changes the schema adds a
migration running it again."""

from __future__ import annotations

from typing import Any

from django.db import migrations


def _apply_schema(apps: Any, schema_editor: Any) -> None:
    from celery_ratchet.celery.django.django_store import schema_url
    from celery_ratchet.store.jobstore import JobStore

    url = schema_url(schema_editor.connection.alias)
    if url is not None:
        JobStore(url).ensure_schema()


def apply_schema() -> Any:
    return migrations.RunPython(_apply_schema, migrations.RunPython.noop, elidable=False)
