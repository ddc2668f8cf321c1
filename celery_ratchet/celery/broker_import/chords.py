"""What the old result backend knows of a chord: its size, and how many of its header tasks
returned. Celery (5.x) keeps the size of a chord in the result backend, not in the messages
of its header; the Redis result backend keeps it under the chord's key with ``.s``, the
returned parts under ``.j`` (a list, or a sorted set when ordered) and a correction under
``.t``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery_ratchet.errors import ConfigurationError

#: Celery's key-value result backends' prefix of a group's keys.
_GROUP_PREFIX = "celery-taskset-meta-"


@dataclass(frozen=True)
class ChordState:
    size: int | None
    returned: int


def redis_client() -> Any:
    """redis-py, which the Redis broker needs: it comes with the ``redis`` extra."""
    try:
        import redis
    except ImportError:
        raise ConfigurationError(
            "reading a Redis broker needs the redis client: pip install 'celery-ratchet[redis]'"
        ) from None
    return redis


class RedisChordStates:
    """Reads (never writes) a Redis result backend's chord counters."""

    def __init__(self, url: str) -> None:
        redis = redis_client()

        self.url = url
        self.client: Any = redis.Redis.from_url(url)

    def of(self, group_id: str) -> ChordState:
        key = f"{_GROUP_PREFIX}{group_id}"
        size = self.client.get(f"{key}.s")
        joined = f"{key}.j"
        kind = self.client.type(joined)
        returned = int(
            self.client.zcard(joined) if kind == b"zset" else self.client.llen(joined) or 0
        )
        correction = self.client.get(f"{key}.t")
        total = int(size) + int(correction or 0) if size is not None else None
        return ChordState(total, returned)

    def close(self) -> None:
        self.client.close()
