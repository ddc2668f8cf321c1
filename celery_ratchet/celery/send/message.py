"""Celery task messages as job rows.

On send, a protocol-2 message (headers, properties, body) becomes a :class:`NewJob`; the
serializers a row may be decoded with, and the headers that carry a claim. The way back, a
claimed row as the message Celery's strategy takes, is
:mod:`celery_ratchet.celery.execution.job_message`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone, tzinfo
from typing import Any

from kombu.compression import compress
from kombu.serialization import dumps, prepare_accept_content, registry
from kombu.utils import json as kjson

from celery_ratchet.celery.compat import serializer_codec, serializer_decoders
from celery_ratchet.celery.send.inflate import bounded, inflated_limit, unbounded_compression
from celery_ratchet.domain.job import JobType, Message, NewJob, OnDuplicate
from celery_ratchet.domain.priority import to_numeric
from celery_ratchet.errors import (
    CompressedPayloadTooLarge,
    ConfigurationError,
    InvalidJob,
    MessageTooLarge,
    PayloadTooLarge,
    SerializerNotAllowed,
)

#: Header carrying the claim token into ``self.request``; never stored with the job.
CLAIM_HEADER = "ratchet_claim"
#: Header carrying the claim's fence stamp to the process that runs the job.
FENCE_HEADER = "ratchet_fence"

#: Serializers whose decoder runs code named by the data: never read from a row unless
#: ``ratchet_allow_pickle`` is on (anyone who can write a row could run anything).
_CODE_RUNNING_SERIALIZERS = frozenset({"pickle", "dill", "cloudpickle"})
_PICKLE_TYPE = "application/x-python-serialize"
_YAML_TYPE = "application/x-yaml"


#: The largest message a job row takes on every database: MySQL/MariaDB send a row in one
#: statement within ``max_allowed_packet`` (16 MB by default), which with the row's other
#: columns and its escaping held a message of 7 MB but not 8 MB on MariaDB 10.11.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


def parse_time(value: Any, default_tz: tzinfo) -> datetime | None:
    """An ISO-8601 string or datetime from a message header, as aware UTC."""
    if value is None or value == "":
        return None
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=default_tz)
    return moment.astimezone(timezone.utc)


def runs_code(content_type: str) -> bool:
    """Whether decoding ``content_type`` (a content type or a serializer name) can run code:
    pickle and its kin, and yaml when its decoder is not kombu's own (``yaml.safe_load``)."""
    name = registry.type_to_name.get(content_type, content_type)
    content_type = registry.name_to_type.get(name, content_type)
    if name in _CODE_RUNNING_SERIALIZERS or content_type == _PICKLE_TYPE:
        return True
    if content_type == _YAML_TYPE:
        decoders = serializer_decoders()
        if decoders is None:
            return True  # cannot tell which loader decodes it: assume the worst
        decoder = decoders.get(content_type)
        return decoder is not None and getattr(decoder, "__module__", None) != (
            "kombu.serialization"
        )
    return False


def serializer_name(content_type: str) -> str:
    return str(registry.type_to_name.get(content_type, content_type))


def safe_accept(accept: Any, allow_pickle: bool) -> tuple[set[str], list[str]]:
    """The content types to decode, from an ``accept_content`` list (names or types), and
    the names refused: every code-running serializer unless ``ratchet_allow_pickle``."""
    prepared = set(prepare_accept_content(accept if accept is not None else ["json"]))
    if allow_pickle:
        return prepared, []
    refused = {t for t in prepared if runs_code(t)}
    return prepared - refused, sorted(serializer_name(t) for t in refused)


def check_serializer(serializer: str, allow_pickle: bool) -> None:
    if not allow_pickle and runs_code(serializer):
        raise SerializerNotAllowed(serializer)


def job_from_message(
    *,
    headers: dict[str, Any],
    properties: dict[str, Any],
    body: Any,
    queue: str,
    serializer: str,
    compression: str | None,
    default_priority: int,
    max_payload_kb: int,
    allow_pickle: bool,
    timezone_: tzinfo,
    resource: str | None = None,
    business_key: str | None = None,
    on_duplicate: str | None = None,
    tags: Sequence[str] = (),
    job_type: JobType = JobType.SINGLE,
) -> NewJob:
    check_serializer(serializer, allow_pickle)
    content_type, content_encoding, data = _dumps(body, serializer)
    payload = data.encode(content_encoding) if isinstance(data, str) else data
    name = headers["task"]
    if compression:
        _check_compression(name, compression, len(payload), max_payload_kb)
        payload, headers["compression"] = compress(payload, compression)
    if len(payload) > max_payload_kb * 1024:
        if isinstance(body, (tuple, list)) and len(body) == 3:
            found = _largest_arguments(name, body, serializer, compression, max_payload_kb * 1024)
        else:  # not Celery's (args, kwargs, embed): all of it is arguments
            found = (name, len(payload))
        if found is not None:
            raise PayloadTooLarge(found[0], found[1], max_payload_kb)
    priority = properties.get("priority")
    try:
        priority = default_priority if priority is None else to_numeric(priority)
    except ValueError as exc:
        raise InvalidJob("priority", f"task {name!r}: {exc}") from None
    # The message keeps the sender's priority (or none), which a worker reports as stock
    # does; the row's priority (the default where none was given) orders claims.
    if properties.get("priority") is not None:
        properties["priority"] = priority
    headers.pop(CLAIM_HEADER, None)
    headers.pop(FENCE_HEADER, None)
    headers_json = _to_json(headers, name, "headers")
    properties_json = _to_json(properties, name, "options")
    size = len(payload) + len(headers_json) + len(properties_json)
    if size > MAX_MESSAGE_BYTES:
        raise MessageTooLarge(name, size, MAX_MESSAGE_BYTES)
    return NewJob(
        job_id=headers["id"],
        task_name=name,
        queue=queue,
        priority=priority,
        message=Message(
            payload=payload,
            content_type=content_type,
            content_encoding=content_encoding,
            headers=headers_json,
            properties=properties_json,
        ),
        due=parse_time(headers.get("eta"), timezone_),
        expires_at=parse_time(headers.get("expires"), timezone_),
        attempts=int(headers.get("retries") or 0),
        root_id=headers.get("root_id"),
        parent_id=headers.get("parent_id"),
        group_id=headers.get("group"),
        job_type=job_type,
        resource=resource,
        business_key=business_key,
        # A chord's member cannot be stood in for by another job: the chord counts its own.
        on_duplicate=OnDuplicate.RAISE
        if _in_chord(body)
        else OnDuplicate(on_duplicate or OnDuplicate.EXISTING),
        tags=tuple(tags),
    )


def _check_compression(name: str, compression: str, size: int, max_payload_kb: int) -> None:
    """Refuse at send what a worker would refuse to decompress (see celery/send/inflate.py): a
    compression it does not bound, a body larger than the bound."""
    if not bounded(compression):
        raise InvalidJob("compression", f"task {name!r}: {unbounded_compression(compression)}")
    limit = inflated_limit(max_payload_kb)
    if size > limit:
        raise CompressedPayloadTooLarge(name, limit, max_payload_kb)


def _largest_arguments(
    name: str, body: Any, serializer: str, compression: str | None, limit: int
) -> tuple[str, int] | None:
    """The first task of this message whose arguments alone exceed ``limit`` bytes: its
    own, or those of a step of the workflow Celery embeds beside them (the rest of a chain,
    a chord's header and body, callbacks), each of which becomes a job of its own later.
    ``ratchet_max_payload_kb`` limits each job's arguments, not the workflow, and a step
    refused only once its turn comes would fail after the tasks before it ran. Only read
    for a message over the limit."""
    args, kwargs, embed = body
    found = _over(name, args, kwargs, serializer, compression, limit)
    if found is not None or not isinstance(embed, dict):
        return found
    pending = [embed.get(key) for key in ("chain", "callbacks", "errbacks", "chord")]
    while pending:
        item = pending.pop()
        if isinstance(item, (list, tuple)):
            pending.extend(item)
        elif isinstance(item, dict):
            options = item.get("options") or {}
            pending.extend(options.get(key) for key in ("link", "link_error", "chain", "chord"))
            kind = item.get("subtask_type")
            nested = item.get("kwargs") or {}
            if kind in ("chain", "group"):
                pending.append(nested.get("tasks"))
            elif kind == "chord":
                pending.extend((nested.get("header"), nested.get("body")))
            elif isinstance(item.get("task"), str):
                found = _over(
                    item["task"], item.get("args"), nested, serializer, compression, limit
                )
                if found is not None:
                    return found
    return None


def _over(
    name: str, args: Any, kwargs: Any, serializer: str, compression: str | None, limit: int
) -> tuple[str, int] | None:
    _, _, data = dumps([args or [], kwargs or {}], serializer=serializer)
    encoded = data.encode("utf-8") if isinstance(data, str) else data
    if len(encoded) > limit and compression:
        encoded, _ = compress(encoded, compression)
    return (name, len(encoded)) if len(encoded) > limit else None


def _in_chord(body: Any) -> bool:
    """Whether the message is of a chord's (or a batch's) member: Celery embeds the chord."""
    embed = body[2] if isinstance(body, (tuple, list)) and len(body) == 3 else None
    return isinstance(embed, dict) and bool(embed.get("chord"))


def waiting_steps(job: NewJob, body: Any) -> list[NewJob]:
    """The chain steps after ``job``, stored now as WAITING rows (as the seeds do): each is
    released when the step before it succeeds, and cancelled (REVOKED) when it fails.

    Celery carries the rest of a chain in the message, next step last, each frozen with its
    own task id. Plain task steps are stored up to the first group or chord, whose own
    steps are stored when it is sent.
    """
    embed = body[2] if isinstance(body, (tuple, list)) and len(body) == 3 else None
    chain = embed.get("chain") if isinstance(embed, dict) else None
    if not chain:
        return []
    steps: list[NewJob] = []
    previous = job.job_id
    for sig in reversed(chain):
        options = sig.get("options") or {} if isinstance(sig, dict) else {}
        task_id = options.get("task_id")
        if sig.get("subtask_type") or not sig.get("task") or not task_id:
            break
        priority = options.get("priority")
        steps.append(
            NewJob(
                job_id=task_id,
                task_name=sig["task"],
                queue=_queue_of(options.get("queue")),
                priority=priority if isinstance(priority, int) else 0,
                message=Message(
                    # A body as Celery's own (args, kwargs, embed), so results and listings
                    # read it like any job's; the release replaces it with the real message.
                    payload=str(
                        kjson.dumps([list(sig.get("args") or ()), sig.get("kwargs") or {}, {}])
                    ).encode(),
                    content_type="application/json",
                    content_encoding="utf-8",
                    headers="{}",
                    properties="{}",
                ),
                root_id=job.root_id,
                parent_id=previous,
                group_id=options.get("group_id"),
                job_type=JobType.CHAIN_STEP,
                depends_on=previous,
            )
        )
        previous = task_id
    return steps


def _queue_of(queue: Any) -> str:
    if queue is None:
        return ""
    return str(queue if isinstance(queue, str) else getattr(queue, "name", "") or "")


#: kombu's JSON encoder, made once: ``kjson.dumps`` makes one per call, twice a send here.
_KOMBU_JSON = kjson.JSONEncoder()
_KOMBU_DUMPS = kjson.dumps


def _dumps(body: Any, serializer: str) -> tuple[str, str, Any]:
    """``dumps(body, serializer=serializer)`` of kombu's registry; for its own JSON
    serializer, with the encoder made once (what it returns is the same)."""
    if serializer == "json":
        codec = serializer_codec("json")
        if codec is not None and codec.encoder is _KOMBU_DUMPS and kjson.dumps is _KOMBU_DUMPS:
            try:
                return codec.content_type, codec.content_encoding, _KOMBU_JSON.encode(body)
            except Exception:
                pass  # kombu's own encoding raises what it raises for it
    return dumps(body, serializer=serializer)


def _to_json(value: dict[str, Any], task_name: str, what: str) -> str:
    try:
        if kjson.dumps is _KOMBU_DUMPS:  # not replaced since (by a test, an app)
            return str(_KOMBU_JSON.encode(value))
        return str(kjson.dumps(value))
    except TypeError as exc:
        raise ValueError(
            f"the {what} of task {task_name!r} cannot be stored as JSON: {exc}"
        ) from exc


def check_protocol(protocol: Any) -> None:
    """A ratchet app writes Celery's task message protocol 2 (the default since Celery 4)."""
    if protocol != 2:
        raise ConfigurationError(
            f"task_protocol = {protocol!r}: a ratchet app stores task messages of protocol 2 "
            "only (Celery's default since 4.0); remove task_protocol or set it to 2"
        )


def check_result_backend(backend: Any) -> None:
    """A ratchet app has no broker for results to travel over."""
    if isinstance(backend, str) and backend.startswith("rpc"):
        raise ConfigurationError(
            "result_backend 'rpc://' sends results over the broker, and a ratchet app has none; "
            "remove result_backend to store results in the job store (the default)"
        )
