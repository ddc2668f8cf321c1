"""The messages kombu's Redis transport holds: each queue's list, its priority sub-queues, and
the ``unacked`` hash (the messages workers took and had not acknowledged: the ETA and
countdown tasks a worker holds until they are due, and what a dead worker held).

A batch is moved out of a queue into a staging list of the same Redis (one command per
message, atomic: no consumer can take it meanwhile, and no other run), written to the store,
and only then trimmed off the staging list; messages the store refuses go back to their
queue. A run cut off with messages in a staging list moves them first when it runs again.
Messages of the ``unacked`` hash are read in place and deleted from it once committed.

One run at a time: every change a run makes to the broker is a script that first checks that
the run still holds the database's lock. A run stopped longer than the lock lives (Ctrl-Z, a
paused machine, Redis out of reach) comes back to find another run holding it, and stops
there: trimming the staging list then would drop the other run's batch, not its own.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from celery_ratchet.celery.broker_import.chords import redis_client
from celery_ratchet.celery.broker_import.convert import (
    BrokerMessage,
    Decode,
    Refused,
    chord_of,
)
from celery_ratchet.celery.broker_import.mover import Item
from celery_ratchet.errors import ConfigurationError, ImportLockLost
from celery_ratchet.threads import background_thread

#: kombu's Redis transport: the separator of a priority sub-queue's name, and the priorities
#: that have one (a message goes to the highest step not above its priority); the keys of
#: the unacknowledged messages. Each can be changed in ``broker_transport_options``.
_DEFAULTS = {
    "sep": "\x06\x16",
    "priority_steps": [0, 3, 6, 9],
    "unacked_key": "unacked",
    "unacked_index_key": "unacked_index",
    "global_keyprefix": "",
}
_BINDING_PREFIX = "_kombu.binding."
STAGING_PREFIX = "ratchet.import."
LOCK_KEY = "ratchet.import.lock"
#: The lock is renewed while a run goes on; one cut off frees it after this long.
LOCK_SECONDS = 15.0

#: The scripts that change the broker, each only while this run holds the lock (KEYS[1] holds
#: ARGV[1]); otherwise they change nothing and answer LOCK_LOST.
_LOCK_LOST = "RATCHET_IMPORT_LOCK_LOST"
_EXTEND = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('pexpire', KEYS[1], ARGV[2])
"""
_RELEASE = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('del', KEYS[1])
"""
#: KEYS: lock, queue, staging; ARGV: token, how many to move.
_TAKE = f"""
if redis.call('get', KEYS[1]) ~= ARGV[1] then return redis.error_reply('{_LOCK_LOST}') end
local taken = {{}}
for i = 1, tonumber(ARGV[2]) do
  local value = redis.call('rpoplpush', KEYS[2], KEYS[3])
  if not value then break end
  taken[#taken + 1] = value
end
return taken
"""
#: KEYS: lock, unacked, unacked index, then (queue, staging) pairs; ARGV: token, the count of
#: unacked tags and the tags, then per pair how many to trim, how many to give back and those.
_SETTLE = f"""
if redis.call('get', KEYS[1]) ~= ARGV[1] then return redis.error_reply('{_LOCK_LOST}') end
local at = 3
for i = 1, tonumber(ARGV[2]) do
  redis.call('hdel', KEYS[2], ARGV[at])
  redis.call('zrem', KEYS[3], ARGV[at])
  at = at + 1
end
for k = 4, #KEYS, 2 do
  local count, back = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
  at = at + 2
  for i = 1, back do
    redis.call('lpush', KEYS[k], ARGV[at])
    at = at + 1
  end
  redis.call('ltrim', KEYS[k + 1], 0, -(count + 1))
end
return 1
"""

#: A chord embedded in a JSON body, as kombu's encoder writes it (a null one does not match).
_CHORD_IN_JSON = re.compile(rb'"chord":\s*\{')

#: The last command of a client that consumes from this database: a blocking pop (a Celery
#: worker's consumer waits so for messages, a second at a time). Subscribers are not counted:
#: a process that reads results from a Redis result backend subscribes too.
_CONSUMING = {"brpop", "blpop", "brpoplpush", "blmove", "bzpopmin", "bzpopmax"}


@dataclass(frozen=True)
class _Key:
    """A list to move: a queue's (or a priority sub-queue's) key, and its queue's name."""

    key: str
    queue: str


class RedisSource:
    """What kombu's Redis transport holds for ``queues`` at ``url``.

    ``unacked``: ``"auto"`` moves the unacknowledged messages only when no other client
    consumes from this database (their holders are gone), ``"always"``, or ``"never"``.
    """

    def __init__(
        self,
        url: str,
        queues: Sequence[str],
        transport_options: dict[str, Any] | None = None,
        *,
        unacked: str = "auto",
    ) -> None:
        redis = redis_client()

        options = {**_DEFAULTS, **(transport_options or {})}
        self.prefix = str(options["global_keyprefix"])
        self.sep = str(options["sep"])
        self.steps = sorted(int(s) for s in options["priority_steps"])
        self.unacked_key = self.prefix + str(options["unacked_key"])
        self.unacked_index_key = self.prefix + str(options["unacked_index_key"])
        self.queues = list(dict.fromkeys(queues))
        self.unacked = unacked
        self.client: Any = redis.Redis.from_url(url)
        self.lock_key = self.prefix + LOCK_KEY
        self._lock_token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._renewing: threading.Thread | None = None
        self._stop = threading.Event()
        self._extend = self.client.register_script(_EXTEND)
        self._release = self.client.register_script(_RELEASE)
        self._take_script = self.client.register_script(_TAKE)
        self._settle_script = self.client.register_script(_SETTLE)
        #: Why the unacknowledged messages were left, when they were.
        self.unacked_refusal: str | None = None

    # -- the run's lock -----------------------------------------------------------------------

    def lock(self, wait: float = LOCK_SECONDS + 5) -> None:
        """Take the lock of import runs on this Redis database, waiting for one cut off to
        free it; renewed until :meth:`close`."""
        deadline = time.monotonic() + wait
        ttl = int(LOCK_SECONDS * 1000)
        while not self.client.set(self.lock_key, self._lock_token, nx=True, px=ttl):
            if time.monotonic() > deadline:
                holder = self.client.get(self.lock_key)
                raise ConfigurationError(
                    f"another import-broker run holds this Redis database "
                    f"({(holder or b'?').decode(errors='replace')}); wait for it to end"
                )
            time.sleep(0.2)
        self._renewing = background_thread(self._renew, "import-lock")
        self._renewing.start()

    def _renew(self) -> None:
        ttl = int(LOCK_SECONDS * 1000)
        while not self._stop.wait(LOCK_SECONDS / 3):
            try:
                if not self._extend(keys=[self.lock_key], args=[self._lock_token, ttl]):
                    return  # another run holds it now: this one's next change is refused
            except Exception:  # a failed renewal: the next one tries again
                continue

    def _fenced(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """Run ``script`` if this run still holds the lock; else ImportLockLost."""
        try:
            return script(keys=[self.lock_key, *keys], args=[self._lock_token, *args])
        except Exception as exc:
            if _LOCK_LOST not in str(exc):
                raise
        raise ImportLockLost(
            "this import-broker run lost its lock on the Redis database: it was stopped or "
            f"cut off from Redis for more than {LOCK_SECONDS:g} s and another run took over. "
            "It stopped without changing the broker again; what it wrote to the store is "
            "found present by the run that holds the lock. Let that run finish, or run again"
        )

    def close(self) -> None:
        self._stop.set()
        if self._renewing is not None:
            self._renewing.join(5)
            with contextlib.suppress(Exception):  # only our own lock: not one taken over
                self._release(keys=[self.lock_key], args=[self._lock_token])
        self.client.close()

    # -- what the queues hold -----------------------------------------------------------------

    def keys(self) -> list[_Key]:
        """Each queue's list, then its priority sub-queues' (kombu takes the lowest step
        first), each as kombu names it."""
        found = []
        for queue in self.queues:
            for step in self.steps:
                name = f"{queue}{self.sep}{step}" if step else queue
                found.append(_Key(self.prefix + name, queue))
        return found

    def sizes(self) -> dict[str, int]:
        """Messages per queue (sub-queues and staging lists included), and ``unacked``."""
        sizes: dict[str, int] = {}
        for key in self.keys():
            count = self.client.llen(key.key) + self.client.llen(self._staging(key))
            sizes[key.queue] = sizes.get(key.queue, 0) + int(count)
        sizes["(unacked)"] = int(self.client.hlen(self.unacked_key))
        return sizes

    def chord_members(self, decode: Decode) -> dict[str, int]:
        """Per chord id, how many of its header tasks the queues and ``unacked`` hold."""
        counts: dict[str, int] = {}
        for item in self._everything():
            message = item.message
            if not isinstance(message, BrokerMessage):
                continue
            chord = _chord_in(message, decode)
            if chord is not None:
                counts[chord] = counts.get(chord, 0) + 1
        return counts

    def _everything(self) -> Iterator[Item]:
        for key in self.keys():
            for source in (self._staging(key), key.key):
                start = 0
                while True:
                    raw = self.client.lrange(source, start, start + 999)
                    if not raw:
                        break
                    for value in raw:
                        yield _item(value, key.queue, None)
                    start += len(raw)
        if self._unacked_allowed():
            for batch in self._unacked_batches(1000):
                yield from batch

    # -- moving ---------------------------------------------------------------------------------

    def batches(self, size: int, dry_run: bool) -> Iterator[list[Item]]:
        for key in self.keys():
            if dry_run:
                yield from self._peek(key, size)
            else:
                yield from self._take(key, size)
        if self._unacked_allowed():
            yield from self._unacked_batches(size)
        elif self.unacked_refusal and self.client.hlen(self.unacked_key):
            # Not moved: reported per queue they are of, left where they are.
            yield from self._unacked_batches(size, only_report=True)

    def _peek(self, key: _Key, size: int) -> Iterator[list[Item]]:
        for source in (self._staging(key), key.key):
            start = 0
            while True:
                raw = self.client.lrange(source, -(start + size), -(start + 1))
                if not raw:
                    break
                yield [_item(value, key.queue, None) for value in reversed(raw)]
                start += len(raw)

    def _take(self, key: _Key, size: int) -> Iterator[list[Item]]:
        staging = self._staging(key)
        left = self.client.lrange(staging, 0, -1)
        if left:  # a run cut off before it trimmed these: moved, or found present, now
            yield [_item(v, key.queue, ("staged", key, staging, v)) for v in reversed(left)]
        # Only what the list held at the start: messages given back go to its other end.
        remaining = int(self.client.llen(key.key))
        while remaining > 0:
            count = min(size, remaining)
            taken = self._fenced(self._take_script, [key.key, staging], [count])
            if not taken:
                return
            remaining -= len(taken)
            yield [_item(v, key.queue, ("staged", key, staging, v)) for v in taken]

    def _unacked_batches(self, size: int, only_report: bool = False) -> Iterator[list[Item]]:
        batch: list[Item] = []
        wanted = set(self.queues)
        bindings: dict[str, list[tuple[str, str]]] = {}
        for tag, value in self.client.hscan_iter(self.unacked_key, count=size):
            try:
                message, exchange, routing_key = json.loads(value)
                queues = self._routed(bindings, str(exchange or ""), str(routing_key or ""))
                queue = next((q for q in queues if q in wanted), None)
            except (ValueError, TypeError):
                queue = None
                message = None
            if queue is None:
                continue  # of a queue not moved (or not readable): left where it is
            if only_report:
                reason = self.unacked_refusal or "left in unacked"
                batch.append(Item(("unacked", tag), queue, Refused(reason, _id_of(message))))
            else:
                batch.append(_item(message, queue, ("unacked", tag)))
            if len(batch) >= size:
                yield batch
                batch = []
        if batch:
            yield batch

    def _routed(
        self, bindings: dict[str, list[tuple[str, str]]], exchange: str, routing_key: str
    ) -> list[str]:
        """The queues kombu delivers (exchange, routing key) to, from its binding table."""
        if not exchange:
            return [routing_key]
        if exchange not in bindings:
            found = []
            for member in self.client.smembers(f"{self.prefix}{_BINDING_PREFIX}{exchange}"):
                rk, _, queue = member.decode().split(self.sep, 2)
                found.append((rk, queue))
            bindings[exchange] = found
        routed = [q for rk, q in bindings[exchange] if rk in (routing_key, "")]
        return routed or [routing_key]

    def settle(self, batch: Sequence[Item], refused: Sequence[Item]) -> None:
        given_back = {id(item) for item in refused}
        staged: dict[str, tuple[_Key, int, list[bytes]]] = {}
        acked: list[bytes] = []
        for item in batch:
            kind = item.handle[0]
            if kind == "staged":
                _, key, staging, value = item.handle
                _, count, back = staged.setdefault(staging, (key, 0, []))
                if id(item) in given_back:
                    back.append(value)
                staged[staging] = (key, count + 1, back)
            elif kind == "unacked" and id(item) not in given_back:
                acked.append(item.handle[1])
        # Refused ones go to their queue's newest end: this run takes no more than it held.
        keys = [self.unacked_key, self.unacked_index_key]
        args: list[Any] = [len(acked), *acked]
        for staging, (key, count, back) in staged.items():
            keys += [key.key, staging]
            args += [count, len(back), *back]
        self._fenced(self._settle_script, keys, args)

    def _staging(self, key: _Key) -> str:
        return f"{self.prefix}{STAGING_PREFIX}{key.key[len(self.prefix) :]}"

    # -- the unacknowledged messages --------------------------------------------------------------

    def _unacked_allowed(self) -> bool:
        if self.unacked == "never":
            self.unacked_refusal = "left in unacked (--unacked never)"
            return False
        if self.unacked == "always":
            return True
        consumers = self.consumers()
        if consumers is None:
            self.unacked_refusal = (
                "left in unacked: this Redis does not say which clients are connected "
                "(CLIENT LIST is refused), so its holder may be alive; stop every Celery worker "
                "of this broker and pass --unacked always"
            )
            return False
        if consumers:
            self.unacked_refusal = (
                f"left in unacked: {consumers} other clients consume from this Redis database "
                "(Celery workers?); a message one of them holds would run twice: stop them "
                "and run again"
            )
            return False
        return True

    def consumers(self) -> int | None:
        """Other clients of this database waiting on a queue or subscribed (Celery workers);
        None when the server does not say."""
        try:
            mine = self.client.client_id()
            clients = self.client.client_list()
        except Exception:  # a managed Redis may refuse CLIENT LIST
            return None
        db = self.client.connection_pool.connection_kwargs.get("db", 0)
        return sum(
            1
            for c in clients
            if str(c.get("id")) != str(mine)
            and int(c.get("db", -1)) == int(db)
            and c.get("cmd") in _CONSUMING
        )


def _item(value: Any, queue: str, handle: Any) -> Item:
    """A raw list value (or an unacked entry's message) as an item to move."""
    message: BrokerMessage | Refused
    try:
        envelope = json.loads(value) if isinstance(value, (bytes, str)) else value
        message = _message(envelope, queue)
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeError) as exc:
        message = Refused(f"not a kombu message ({type(exc).__name__})")
    return Item(handle, queue, message)


def _message(envelope: dict[str, Any], queue: str) -> BrokerMessage:
    properties = dict(envelope.get("properties") or {})
    body = envelope["body"]
    encoding = envelope.get("content-encoding") or "utf-8"
    if properties.get("body_encoding") == "base64":
        raw = base64.b64decode(body)
    else:
        raw = body.encode(encoding) if isinstance(body, str) else bytes(body)
    return BrokerMessage(
        body=raw,
        content_type=envelope.get("content-type"),
        content_encoding=encoding,
        headers=dict(envelope.get("headers") or {}),
        properties=properties,
        queue=queue,
    )


def _id_of(envelope: Any) -> str | None:
    headers = envelope.get("headers") if isinstance(envelope, dict) else None
    found = headers.get("id") if isinstance(headers, dict) else None
    return found if isinstance(found, str) else None


def _chord_in(message: BrokerMessage, decode: Decode) -> str | None:
    if (
        message.content_type == "application/json"
        and not message.headers.get("compression")
        and not _CHORD_IN_JSON.search(message.body)
    ):
        return None  # no chord embedded (nor in a chain step): not worth decoding
    decoded = decode(message)
    if isinstance(decoded, Refused):
        return None
    headers, body = decoded
    chord = chord_of(headers, body)
    return chord.group_id if chord is not None else None
