"""The in-memory store's remote control: broadcast commands and the replies to them."""

from __future__ import annotations

from datetime import datetime, timedelta

from celery_ratchet.domain.control import CONTROL_WAKEUP, ControlCommand, ControlReply
from celery_ratchet.store.memory.rows import (
    ControlRow,
    ReplyRow,
)
from celery_ratchet.store.memory.state import MemoryState


class ControlRows:
    """Remote control: broadcasts and their replies."""

    def __init__(self, state: MemoryState) -> None:
        self.state = state

    def broadcast(
        self,
        command: str,
        arguments: str,
        *,
        destination: str | None = None,
        pattern: str | None = None,
        matcher: str | None = None,
        ticket: str | None = None,
        ttl_seconds: float,
    ) -> None:
        with self.state.lock:
            now = self.state.now()
            grace = now - timedelta(seconds=60)
            t = self.state.t
            t.commands = [c for c in t.commands if c.expires_at >= grace]
            t.replies = [r for r in t.replies if r.expires_at >= grace]
            expires = now + timedelta(seconds=ttl_seconds)
            t.commands.append(
                ControlRow(
                    t.take_id(),
                    command,
                    arguments,
                    destination,
                    pattern,
                    matcher,
                    ticket,
                    now,
                    expires,
                )
            )
            self.state.announced.append(CONTROL_WAKEUP)

    def commands_since(self, since: datetime) -> list[ControlCommand]:
        with self.state.lock:
            now = self.state.now()
            return [
                ControlCommand(
                    c.id,
                    c.command,
                    c.arguments,
                    c.destination,
                    c.pattern,
                    c.matcher,
                    c.ticket,
                    c.created_at,
                    c.expires_at,
                )
                for c in self.state.t.commands
                if c.created_at >= since and c.expires_at > now
            ]

    def reply(self, command: ControlCommand, hostname: str, reply: str) -> None:
        assert command.ticket is not None
        with self.state.lock:
            t = self.state.t
            t.replies.append(
                ReplyRow(t.take_id(), command.ticket, hostname, reply, command.expires_at)
            )

    def replies(self, ticket: str, after: int = 0) -> list[ControlReply]:
        with self.state.lock:
            return [
                ControlReply(r.id, r.hostname, r.reply)
                for r in self.state.t.replies
                if r.ticket == ticket and r.id > after
            ]

    def drop_replies(self, ticket: str) -> int:
        with self.state.lock:
            kept = [r for r in self.state.t.replies if r.ticket != ticket]
            dropped = len(self.state.t.replies) - len(kept)
            self.state.t.replies = kept
            return dropped
