"""Jobs written in the caller's own database transaction: ``celery_ratchet.transaction()``,
and Django's when ``ratchet_django_connection`` names its database."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from celery import Celery

from celery_ratchet.celery.django.django_db import (
    django_transaction_of,
    is_django_connection,
    within_django,
)
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.store.units import Unit, unit_of

_within: ContextVar[Unit | None] = ContextVar("ratchet_transaction", default=None)


def current_transaction() -> Unit | None:
    """The caller's unit of work inside ``celery_ratchet.transaction()``, else ``None``."""
    return _within.get()


@contextmanager
def joined(app: Celery) -> Iterator[Unit | None]:
    """The unit of work whose transaction the writes of this moment join, or ``None`` (the
    store's own connections, committed at once): the caller's inside
    ``celery_ratchet.transaction()``; else, when ``ratchet_django_connection`` names a Django
    database, Django's connection while a transaction is open on it."""
    explicit = _within.get()
    if explicit is not None:
        yield explicit
        return
    state = ratchet_state(app)
    alias = state.settings.django_connection
    if alias is None:
        yield None
        return
    with django_transaction_of(alias, state.store) as lent:
        if lent is None:
            yield None
            return
        token = _within.set(lent)
        try:
            yield lent
        finally:
            _within.reset(token)


@contextmanager
def transaction(connection_or_session: Any) -> Iterator[None]:
    """Write the jobs sent in this block in the caller's own database transaction::

        with engine.begin() as conn:                 # or a Session
            conn.execute(orders.insert(), order)
            with celery_ratchet.transaction(conn):
                ship.delay(order["id"])

    The job rows exist if and only if that transaction commits, so a worker never sees a
    job whose data is not there yet (or never will be). The connection must reach the job
    store's database. Under Django, give ``django.db.connection`` (or ``connections[alias]``)
    inside ``transaction.atomic()``: the jobs are written in Django's transaction. On
    PostgreSQL the wake-up notification is delivered at the commit (under Django, the Redis
    one of ``ratchet_events_url`` too); otherwise workers find the jobs by polling.
    """
    target = connection_or_session
    if is_django_connection(target):
        with within_django(target) as lent:
            token = _within.set(lent)
            try:
                yield
            finally:
                _within.reset(token)
        return
    token = _within.set(unit_of(target))
    try:
        yield
    finally:
        _within.reset(token)
