"""``manage.py check``: what keeps the job store from being Django's database, said before
the first send."""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core import checks

from celery_ratchet.celery.django.django_store import (
    DATABASE_SETTING,
    connection_of,
    database_url,
    store_alias,
    where,
)
from celery_ratchet.errors import ConfigurationError
from celery_ratchet.store.lent import url_reaches
from celery_ratchet.store.redact import mask_url


@checks.register("celery_ratchet")
def check_job_store(app_configs: Any = None, **_: Any) -> list[Any]:
    alias = store_alias(settings)
    try:
        wrapper = connection_of(alias)
        database_url(alias)
    except ConfigurationError as exc:
        return [checks.Error(str(exc), id="celery_ratchet.E001")]
    found: list[Any] = []
    url = os.environ.get("RATCHET_URL") or getattr(settings, "CELERY_RATCHET_URL", None)
    if url and not url_reaches(url, **where(wrapper)):
        found.append(
            checks.Warning(
                f"CELERY_RATCHET_URL ({mask_url(url)}) is not DATABASES[{alias!r}]: "
                "`manage.py migrate` does not make the job store's tables there, and a send "
                "inside transaction.atomic() is not written in Django's transaction",
                hint=f"remove CELERY_RATCHET_URL (the store is then DATABASES[{alias!r}]), "
                f"or set {DATABASE_SETTING} to the alias of that database",
                id="celery_ratchet.W001",
            )
        )
    joined = os.environ.get(
        "RATCHET_DJANGO_CONNECTION", getattr(settings, "CELERY_RATCHET_DJANGO_CONNECTION", None)
    )
    if joined and joined != alias:
        found.append(
            checks.Warning(
                f"CELERY_RATCHET_DJANGO_CONNECTION = {joined!r}, but the job store is "
                f"DATABASES[{alias!r}]: a send inside atomic() on {joined!r} is refused",
                hint=f"set it to {alias!r}, or remove it (the store's alias is the default)",
                id="celery_ratchet.W002",
            )
        )
    return found
