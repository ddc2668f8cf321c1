"""A task message a broker holds, as the job a send of it would have written.

Celery's message protocol 2 (headers, properties, a body of ``(args, kwargs, embed)``) goes
through the send path's own conversion
(:func:`~celery_ratchet.celery.send.message.job_from_message`): the same task id, arguments,
ETA, expiry, priority, retries, headers, and the canvas Celery embeds (the rest of a chain is
stored ahead as waiting steps; links and a chord's body stay in the message, as a send keeps
them). Protocol 1 (everything in a dict body) is read into protocol 2 first. What cannot be
stored is refused with the reason, never dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from kombu.exceptions import ContentDisallowed, DecodeError
from kombu.message import Message as KombuMessage

from celery_ratchet.celery.send import options as options_
from celery_ratchet.celery.send.inflate import uncompressed_body
from celery_ratchet.celery.send.message import (
    job_from_message,
    safe_accept,
    serializer_name,
    waiting_steps,
)
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import NewJob
from celery_ratchet.errors import RatchetError

#: The message properties a job keeps: those Celery's send sets. The broker's own (delivery
#: tag, delivery info, body encoding) describe one delivery, not the task.
_KEPT_PROPERTIES = ("correlation_id", "reply_to", "priority")


@dataclass(frozen=True)
class BrokerMessage:
    """One message as a broker held it, with the queue it was in."""

    body: bytes
    content_type: str | None
    content_encoding: str | None
    headers: Mapping[str, Any]
    properties: Mapping[str, Any]
    queue: str


@dataclass(frozen=True)
class ChordMark:
    """The message is of a chord's header: the chord's id, its size, and its body."""

    group_id: str
    size: int | None
    body: dict[str, Any]


@dataclass(frozen=True)
class Moved:
    """What the message becomes: its job, the chain steps stored ahead, its chord."""

    job: NewJob
    steps: list[NewJob] = field(default_factory=list)
    chord: ChordMark | None = None


@dataclass(frozen=True)
class Refused:
    """A message that cannot become a job, and why; it stays in the broker."""

    reason: str
    task_id: str | None = None


#: A message's protocol 2 headers and ``[args, kwargs, embed]``, or why it cannot be read.
Decoded = tuple[dict[str, Any], list[Any]] | Refused
Decode = Callable[[BrokerMessage], Decoded]


class Converter:
    """Turns broker messages into jobs as ``app`` would have sent them."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.settings = ratchet_state(app).settings
        self.accept, _ = safe_accept(app.conf.accept_content, self.settings.allow_pickle)

    def decode(self, message: BrokerMessage) -> Decoded:
        return decode(message, self.accept, self.settings.max_payload_kb)

    def convert(self, message: BrokerMessage) -> Moved | Refused:
        decoded = self.decode(message)
        if isinstance(decoded, Refused):
            return decoded
        headers, body = decoded
        return self._job(message, headers, body, str(headers["id"]))

    def _job(
        self, message: BrokerMessage, headers: dict[str, Any], body: list[Any], task_id: str
    ) -> Moved | Refused:
        name = str(headers["task"])
        properties = {
            key: message.properties[key]
            for key in _KEPT_PROPERTIES
            if message.properties.get(key) is not None
        }
        if properties.get("priority") == 0:
            # kombu gives a message priority 0 when its sender gave none: the job gets the
            # default priority, as a send without one does (an explicit 0 is not told apart).
            del properties["priority"]
        try:
            options = options_.resolve(
                name, self.app.tasks.get(name), headers.get(options_.HEADER), self.settings
            )
            options_.apply_to_message(options, headers, properties)
            job = job_from_message(
                resource=options.get("resource"),
                tags=options.get("tags", ()),
                headers=headers,
                properties=properties,
                body=body,
                queue=message.queue,
                serializer=serializer_name(message.content_type or "application/json"),
                compression=None,
                default_priority=self.settings.default_priority,
                max_payload_kb=self.settings.max_payload_kb,
                allow_pickle=self.settings.allow_pickle,
                timezone_=self.app.timezone,
            )
        except (RatchetError, ValueError, TypeError) as exc:
            return Refused(str(exc), task_id)
        return Moved(job, waiting_steps(job, body), chord_of(headers, body))


def decode(message: BrokerMessage, accept: set[str], max_payload_kb: int) -> Decoded:
    """The message's protocol 2 headers and body ``[args, kwargs, embed]``: decoded as kombu
    decodes it (only the content types of ``accept``), protocol 1 read into protocol 2. A
    compressed body is decompressed within the bound a worker reads a stored one in (64 times
    ``max_payload_kb``), not whole as kombu would: an 800-byte bzip2 message took 2 GB."""
    headers = dict(message.headers or {})
    task_id = headers.get("id") if isinstance(headers.get("id"), str) else None
    try:
        raw = uncompressed_body(message.body, headers, max_payload_kb, str(headers.get("task")))
    except RatchetError as exc:
        return Refused(str(exc), task_id)
    try:
        body = KombuMessage(
            body=raw,
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            headers=headers,
            properties=dict(message.properties or {}),
            accept=accept,
        ).decode()
    except ContentDisallowed:
        return Refused(
            f"its serializer ({message.content_type}) is not accepted here: it is not in "
            "accept_content, or it can run code (ratchet_allow_pickle)",
            task_id,
        )
    except (DecodeError, ValueError, TypeError, UnicodeError) as exc:
        return Refused(f"its body cannot be decoded ({type(exc).__name__})", task_id)
    if not (isinstance(headers.get("task"), str) and task_id):
        converted = _protocol_1(body, headers)
        if converted is None:
            return Refused("not a Celery task message (no task name and id)", task_id)
        return converted[1], converted[0]
    if not (isinstance(body, (list, tuple)) and len(body) == 3):
        return Refused("a protocol 2 task message whose body is not (args, kwargs, embed)", task_id)
    return headers, list(body)


def _protocol_1(body: Any, headers: dict[str, Any]) -> tuple[list[Any], dict[str, Any]] | None:
    """A protocol 1 message (Celery 3's: the task, its id and options in a dict body) as
    protocol 2's headers and ``(args, kwargs, embed)``; None when it is not one."""
    if not isinstance(body, dict) or not body.get("task") or not body.get("id"):
        return None
    args, kwargs = body.get("args") or (), body.get("kwargs") or {}
    if not isinstance(kwargs, dict) or not isinstance(args, (list, tuple)):
        return None
    converted = {
        "lang": "py",
        "task": body["task"],
        "id": body["id"],
        "root_id": body.get("root_id") or body["id"],
        "parent_id": body.get("parent_id"),
        "group": body.get("taskset") or body.get("group"),
        "eta": body.get("eta"),
        "expires": body.get("expires"),
        "retries": body.get("retries") or 0,
        "timelimit": body.get("timelimit") or [None, None],
        "origin": body.get("origin"),
        **{k: v for k, v in headers.items() if v is not None},
    }
    embed = {
        "callbacks": body.get("callbacks"),
        "errbacks": body.get("errbacks"),
        "chord": body.get("chord"),
        "chain": None,
    }
    return [list(args), kwargs, embed], converted


def chord_of(headers: Mapping[str, Any], body: Any) -> ChordMark | None:
    """The chord whose header this message is of: Celery embeds the chord's body in each
    header task (``embed["chord"]``, the chord's id as the message's group), or, for a
    header member that is a chain, in the chain's last step (listed first)."""
    embed = body[2] if isinstance(body, (list, tuple)) and len(body) == 3 else None
    if not isinstance(embed, dict):
        return None
    chord, group = embed.get("chord"), headers.get("group")
    if not (isinstance(chord, dict) and isinstance(group, str)):
        chain = embed.get("chain")
        last = chain[0] if isinstance(chain, list) and chain else None
        options = last.get("options") if isinstance(last, dict) else None
        if not isinstance(options, dict):
            return None
        chord, group = options.get("chord"), options.get("group_id")
        if not (isinstance(chord, dict) and isinstance(group, str)):
            return None
    size = chord.get("chord_size")
    return ChordMark(group, size if isinstance(size, int) else None, chord)
