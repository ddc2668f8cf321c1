"""Awaitable sends (``aapply_async``/``adelay``) inside ``celery_ratchet.transaction()``: the
job is written on the caller's connection, so it exists if and only if that commits."""

from __future__ import annotations

import asyncio
from typing import Any

from celery import Celery
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection

import celery_ratchet
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.store.engine import normalize_url

#: A queue the worker does not consume: a job sent there stays PENDING.
PARKED = "parked"


async def _send_within(app: Celery, conn: Connection) -> Any:
    conn.execute(text("INSERT INTO async_orders (id) VALUES (1)"))  # the caller's own write
    with celery_ratchet.transaction(conn):
        return await app.tasks["t.add"].aapply_async((1, 2), queue=PARKED)


def test_an_awaited_send_inside_a_rolled_back_transaction_leaves_no_job(
    worker_app: Celery,
) -> None:
    store = ratchet_state(worker_app).store
    engine = create_engine(normalize_url(store.url))
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE IF NOT EXISTS async_orders (id INTEGER)"))
        with engine.connect() as conn:
            conn.begin()
            rolled_back = asyncio.run(_send_within(worker_app, conn))
            conn.rollback()
            conn.begin()
            committed = asyncio.run(_send_within(worker_app, conn))
            conn.commit()
            conn.execute(text("DROP TABLE async_orders"))
            conn.commit()
    finally:
        engine.dispose()
    assert store.result(rolled_back.id) is None
    assert store.result(committed.id) is not None
