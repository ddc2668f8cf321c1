"""A loopback TCP proxy in front of a database server that can lose one reply, or leave
connections half-open.

Armed with a marker (``b"INSERT INTO scheduler_job"``), it forwards the next client packet
holding the marker, swallows the server's reply to it (the statement ran and, in autocommit,
committed), cuts every connection it carries, and then refuses new connections: a given number
of them, or until :meth:`LossyProxy.accept_again`. :meth:`LossyProxy.freeze_open` stops relaying
on every connection open at that moment, in both directions, while keeping both ends open (what
a NAT or firewall that forgot a connection does), and lets new connections through. Listens on
127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

from sqlalchemy.engine import make_url


class _Pair:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.swallow_reply = False
        #: Set while the pair relays; cleared by a freeze (the pumps hold what they read).
        self.relaying = threading.Event()
        self.relaying.set()
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self.relaying.set()  # a pump holding data returns
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class LossyProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port: int = self.sock.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._marker: bytes | None = None
        self._refuse_next = 0
        self._refusing = False
        #: Set once a reply was swallowed.
        self.dropped = threading.Event()
        #: Connections refused since the reply was swallowed.
        self.refused = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @classmethod
    def in_front_of(cls, url: str) -> tuple[LossyProxy, str]:
        """A proxy to the server of ``url``, and ``url`` pointed at the proxy."""
        parsed = make_url(url)
        proxy = cls(parsed.host or "127.0.0.1", int(parsed.port or 0))
        return proxy, parsed.set(host="127.0.0.1", port=proxy.port).render_as_string(False)

    def lose_reply_to(self, marker: bytes, *, refuse: int | None) -> None:
        """Swallow the reply to the next packet holding ``marker``; then refuse ``refuse``
        connections (``None``: every one, until :meth:`accept_again`)."""
        with self._lock:
            self._marker = marker
            self._refuse_next = refuse or 0
            self._refuse_until_told = refuse is None

    def freeze_open(self) -> int:
        """Stop relaying on every connection open now, both ways, keeping them open: what is
        sent on them is never delivered, and neither end learns it. New connections pass.
        Returns how many were frozen."""
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            pair.relaying.clear()
        return len(pairs)

    def accept_again(self) -> None:
        with self._lock:
            self._refusing = False
            self._refuse_until_told = False

    def close(self) -> None:
        self.sock.close()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()

    # -- plumbing ---------------------------------------------------------------------------

    _refuse_until_told = False

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                refuse = self._refusing and (self._refuse_until_told or self._refuse_next > 0)
                if refuse:
                    self.refused += 1
                    if not self._refuse_until_told:
                        self._refuse_next -= 1
                        self._refusing = self._refuse_next > 0
            if refuse:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            pair = _Pair(client, server)
            with self._lock:
                self._pairs.append(pair)
            threading.Thread(target=self._upstream, args=(pair,), daemon=True).start()
            threading.Thread(target=self._downstream, args=(pair,), daemon=True).start()

    def _upstream(self, pair: _Pair) -> None:
        self._pump(pair.client, pair.server, pair, upstream=True)

    def _downstream(self, pair: _Pair) -> None:
        self._pump(pair.server, pair.client, pair, upstream=False)

    def _pump(
        self, source: socket.socket, sink: socket.socket, pair: _Pair, upstream: bool
    ) -> None:
        try:
            while True:
                data = source.recv(65536)
                pair.relaying.wait()  # frozen: not even an end of stream is passed on
                if pair.closed:
                    return
                if not data:
                    break
                if upstream:
                    with self._lock:
                        if self._marker is not None and self._marker in data:
                            self._marker = None
                            pair.swallow_reply = True
                elif pair.swallow_reply:
                    self._cut_everything()
                    return
                sink.sendall(data)
        except OSError:
            pass
        self._forget(pair)

    def _cut_everything(self) -> None:
        with self._lock:
            self._refusing = self._refuse_until_told or self._refuse_next > 0
            pairs, self._pairs = self._pairs, []
        self.dropped.set()
        for pair in pairs:
            pair.close()

    def _forget(self, pair: _Pair) -> None:
        with self._lock:
            if pair in self._pairs:
                self._pairs.remove(pair)
        pair.close()

    def __enter__(self) -> LossyProxy:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()
