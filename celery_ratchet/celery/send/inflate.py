"""A compressed message body, decompressed within a bound.

kombu decompresses a body whole, and a few hundred bytes of bzip2 written into a row by hand
decompress to gigabytes: in the worker's main process, which claims and hands out every job.
Here the output stops one byte past the bound, and the job fails alone. The bound is a
multiple of ``ratchet_max_payload_kb``, which limits the compressed body a sender stores; a
sender refuses a body whose compression hides more than the bound (see ``job_from_message``),
so a worker never refuses what a sender of the same settings stored.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable
from typing import Any

from celery_ratchet.errors import CompressedPayloadTooLarge, MalformedJob

#: A body decompresses to at most this many times ``ratchet_max_payload_kb``: JSON arguments
#: compress 5 to 20 times; a bomb, a million times.
INFLATION_FACTOR = 64


class _Format:
    def __init__(
        self,
        label: str,
        make: Callable[[], Any],
        streams: bool,
        errors: tuple[type[Exception], ...],
    ) -> None:
        self.label = label
        self.make = make
        #: Whether streams written one after another are one body (bzip2 and xz, as their
        #: module's decompress reads them; a zlib body ends with its first stream).
        self.streams = streams
        self.errors = errors


_ZLIB = _Format("zlib", zlib.decompressobj, False, (zlib.error,))
_BZ2 = _Format("bzip2", bz2.BZ2Decompressor, True, (OSError, ValueError))
#: xz names the dictionary its decoder allocates: the most any preset asks (64 MiB) and a
#: half more, not what a stream written by hand may claim (up to 4 GiB).
_LZMA_MEMLIMIT = 96 * 1024 * 1024
_LZMA = _Format(
    "lzma", lambda: lzma.LZMADecompressor(memlimit=_LZMA_MEMLIMIT), True, (lzma.LZMAError,)
)

#: kombu's content types and their aliases (``kombu.compression``), for the three formats
#: whose decompressors take a bound on their output.
_FORMATS = {
    "application/x-gzip": _ZLIB,
    "gzip": _ZLIB,
    "zlib": _ZLIB,
    "application/x-bz2": _BZ2,
    "bzip2": _BZ2,
    "bzip": _BZ2,
    "application/x-lzma": _LZMA,
    "lzma": _LZMA,
    "xz": _LZMA,
}


def inflated_limit(max_payload_kb: int) -> int:
    """The most bytes a compressed body may decompress to, in bytes."""
    return INFLATION_FACTOR * max_payload_kb * 1024


def bounded(compression: str) -> bool:
    """Whether a worker decompresses ``compression`` (a content type or an alias)."""
    return compression in _FORMATS


def unbounded_compression(compression: str) -> str:
    return (
        f"compression {compression!r} is not one a ratchet worker decompresses within a "
        "bound (zlib or gzip, bzip2, lzma or xz): a worker refuses it rather than "
        "decompress a body of unknown size in its main process"
    )


def inflate(
    data: bytes, compression: str, limit: int, *, max_payload_kb: int, task_name: str = "?"
) -> bytes:
    """``data`` decompressed; :class:`CompressedPayloadTooLarge` once the output passes ``limit``
    bytes (having made at most one byte more), :class:`MalformedJob` when it cannot be."""
    found = _FORMATS.get(compression)
    if found is None:
        raise MalformedJob(f"its message cannot be read: {unbounded_compression(compression)}")
    parts: list[bytes] = []
    made = 0
    rest = data
    while True:
        stream = found.make()
        try:
            part = stream.decompress(rest, limit + 1 - made)
        except found.errors as exc:
            raise MalformedJob(
                f"its payload is not valid {found.label} data ({type(exc).__name__})"
            ) from None
        made += len(part)
        if made > limit:
            raise CompressedPayloadTooLarge(task_name, limit, max_payload_kb)
        parts.append(part)
        if not stream.eof:
            raise MalformedJob(f"its {found.label} payload ends before its compressed stream does")
        rest = stream.unused_data
        if not (found.streams and rest):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def uncompressed_body(
    body: bytes, headers: dict[str, Any], max_payload_kb: int, task_name: str
) -> bytes:
    """A message's body decompressed within the bound when its headers name a compression,
    which is then taken out of them, so that kombu does not decompress it again."""
    compression = headers.get("compression")
    if not compression:
        return body
    inflated = inflate(
        body,
        str(compression),
        inflated_limit(max_payload_kb),
        max_payload_kb=max_payload_kb,
        task_name=task_name,
    )
    del headers["compression"]
    return inflated
