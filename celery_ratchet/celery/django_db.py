"""Jobs written in Django's own transaction: ``celery_ratchet.transaction(django.db.connection)``.

Inside ``transaction.atomic()``, the block's sends run on the DB-API connection Django holds,
inside Django's transaction, so a job exists if and only if that transaction commits. Only
the store's statements touch that connection; Django alone commits, rolls back and closes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery_ratchet.errors import ConfigurationError
from celery_ratchet.store.lent import lend


def is_django_connection(candidate: Any) -> bool:
    """Whether ``candidate`` is one of Django's database connections (or its proxy,
    ``django.db.connection``)."""
    return all(hasattr(candidate, name) for name in ("settings_dict", "alias", "in_atomic_block"))


@contextmanager
def within_django(connection: Any) -> Iterator[Any]:
    """The job store's connection for a block inside Django's transaction on ``connection``."""
    from django.db import connections

    alias = connection.alias
    wrapper = connections[alias]
    if wrapper.get_autocommit():
        raise ConfigurationError(
            f"celery_ratchet.transaction() on Django's database {alias!r} outside "
            "transaction.atomic(): Django commits every statement at once there, so there is "
            "no transaction to write the jobs in. Enter it inside the atomic() block, or "
            "call delay() without it (the job is stored at once)"
        )
    wrapper.validate_no_broken_transaction()
    settings = wrapper.settings_dict
    port = settings.get("PORT")
    with lend(
        wrapper.connection,
        host=settings.get("HOST") or None,
        port=int(port) if port else None,
        database=str(settings.get("NAME") or "") or None,
        described_as=f"Django's database {alias!r} (DATABASES[{alias!r}])",
        remedy=(
            "point ratchet_url (CELERY_RATCHET_URL in Django's settings) at that database, or "
            "send with delay_on_commit() instead, which stores the job through ratchet_url "
            "once Django's transaction commits"
        ),
    ) as conn:
        yield conn
