"""Passes over an image's functions that the scheduler runs after the verdicts, with no code of their own in it.

Two kinds.  A ``FunctionPass`` analyses each function's bytes into typed rows of its own, kept in the store;
a ``StoredPass`` reads each function's stored rows (the verdicts) and gives a value per chunk of functions,
which it merges in the parent, in function order, into its section of the summary.

A ``FunctionPass`` says which keys a function needs (``keys``), computes a key's value once per worker (``compute``:
the same key in another function is not computed again), turns a function's keys and values into typed
rows (``rows``: instances of ``row``, a ``NamedTuple``), and makes its section of the image's summary from
every stored row (``summarize``).  The run (``engine.run``) sends each worker chunks of the functions the
store holds no rows of this pass for, writes what comes back (``Store.write_pass_rows``), and so resumes
where a killed run stopped.  A pass is named in ``RunOptions.passes``; it must pickle (a Dask worker is
sent it), so it is an instance of a module-level class.

A ``StoredPass`` (named in ``RunOptions.stored_passes``) reads, in a worker, the functions at a range of
positions of the image's stored rows in function order (``StoredReader``: ``Results.function_verdicts``, read
on from one range to the next), each as a ``StoredFunction``; keeps what it learns from chunk to chunk and
image to image in a state of its own (``start``: once per worker); and makes one value per chunk
(``chunk``).  In the parent, a ``StoredMerge`` per image (``merger``) takes the chunks' values in function
order, whatever order they come back in, and makes the pass's section (``section``).  The phase that runs
it is ``engine.phases.stored_rows``; a chunk a worker died in goes again whole, so the merged values are
those of a run where nothing died.  Its section is the reading of this run's request, not a part of the
run's record (``engine.run``).

What the built-in phases (survey, proofs, rows, replacements, jump probes) do is not yet written this way;
a new analysis of every function is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from ..image.functions import Function
from ..image.image import Image
from ..store.store import Results


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


class StoredFunction(NamedTuple):
    """One function as the store holds it (``Results.function_verdicts``): its id, start, name and bytes, and its
    rows ``(offset, length, verdict, site mask or None)`` by offset."""

    fid: int
    start: int
    name: str
    data: bytes
    rows: list


class StoredMerge(ABC):
    """A stored pass's parent side for one image: the chunks' values in function order, then its section."""

    @abstractmethod
    def add(self, value) -> None:
        """The next chunk's value (chunks in function order)."""

    @abstractmethod
    def section(self) -> dict:
        """The pass's section of the image's summary, once every chunk is added."""


class StoredPass(ABC):
    """The interface of a pass over stored rows; ``name`` names its section (``summary["stored_passes"]``).  It
    must pickle (a worker that lives on from image to image is sent it again), and runs only on workers that
    can read the run's store (a local pool: ``engine.phases.stored_rows``)."""

    name: str = ""

    @abstractmethod
    def start(self) -> object:
        """In a worker, the first time it runs this pass: the state it keeps from chunk to chunk and image to image."""

    @abstractmethod
    def chunk(self, state, image: Image, functions: Iterable[StoredFunction]) -> object:
        """In a worker: the value of consecutive functions (in function order) of ``image``."""

    @abstractmethod
    def merger(self, image: Image, image_id: int) -> StoredMerge:
        """In the parent, once per image: what merges the chunks' values into the pass's section."""


class StoredReader:
    """A worker's reading of one image's stored rows (``Results.function_verdicts``, in function order): the
    functions at positions ``lo`` to ``hi``, read on from where the last range ended; a range behind that, or of
    another image or store, reads the image anew.  The store stays open until ``close``."""

    def __init__(self):
        self._results: Results | None = None
        self._key: tuple[str, int] | None = None
        self._rows = None
        self._at = 0  # the position of the next function ``_rows`` yields

    def functions(self, path: str, image_id: int, lo: int, hi: int) -> list[StoredFunction]:
        if hi <= lo:
            return []
        if self._key != (path, image_id) or lo < self._at:
            self.close()
            self._results = Results(path)
            self._key, self._rows, self._at = (path, image_id), self._results.function_verdicts(image_id), 0
        out = []
        for found in self._rows:
            if self._at >= lo:
                out.append(StoredFunction(*found))
            self._at += 1
            if self._at >= hi:
                break
        return out

    def close(self) -> None:
        results, self._results, self._key, self._rows = self._results, None, None, None
        if results is not None:
            results.close()


__all__ = ["FunctionPass", "PassMemo", "StoredFunction", "StoredMerge", "StoredPass", "StoredReader"]
