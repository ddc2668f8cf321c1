"""A claimed job as the message Celery's strategy and Request take."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from kombu.message import Message as KombuMessage
from kombu.utils import json as kjson

from celery_ratchet.celery.compat import serializer_decoders, set_message_state
from celery_ratchet.celery.send.inflate import uncompressed_body
from celery_ratchet.celery.send.message import CLAIM_HEADER, FENCE_HEADER
from celery_ratchet.domain.job import ClaimedJob, JobStatus, NewJob, error_record

#: Called once per claimed execution: (job, status or None, error record, traceback, and
#: whether the execution failed, for circuit breakers: None when that is not known).
EndCallback = Callable[[ClaimedJob, JobStatus | None, str | None, str | None, bool | None], None]


def retry_of(job: ClaimedJob, delay: float, now: datetime) -> NewJob:
    """The claimed job as its own next try, ``delay`` seconds from ``now`` (the database's
    time: see NodeClock): Celery's retry count and ETA in the message move on with it."""
    headers = kjson.loads(job.message.headers)
    headers.pop(CLAIM_HEADER, None)
    headers.pop(FENCE_HEADER, None)
    attempts = int(headers.get("retries") or 0) + 1
    due = now + timedelta(seconds=delay)
    headers["retries"], headers["eta"] = attempts, due.isoformat()
    return NewJob(
        job_id=job.job_id,
        task_name=job.task_name,
        queue=job.queue,
        priority=job.priority,
        message=replace(job.message, headers=str(kjson.dumps(headers))),
        due=due,
        attempts=attempts,
        resource=job.resource,
    )


def _decoded(claimed: dict[str, Any] | None, text: str) -> dict[str, Any]:
    """A header or property object as kombu decodes it; the claim's plain JSON decoding (a
    copy) where kombu's would be the same (:func:`decodes_plainly`)."""
    if claimed is None or not decodes_plainly(text):
        decoded: dict[str, Any] = kjson.loads(text)
        return decoded
    return dict(claimed)


def decodes_plainly(text: str | bytes) -> bool:
    """Whether kombu's JSON decoding of ``text`` is plain JSON decoding: no value of a type
    kombu marks (``{"__type__": ..., "__value__": ...}``) is in it, nor a ``\\u`` escape,
    which could spell that mark. kombu decodes every object through a Python hook for it."""
    if isinstance(text, bytes):
        return b"__type__" not in text and b"\\u" not in text
    return "__type__" not in text and "\\u" not in text


#: kombu's own JSON decoder, registered for application/json unless an app replaced it.
_KOMBU_DECODER = kjson.loads


class JobMessage(KombuMessage):
    """A claimed job dressed as a delivered message.

    It owns the end of its execution: :meth:`end` reports the outcome once, and later
    reports for the same execution are ignored. Acknowledging means nothing to the row.
    """

    def __init__(
        self,
        job: ClaimedJob,
        *,
        accept: Collection[str] | None,
        on_end: EndCallback,
        max_payload_kb: int | None = None,
    ) -> None:
        headers = _decoded(job.decoded_headers, job.message.headers)
        body = job.message.payload
        if max_payload_kb is not None:
            # Within a bound: kombu's decompression takes whatever a bomb makes.
            body = uncompressed_body(body, headers, max_payload_kb, job.task_name)
        headers[CLAIM_HEADER] = job.token
        if job.fence is not None:
            headers[FENCE_HEADER] = job.fence
        properties = _decoded(job.decoded_properties, job.message.properties)
        #: What the sender's message carried, as stock reports it (a transport's 0 when
        #: the sender set none); Celery's request keeps the row's, which retries and
        #: inheriting children copy, so their claim order stays the row's.
        self.sent_priority: int = properties.get("priority") or 0
        properties["priority"] = job.priority
        super().__init__(
            body=body,
            delivery_tag=job.id,
            content_type=job.message.content_type,
            content_encoding=job.message.content_encoding,
            delivery_info={
                "exchange": "",
                "routing_key": job.queue,
                "priority": job.priority,
                "redelivered": job.claims > 1,
            },
            properties=properties,
            headers=headers,
            accept=accept,
        )
        self.job = job
        self._on_end = on_end
        self._ended = False

    def _decode(self) -> Any:
        """The body as kombu decodes it: with the C decoder alone where kombu's JSON decoding
        would give the same (accepted JSON in UTF-8, kombu's own decoder, nothing typed in
        it); kombu's Python hook on every object was a tenth of the claim loop's time."""
        body, accept = self.body, self.accept
        if (
            type(body) is bytes
            and self.content_type == "application/json"
            and self.content_encoding == "utf-8"
            and accept is not None
            and "application/json" in accept
            and _json_decoder() is _KOMBU_DECODER
            and decodes_plainly(body)
        ):
            try:
                return json.loads(body.decode("utf-8"))  # strictly UTF-8, as kombu decodes
            except Exception:
                pass  # kombu's decoding raises what it raises for it (a DecodeError)
        return super()._decode()

    def end(
        self,
        status: JobStatus | None,
        error: str | None = None,
        traceback: str | None = None,
        *,
        failed: bool | None = None,
    ) -> None:
        """Report how this execution ended; ``None``: the row already moved on (a retry)."""
        if not self._ended:
            self._ended = True
            if failed is None:
                failed = {JobStatus.SUCCEEDED: False, JobStatus.FAILED: True}.get(status)  # type: ignore[arg-type]
            self._on_end(self.job, status, error, traceback, failed)

    def ack(self, multiple: bool = False) -> None:
        set_message_state(self, "ACK")

    def reject(self, requeue: bool = False) -> None:
        set_message_state(self, "REQUEUED" if requeue else "REJECTED")
        if requeue:
            self.end(JobStatus.PENDING)
        else:
            self.end(JobStatus.FAILED, error=REJECTED)

    def requeue(self) -> None:
        self.reject(requeue=True)


REJECTED = error_record(
    "Reject", ["the task rejected its message without requeue"], "celery.exceptions"
)


def _json_decoder() -> Any:
    decoders = serializer_decoders()
    return decoders.get("application/json") if decoders is not None else None
