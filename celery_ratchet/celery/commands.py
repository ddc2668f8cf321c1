"""Celery's ``celery.commands`` entry point: ``-P ratchet`` and ``celery -A app ratchet``.

Loaded by the ``celery`` program after its worker command (and its ``--pool`` choices) exist,
so adding the ``ratchet`` pool here makes ``celery -A app worker -P ratchet`` valid.
"""

from __future__ import annotations

from typing import Any

import click
from celery import concurrency

from celery_ratchet.celery.app import install, ratchet_state
from celery_ratchet.cli.commands import CliContext, RatchetGroup, add_commands

POOL_ALIAS = "ratchet"
concurrency.ALIASES.setdefault(POOL_ALIAS, "celery_ratchet.celery.pool:RatchetPool")


def _offer_pool_choice() -> None:
    try:
        from celery.bin.worker import WORKERS_POOL
    except ImportError:  # pragma: no cover - Celery without its CLI
        return
    if POOL_ALIAS not in WORKERS_POOL.choices:
        WORKERS_POOL.choices = (*WORKERS_POOL.choices, POOL_ALIAS)


_offer_pool_choice()


@click.group(name="ratchet", cls=RatchetGroup)
@click.pass_context
def ratchet(ctx: click.Context) -> None:
    """celery_ratchet operations on this app's job store."""
    app: Any = ctx.obj.app
    install(app)
    ctx.obj = CliContext(lambda: ratchet_state(app).store)


add_commands(ratchet)
