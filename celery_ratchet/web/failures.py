"""A failure as a reader wants it: the exception's type and message from Celery's stored
record (not its JSON), and the traceback's frames, with the application's own set apart
from the libraries' (site-packages, the standard library)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from celery_ratchet.runtime.dlq import exception_parts

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+)(?:, in (?P<where>.*))?$')
#: Paths of code that is not the application's: a frame there is folded away.
_LIBRARY = re.compile(r"(site-packages|dist-packages|/lib/python\d|\\lib\\|<frozen )")


@dataclass(frozen=True)
class Exception_:
    kind: str
    message: str
    module: str | None


@dataclass
class Frame:
    file: str
    line: int
    where: str
    code: list[str] = field(default_factory=list)
    library: bool = False


@dataclass
class Traceback:
    """The frames of one traceback, and the lines that are no frame (its head, the
    exception line, "During handling of the above exception..." between chained ones)."""

    parts: list[Frame | str]

    @property
    def frames(self) -> list[Frame]:
        return [p for p in self.parts if isinstance(p, Frame)]


def exception_of(stored: str | None) -> Exception_ | None:
    """The exception of Celery's stored record (``{"exc_type": ..., "exc_message": [...]}``),
    read as the dead-letter listing reads it; anything else is its own message."""
    parts = exception_parts(stored)
    if parts is None:
        return None
    kind, message, module = parts
    return Exception_(kind, message, module if module and module != "builtins" else None)


def traceback_of(text: str | None) -> Traceback | None:
    """A Python traceback's frames; None for no text."""
    if not text:
        return None
    parts: list[Frame | str] = []
    for line in text.splitlines():
        found = _FRAME.match(line)
        if found:
            file = found["file"]
            parts.append(
                Frame(
                    file, int(found["line"]), found["where"] or "", [], bool(_LIBRARY.search(file))
                )
            )
        elif line.startswith("    ") and parts and isinstance(parts[-1], Frame):
            parts[-1].code.append(line.strip())
        elif line.strip():
            parts.append(line)
    return Traceback(parts)
