"""Passes over an image's functions that the scheduler runs after the verdicts, with no code of their own in it.

A pass says which keys a function needs (``keys``), computes a key's value once per worker (``compute``:
the same key in another function is not computed again), turns a function's keys and values into typed
rows (``rows``: instances of ``row``, a ``NamedTuple``), and makes its section of the image's summary from
every stored row (``summarize``).  The run (``engine.run``) sends each worker chunks of the functions the
store holds no rows of this pass for, writes what comes back (``Store.write_pass_rows``), and so resumes
where a killed run stopped.  A pass is named in ``RunOptions.passes``; it must pickle (a Dask worker is
sent it), so it is an instance of a module-level class.

What the built-in phases (survey, proofs, rows, replacements, jump probes) do is not yet written this way;
a new analysis of every function is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from ..image.functions import Function
from ..image.image import Image


class FunctionPass(ABC):
    """The interface of a pass (a subclass implements all four methods); ``name`` names its rows in the
    store and its section in the summary."""

    name: str = ""
    row: type[NamedTuple] = NamedTuple

    @abstractmethod
    def keys(self, image: Image, fn: Function, data: bytes) -> list:
        """The keys function ``fn`` (its bytes ``data``) needs, in order."""

    @abstractmethod
    def compute(self, key) -> object:
        """The value of one key (pure: a worker computes each key once)."""

    @abstractmethod
    def rows(self, fn: Function, found: Sequence[tuple[object, object]]) -> list[tuple]:
        """Function ``fn``'s rows from its (key, value) pairs, in ``keys``' order."""

    @abstractmethod
    def summarize(self, rows: Iterable[tuple]) -> dict:
        """The pass's section of the image's summary, from every row of the image's functions."""


class PassMemo:
    """A worker's values of each pass's keys, kept for the whole run (images included: a key is image-free)."""

    def __init__(self):
        self._values: dict[str, dict] = {}

    def function_rows(self, p: FunctionPass, image: Image, fn: Function, data: bytes) -> list[tuple]:
        """``p``'s rows of one function, each key computed at most once in this worker."""
        memo = self._values.setdefault(p.name, {})
        found = []
        for key in p.keys(image, fn, data):
            value = memo.get(key, memo)
            if value is memo:
                value = memo[key] = p.compute(key)
            found.append((key, value))
        return [tuple(r) for r in p.rows(fn, found)]


__all__ = ["FunctionPass", "PassMemo"]
