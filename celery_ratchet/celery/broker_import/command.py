"""``celery -A app ratchet import-broker BROKER_URL``: what a broker holds, moved into the store."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

import click

from celery_ratchet.celery.broker_import.mover import Mover, Summary
from celery_ratchet.cli.base import CommandFailed
from celery_ratchet.settings import mask_password

_REDIS = ("redis", "rediss")
_AMQP = ("amqp", "amqps", "pyamqp")


def default_queues(app: Any) -> list[str]:
    """The app's ``task_queues``, else its default queue (``celery``)."""
    queues = app.conf.task_queues
    if queues:
        return [str(getattr(q, "name", q)) for q in queues]
    return [str(app.conf.task_default_queue or "celery")]


@click.command("import-broker")
@click.argument("broker_url")
@click.option(
    "--queue", "queues", multiple=True, metavar="NAME",
    help="A queue to move (repeatable); default: the app's task_queues, else celery.",
)  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Count what would be moved; change nothing.")
@click.option(
    "--unacked", type=click.Choice(["auto", "always", "never"]), default="auto",
    show_default=True,
    help="Redis: move the messages workers took and did not acknowledge (ETA tasks, a dead "
    "worker's): auto when no other client consumes from the database.",
)  # fmt: skip
@click.option(
    "--result-backend", metavar="URL",
    help="The old Redis result backend, where Celery keeps each chord's size (read only); "
    "default: the broker's URL when it is Redis.",
)  # fmt: skip
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=500, show_default=True)
@click.pass_context
def import_broker(
    ctx: click.Context,
    broker_url: str,
    queues: tuple[str, ...],
    dry_run: bool,
    unacked: str,
    result_backend: str | None,
    batch_size: int,
) -> None:
    """Move the task messages a Celery broker holds into the job store, as jobs with the same
    task id, arguments, ETA, expiry, priority, retries, headers and canvas.

    Exactly once: a message leaves the broker only once its job is committed, and a job id
    the store holds already is not written again, so a run cut off (even by kill -9) is run
    again and loses or doubles nothing. Redis (queues, priority sub-queues, unacked) and
    RabbitMQ (amqp://, through kombu).
    """
    app: Any = ctx.find_root().obj.app
    names = list(queues) or default_queues(app)
    scheme = urlsplit(broker_url).scheme.split("+")[0]
    shown = mask_password(broker_url)
    if scheme not in _REDIS + _AMQP:
        raise CommandFailed(
            f"{shown}: import-broker reads Redis (redis://, rediss://) and RabbitMQ (amqp://) "
            "brokers"
        )
    try:
        source = _connected(app, scheme, broker_url, names, unacked)
    except Exception as exc:
        reason = unreachable_reason(exc)
        if reason is None:
            raise
        raise CommandFailed(
            f"cannot reach the broker at {shown}: {reason}; nothing was moved"
        ) from None
    verb = "would move" if dry_run else "moving"
    click.echo(f"{verb} queues {', '.join(names)} from {shown}", err=True)
    progress = _Progress(dry_run)
    backend = result_backend or (broker_url if scheme in _REDIS else None)
    chord_states = None
    if backend is not None and urlsplit(backend).scheme in _REDIS:
        from celery_ratchet.celery.broker_import.chords import RedisChordStates

        chord_states = RedisChordStates(backend)
    try:
        summary = Mover(
            app, source, dry_run=dry_run, batch_size=batch_size, on_progress=progress,
            chord_states=chord_states,
        ).run()  # fmt: skip
    finally:
        source.close()
        if chord_states is not None:
            chord_states.close()
    progress(summary, final=True)
    _print_summary(summary, dry_run)
    for note in getattr(source, "notes", ()):
        click.echo(f"note: {note}", err=True)
    refused = sum(c.refused for c in summary.queues.values())
    if refused:
        raise CommandFailed(
            f"{refused} messages {'would be' if dry_run else 'were'} refused: they stay in the "
            "broker (reasons above)"
        )


def _connected(app: Any, scheme: str, url: str, names: list[str], unacked: str) -> Any:
    """The source of the broker's messages, its first contact with the broker made: a
    broker that cannot be reached fails here, before anything is moved."""
    options = dict(app.conf.broker_transport_options or {})
    if scheme in _REDIS:
        from celery_ratchet.celery.broker_import.redis_source import RedisSource

        source = RedisSource(url, names, options, unacked=unacked)
        source.lock()
        return source
    from celery_ratchet.celery.broker_import.amqp_source import AmqpSource

    return AmqpSource(url, names, options)  # it opens its channel


def unreachable_reason(exc: BaseException) -> str | None:
    """Why a broker could not be reached, in a few words (a refused connection, a refused
    login), or None for an error of another kind. Never the driver's text of a login: the
    reply of some servers quotes what the client sent."""
    refused_login = _classes(("redis.exceptions", "AuthenticationError"))
    refused_login += _classes(("amqp.exceptions", "AccessRefused"))
    if isinstance(exc, refused_login):
        return "the broker refused the login: check the user name and password in the URL"
    unreachable: tuple[type[BaseException], ...] = (
        OSError,
        *_classes(
            ("redis.exceptions", "ConnectionError"),
            ("redis.exceptions", "TimeoutError"),
            ("amqp.exceptions", "ConnectionError"),
        ),
    )
    if not isinstance(exc, unreachable):
        return None
    seen: BaseException | None = exc
    while seen is not None:  # the socket's own error says it best: "connection refused"
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror[0].lower() + seen.strerror[1:]
        if isinstance(seen, TimeoutError):
            return "timed out"
        seen = seen.__cause__ or seen.__context__
    return type(exc).__name__


def _classes(*names: tuple[str, str]) -> tuple[type[BaseException], ...]:
    """The exception classes of drivers that are installed."""
    import importlib

    found = []
    for module, name in names:
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


class _Progress:
    """One line on stderr at most every second while a run goes on."""

    def __init__(self, dry_run: bool = False) -> None:
        self.shown = 0.0
        self.moved = "would move" if dry_run else "moved"

    def __call__(self, summary: Summary, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.shown < 1.0:
            return
        self.shown = now
        moved = sum(c.moved for c in summary.queues.values())
        present = sum(c.present for c in summary.queues.values())
        refused = sum(c.refused for c in summary.queues.values())
        elapsed = max(now - summary.started, 1e-6)
        click.echo(
            f"{summary.handled:,} messages: {moved:,} {self.moved}, {present:,} present, "
            f"{refused:,} refused ({summary.handled / elapsed:,.0f} messages/s)",
            err=True,
        )


def _print_summary(summary: Summary, dry_run: bool) -> None:
    moved = "WOULD MOVE" if dry_run else "MOVED"
    rows = [(q, c.moved, c.present, c.refused) for q, c in sorted(summary.queues.items())]
    width = max([len("QUEUE")] + [len(r[0]) for r in rows])
    click.echo(f"{'QUEUE'.ljust(width)}  {moved:>10}  {'PRESENT':>10}  {'REFUSED':>10}")
    for queue, count, present, refused in rows:
        click.echo(f"{queue.ljust(width)}  {count:>10,}  {present:>10,}  {refused:>10,}")
    for (queue, reason), count in sorted(summary.reasons.items()):
        examples = summary.examples.get((queue, reason)) or []
        shown = f" (e.g. {', '.join(examples)})" if examples else ""
        click.echo(f"{queue}: {count:,} refused: {reason}{shown}")
