"""Timestamps PostgreSQL holds and no Python datetime can: ``infinity``, ``-infinity``, years
before 1 or after 9999 (written by hand, or by another tool). psycopg refuses to load them,
failing the whole statement: one such row stalled every claim of its queues (the claim
committed, its rows could not be read) and failed every listing. On the job store's
connections they are read as the server's text instead, which the store's types take for a
value that is no timestamp (:class:`~celery_ratchet.store.schema.KeptDateTime`): a claimed
row fails alone, a listing shows the cell unreadable."""

from __future__ import annotations

import functools
from typing import Any

import psycopg
from psycopg.adapt import Loader
from psycopg.pq import Format

_TIMESTAMPTZ = psycopg.postgres.types["timestamptz"].oid


@functools.cache
def _kept(inner: type[Loader]) -> type[Loader]:
    class KeptTimestamptz(Loader):
        def __init__(self, oid: int, context: Any = None) -> None:
            super().__init__(oid, context)
            self._inner = inner(oid, context)

        def load(self, data: Any) -> Any:
            try:
                return self._inner.load(data)
            except psycopg.DataError:
                return bytes(data).decode("ascii", "replace")

    return KeptTimestamptz


def keep_unloadable_timestamps(connection: Any) -> None:
    """Read the timestamps ``connection`` (psycopg 3) cannot load as their text."""
    adapters = connection.adapters
    inner = adapters.get_loader(_TIMESTAMPTZ, Format.TEXT)
    if inner is not None:
        adapters.register_loader(_TIMESTAMPTZ, _kept(inner))
