"""Jobs written in Django's own transaction, so that they exist if and only if it commits.

Two ways in: ``celery_ratchet.transaction(django.db.connection)`` around the sends, inside
``transaction.atomic()``; or ``ratchet_django_connection = "default"``
(``CELERY_RATCHET_DJANGO_CONNECTION``), after which every send made while a transaction is
open on that database joins it. Either way the store's statements run on the DB-API
connection Django holds; Django alone commits, rolls back and closes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery_ratchet.errors import ConfigurationError
from celery_ratchet.store.lent import lend, reaches_store
from celery_ratchet.store.units import Unit

_REMEDY = (
    "point ratchet_url (CELERY_RATCHET_URL in Django's settings) at that database, or "
    "send with delay_on_commit() instead, which stores the job through ratchet_url once "
    "Django's transaction commits"
)


def is_django_connection(candidate: Any) -> bool:
    """Whether ``candidate`` is one of Django's database connections (or its proxy,
    ``django.db.connection``)."""
    return all(hasattr(candidate, name) for name in ("settings_dict", "alias", "in_atomic_block"))


def _where(wrapper: Any) -> dict[str, Any]:
    settings = wrapper.settings_dict
    port = settings.get("PORT")
    return {
        "host": settings.get("HOST") or None,
        "port": int(port) if port else None,
        "database": str(settings.get("NAME") or "") or None,
    }


@contextmanager
def _lent(wrapper: Any) -> Iterator[Unit]:
    wrapper.validate_no_broken_transaction()
    alias = wrapper.alias
    with lend(
        wrapper.connection,
        **_where(wrapper),
        described_as=f"Django's database {alias!r} (DATABASES[{alias!r}])",
        remedy=_REMEDY,
        # What the store's commit would do (wake workers over Redis) is done at Django's.
        after_commit=wrapper.on_commit,
    ) as unit:
        yield unit


@contextmanager
def within_django(connection: Any) -> Iterator[Unit]:
    """The unit of work for a ``celery_ratchet.transaction(connection)`` block,
    which must be inside Django's transaction on ``connection``."""
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
    with _lent(wrapper) as unit:
        yield unit


def _wrapper_of(alias: str) -> Any:
    setting = f"ratchet_django_connection = {alias!r} (CELERY_RATCHET_DJANGO_CONNECTION)"
    try:
        from django.core.exceptions import ImproperlyConfigured
        from django.db import connections
        from django.utils.connection import ConnectionDoesNotExist
    except ImportError:
        raise ConfigurationError(
            f"{setting} needs Django, which is not installed: install it, or unset the setting"
        ) from None
    try:
        return connections[alias]
    except (ConnectionDoesNotExist, ImproperlyConfigured) as exc:
        raise ConfigurationError(
            f"{setting}: Django has no such database ({exc}); name a key of DATABASES, or "
            "unset the setting"
        ) from None


@contextmanager
def django_transaction_of(alias: str, store: Any) -> Iterator[Unit | None]:
    """Django's connection ``alias``, lent to the job store while a transaction is open on it
    (``atomic()``, or autocommit turned off); ``None`` outside one, where a send is stored at
    once through the store's own connections. Refused, whether or not a transaction is open,
    when that database is not the job store's."""
    wrapper = _wrapper_of(alias)
    where = _where(wrapper)
    if not reaches_store(store, vendor=wrapper.vendor, **where):
        shown = f"{wrapper.vendor} {where['host'] or 'localhost'}:{where['port'] or ''}"
        raise ConfigurationError(
            f"ratchet_django_connection = {alias!r} (CELERY_RATCHET_DJANGO_CONNECTION): jobs "
            f"can join Django's transactions only in the job store's database, and "
            f"DATABASES[{alias!r}] is {shown}/{where['database']} while ratchet_url is "
            f"{store.display_url}; point CELERY_RATCHET_URL at that database, or unset "
            "CELERY_RATCHET_DJANGO_CONNECTION and send with delay_on_commit()"
        )
    # Attributes only: no connection is opened to find out, and an async view may ask.
    if wrapper.connection is None or wrapper.autocommit:
        yield None
        return
    with _lent(wrapper) as unit:
        yield unit
