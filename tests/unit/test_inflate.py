"""A compressed message body is decompressed within a bound: a bomb (a few hundred bytes of
bzip2 that decompress to a gigabyte) is refused after at most the bound's worth of output,
never decompressed whole."""

from __future__ import annotations

import bz2
import lzma
import tracemalloc
import zlib
from collections.abc import Callable

import pytest
from kombu.compression import compress

from celery_ratchet.celery.send.inflate import inflate, inflated_limit
from celery_ratchet.errors import MalformedJob, PayloadTooLarge

MIB = 1 << 20


def _zlib_bomb(mib: int) -> bytes:
    """One zlib stream of ``mib`` MiB of zeros (about 1 KB a MiB)."""
    packer = zlib.compressobj(9)
    chunk = bytes(MIB)
    return b"".join(packer.compress(chunk) for _ in range(mib)) + packer.flush()


def _concatenated(pack: Callable[[bytes], bytes], mib: int) -> bytes:
    """Streams of 16 MiB of zeros each, one after another: ``mib`` MiB in all, as
    ``bz2.decompress`` and ``lzma.decompress`` read them (and kombu with them)."""
    return pack(bytes(16 * MIB)) * (mib // 16)


#: An xz stream of one byte whose header claims a 1.5 GiB dictionary for its decoder.
XZ_HUGE_DICTIONARY = bytes.fromhex(
    "fd377a585a000004e6d6b44602002101250000003b787b41010000780000000045aeef83f8ee160a"
    "00011901a52c81cc1fb6f37d010000000004595a"
)

BOMBS = {
    "application/x-gzip": lambda: _zlib_bomb(64),
    "application/x-bz2": lambda: _concatenated(bz2.compress, 1024),
    "application/x-lzma": lambda: _concatenated(lzma.compress, 1024),
}


@pytest.mark.parametrize("compression", sorted(BOMBS))
def test_a_bomb_is_refused_within_the_bound(compression: str) -> None:
    bomb = BOMBS[compression]()
    limit = inflated_limit(100)
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge) as refused:
            inflate(bomb, compression, limit, max_payload_kb=100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The output up to the bound, and the decoder's own buffers (xz: its 8 MiB dictionary).
    assert peak < 4 * limit, f"{peak / MIB:.0f} MiB taken to refuse it"
    message = str(refused.value)
    assert "ratchet_max_payload_kb" in message and f"{limit // 1024} KB" in message, message


@pytest.mark.parametrize("compression", ["zlib", "gzip", "bzip2", "lzma", "xz"])
def test_what_the_sender_compressed_comes_back_whole(compression: str) -> None:
    body = b'[["x"], {"n": 1}, {}]' * 1000
    packed, content_type = compress(body, compression)
    assert inflate(packed, content_type, inflated_limit(100), max_payload_kb=100) == body
    # A hand-written row may name the compression by its alias.
    assert inflate(packed, compression, inflated_limit(100), max_payload_kb=100) == body


def test_a_body_of_exactly_the_bound_passes() -> None:
    limit = inflated_limit(1)
    body = b"a" * limit
    packed, content_type = compress(body, "bzip2")
    assert inflate(packed, content_type, limit, max_payload_kb=1) == body
    with pytest.raises(PayloadTooLarge):
        inflate(compress(body + b"a", "bzip2")[0], content_type, limit, max_payload_kb=1)


@pytest.mark.parametrize(
    ("data", "compression", "says"),
    [
        (b"not compressed at all", "application/x-bz2", "is not valid"),
        (bz2.compress(b"x" * 1000)[:-10], "application/x-bz2", "ends before"),
        (zlib.compress(b"x" * 1000)[:-4], "application/x-gzip", "ends before"),
        (b"whatever", "application/x-brotli", "brotli"),
        (XZ_HUGE_DICTIONARY, "application/x-lzma", "(LZMAError)"),
    ],
)
def test_a_body_that_cannot_be_decompressed_is_a_malformed_job(
    data: bytes, compression: str, says: str
) -> None:
    with pytest.raises(MalformedJob) as refused:
        inflate(data, compression, inflated_limit(100), max_payload_kb=100)
    assert says in str(refused.value)
