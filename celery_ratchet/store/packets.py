"""MySQL/MariaDB take a statement of at most ``max_allowed_packet`` bytes: one over it is
refused (1153) or its connection dropped (2006, 2013), which reads as an outage, tried again
for as long as the store is retried. The limit is read as each connection is made, and a
statement that cannot fit is refused before it is sent, with the limit and the setting."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from celery_ratchet.errors import StatementTooLarge

#: The server's max_allowed_packet as the last connection made to it read it, by URL (the
#: store's engines to one database share it).
_LIMITS: dict[str, int] = {}
#: What pymysql escapes in a string or bytes literal: each takes two bytes.
_ESCAPED = (b"\\", b"'", b'"', b"\0", b"\n", b"\r", b"\x1a")
#: The statement's text and its other, small values.
_STATEMENT_ROOM = 64 * 1024
#: MySQL/MariaDB: ER_NET_PACKET_TOO_LARGE, and the connection dropped (server gone, lost).
_TOO_LARGE = 1153
_DROPPED = {2006, 2013}


def read_limit(engine: Engine, dbapi_connection: Any) -> None:
    """Read the server's max_allowed_packet on a new connection of ``engine``."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SELECT @@max_allowed_packet")
        row = cursor.fetchone()
    finally:
        cursor.close()
    if row and row[0]:
        _LIMITS[repr(engine.url)] = int(row[0])


def packet_limit(engine: Engine) -> int | None:
    """The server's max_allowed_packet; None where there is none (or none read yet)."""
    url = getattr(engine, "url", None)  # None: a stand-in for an engine
    return None if url is None else _LIMITS.get(repr(url))


def sent_size(values: Iterable[Any]) -> int:
    """Bytes the values take in a statement as the driver writes them, escapes counted."""
    size = 0
    for value in values:
        if isinstance(value, str):
            value = value.encode("utf-8", "surrogatepass")
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
            size += len(data) + sum(data.count(c) for c in _ESCAPED) + 3
        else:
            size += len(str(value)) + 1
    return size


def _too_large(limit: int, size: int, what: str) -> StatementTooLarge:
    return StatementTooLarge(
        f"the job store's server takes statements of at most max_allowed_packet = {limit} "
        f"bytes (a setting of MySQL/MariaDB), and this one takes about {size} bytes; "
        f"{what}. Store a reference to the data (an object-store key, a file path) instead "
        "of the data, or raise max_allowed_packet on the server"
    )


def refuse_oversized(engine: Engine, values: Mapping[str, Any], what: str) -> None:
    """:class:`StatementTooLarge` when a statement with ``values`` cannot fit the server's
    max_allowed_packet: before it is sent. Nothing is checked where no limit is known."""
    limit = packet_limit(engine)
    if limit is None:
        return
    # A cheap bound first: only values near the limit are read for their escapes.
    rough = sum(len(v) for v in values.values() if isinstance(v, (str, bytes)))
    if 2 * rough + _STATEMENT_ROOM < limit:
        return
    size = sent_size(values.values()) + _STATEMENT_ROOM
    if size > limit:
        raise _too_large(limit, size, what)


def _values(params: Any) -> list[Any]:
    """The values of a statement's parameters: one row's (a mapping, a tuple) or many's."""
    if isinstance(params, Mapping):
        return list(params.values())
    if isinstance(params, (list, tuple)):
        if params and all(isinstance(row, (Mapping, list, tuple)) for row in params):
            return [value for row in params for value in _values(row)]
        return list(params)
    return []


def dropped_for_size(engine: Engine, exc: DBAPIError) -> bool:
    """Whether ``exc`` is the server refusing a statement over max_allowed_packet: its 1153,
    or the connection it dropped (2006, 2013) under a statement that did not fit."""
    args = getattr(exc.orig, "args", None) or (None,)
    if args[0] == _TOO_LARGE:
        return True
    if not (isinstance(args[0], int) and args[0] in _DROPPED):
        return False
    limit = packet_limit(engine)
    return limit is not None and sent_size(_values(exc.params)) >= limit


def too_large(engine: Engine, exc: DBAPIError, what: str) -> StatementTooLarge:
    return _too_large(packet_limit(engine) or 0, sent_size(_values(exc.params)), what)
