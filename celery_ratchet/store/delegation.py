"""The job store's facade hands each operation to the part that owns it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Concatenate, Generic, ParamSpec, TypeVar, overload

P = ParamSpec("P")
R = TypeVar("R")
Part = TypeVar("Part")


class delegated(Generic[Part, P, R]):
    """A method of the facade that is ``method`` of its part in attribute ``part``, with
    its signature (mypy checks the facade's calls and its ports against the part's)."""

    def __init__(self, part: str, method: Callable[Concatenate[Part, P], R]) -> None:
        self.part = part
        self.name = method.__name__
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, store: None, owner: type | None = None) -> delegated[Part, P, R]: ...
    @overload
    def __get__(self, store: object, owner: type | None = None) -> Callable[P, R]: ...
    def __get__(
        self, store: object, owner: type | None = None
    ) -> delegated[Part, P, R] | Callable[P, R]:
        if store is None:  # looked up on the class (documentation, introspection)
            return self
        found: Callable[P, R] = getattr(getattr(store, self.part), self.name)
        return found
