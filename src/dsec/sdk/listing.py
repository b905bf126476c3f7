"""What a list call returns on a cluster: the items, and the nodes that did not answer."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

__all__ = ["Listing"]

T = TypeVar("T")


class Listing(list[T]):
    """A list of what the nodes that answered hold; ``unreachable`` names the nodes that
    did not (what they hold is not in it). Empty on one machine."""

    def __init__(self, items: Iterable[T] = (), unreachable: Iterable[str] = ()) -> None:
        super().__init__(items)
        self.unreachable = list(unreachable)
