"""One function annotated, ready to print (``relocverify show``): a ``Shown``, from a result store or verified
now from a kernel image.

FUNCTION is a name, NAME@0xADDR when several static functions share the name, NAME+OFF (the instruction
there is marked) or an address inside a function.  From a store the answer is the store's rows (one indexed
query per function; every image of the store is searched, a package store's modules too); from a vmlinux or
bzImage the function is decoded, planned and proved instruction by instruction with its kernel sites and
their variants (``engine.one_function``), the proof cache asked first, the image's index cached on disk
(``store.image_index``).  An unknown or ambiguous function, an offset inside an instruction or an unusable
source is an InputError naming what to give instead.  Nothing here writes: the command line renders.
"""

from __future__ import annotations

import bisect
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import InputError, StoreError
from ..image.functions import Function
from ..image.locations import FunctionIndex, LocationSpec
from ..inputs import open_input
from ..x86.instruction import Disagreement, Instruction

SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass(frozen=True)
class Shown:
    """A function and its rows, ready to print: where they came from, each instruction's disassembly (branch
    targets named), the trampoline the verdicts are for, and the address FUNCTION pointed into (if any)."""

    source: str  # "store" or "image"
    path: str
    function: Function
    rows: tuple  # engine.one_function.FunctionRow
    texts: tuple[str, ...]
    tramp: int | None
    mark: int | None
    seconds: float | None = None  # the verification's wall time (from an image)
    notes: tuple[str, ...] = ()  # what the loader adjusted in the image (a symbol cut at its section's end)


def from_source(path: str, spec: LocationSpec, system_map: str | None, tramp: int, timeout: float,
                use_cache: bool) -> Shown:
    """The function ``spec`` names in ``path``: a result store (``from_store``; ``system_map`` must be None)
    or a kernel image (``from_image``, with the trampoline, solver timeout and proof cache given)."""
    if is_store(path):
        if system_map:
            raise InputError(f"--system-map is for an image; {path} is a store")
        return from_store(path, spec)
    return from_image(path, system_map, spec, tramp, timeout, use_cache)


def is_store(path: str) -> bool:
    """Whether the file at ``path`` is an SQLite database (a result store), by its first bytes."""
    with open_input(path, "file") as fh:
        return fh.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC


def from_store(path: str, spec: LocationSpec) -> Shown:
    """The function ``spec`` names, as the store at ``path`` holds it (every image in the store is searched)."""
    from ..engine.one_function import FunctionRow
    from ..store.store import Results

    try:
        store = Results(path)
    except StoreError as exc:
        raise InputError(str(exc)) from None
    try:
        images = _images(store, path)
        records, starts = _candidates(store, images, spec)
        function = _resolve(spec, records, lambda: _all_functions(store, images), "the store")
        image, record = records[(function.start, function.name, function.end)]
        store.check_seals(function=record.id)  # a verdict altered after relocverify wrote it is never shown
        rows = []
        for r in store.function_rows(record.id):
            variants = tuple(store.variants_at(record.id, r.address - record.start)) if r.sites else ()
            cex = store.counterexample(r.counterexample) if r.counterexample is not None else None
            rows.append(FunctionRow(r, variants, cex))
        if not rows:
            store.check_integrity()  # a damaged page reads as no rows: say which it is
            raise InputError(f"{function.name}: the store has no rows for it yet (its run stopped before "
                             f"it): rerun `relocverify vmlinux --db {path}` to finish")
        mark = _mark(spec, function, [r.row.address for r in rows])
        name = _store_names(starts)
        texts = tuple(disassemble(r.row.raw, r.row.address, name) for r in rows)
        return Shown("store", path, function, tuple(rows), texts, _store_tramp(store, image), mark,
                     notes=tuple(map(str, store.image_info(image).get("notes") or ())))
    finally:
        store.close()


def _images(store, path: str) -> list[int]:
    """The store's images, newest first (a package store holds a vmlinux and its modules)."""
    ids = {r["image"] for r in store.runs()}
    newest = store.find_image()
    if newest is not None:
        ids.add(newest)
    if not ids:
        raise InputError(f"{path}: the store holds no image yet; run `relocverify vmlinux --db {path}` first")
    return sorted(ids, reverse=True)


def _candidates(store, images: list[int], spec: LocationSpec):
    """(the functions ``spec`` may name, keyed (start, name, end) -> (image, record); every function's
    (start, end, name) in address order, to name branch targets) in one pass over the function table."""
    records: dict = {}
    starts: list[tuple[int, int, str]] = []
    for image in images:
        for r in store.iter_functions(image):
            starts.append((r.start, r.start + r.size, r.name))
            if spec.symbolic:
                hit = r.name == spec.name
            else:
                hit = r.start <= spec.absolute < r.start + r.size
            if hit:
                records.setdefault((r.start, r.name, r.start + r.size), (image, r))
    starts.sort()
    return records, starts


def _all_functions(store, images: list[int]) -> list[Function]:
    return [Function(r.name, r.start, r.start + r.size, r.section) for image in images
            for r in store.iter_functions(image)]


def _resolve(spec: LocationSpec, records: dict, everything: Callable[[], list[Function]],
             where: str = "the image") -> Function:
    """The one function ``spec`` names among the candidates (from ``where``: "the store", "the image");
    InputError (with the candidates, or the names close to it) otherwise."""
    index = FunctionIndex((Function(r.name, r.start, end, r.section) for (_, _, end), (_, r) in records.items()),
                          where)
    if not spec.symbolic:
        found = index.containing(spec.absolute)
        if found is None:
            raise InputError(f"no function holds {spec.absolute:#x}: give a function name, or an address inside "
                             f"a function's code")
        return found
    if not records:
        FunctionIndex(everything(), where).named(spec.name, spec.at)  # raises, with the names close to it
    function = index.named(spec.name, spec.at)
    if spec.offset >= function.size:
        raise InputError(f"{spec.text}: offset {spec.offset:#x} is past the end of {function.name} "
                         f"({function.size:#x} bytes at {function.start:#x})")
    return function


def _mark(spec: LocationSpec, function: Function, addresses: list[int]) -> int | None:
    """The instruction ``spec`` points at inside the function (None: the function as a whole).  An offset
    that is not an instruction boundary is an InputError naming the nearest ones; an absolute address
    inside an instruction marks that instruction."""
    target = function.start + spec.offset if spec.symbolic else spec.absolute
    if target == function.start:
        return None
    i = bisect.bisect_right(addresses, target) - 1
    if spec.symbolic and (i < 0 or addresses[i] != target):
        near = " and ".join(f"{function.name}+{a - function.start:#x}" for a in addresses[max(i, 0):i + 2])
        raise InputError(f"{spec.text}: {function.name}+{spec.offset:#x} is inside an instruction, not at its "
                         f"start; the nearest instruction boundaries are {near}")
    return addresses[i] if i >= 0 else None


def _store_names(starts: list[tuple[int, int, str]]) -> Callable[[int], tuple[str, int] | None]:
    keys = [s[0] for s in starts]

    def name(address: int):
        i = bisect.bisect_right(keys, address) - 1
        if i >= 0 and starts[i][0] <= address < starts[i][1]:
            return starts[i][2], starts[i][0]
        return None
    return name


def _store_tramp(store, image: int) -> int | None:
    """The trampoline of the image's newest run that says one."""
    for run in reversed(store.runs(image)):
        try:
            return int(json.loads(run["config"] or "{}")["tramp"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def from_image(path: str, system_map: str | None, spec: LocationSpec, tramp: int, timeout: float,
               use_cache: bool) -> Shown:
    """The function ``spec`` names in the kernel image at ``path``, verified now."""
    from ..engine.one_function import verify_function
    from ..engine.pipeline import Prover
    from ..environment import default_proof_cache_dir
    from ..proof.cache_key import cache_tag
    from ..store.cache import ProofCache
    from ..store.image_index import indexed

    index = indexed(path, system_map)
    if spec.symbolic:
        function = index.locate(spec).function
    else:
        function = index.functions.containing(spec.absolute)
        if function is None:
            raise InputError(f"no function of {path} holds {spec.absolute:#x}: give a function name, or an "
                             f"address inside a function's code")
    cache = ProofCache(default_proof_cache_dir() if use_cache else None)
    try:
        tag = cache_tag()
        prover = Prover(tramp, timeout, (lambda: cache.lookup(tag)) if cache.enabled else None)
        t0 = time.monotonic()
        rows = verify_function(index.image, function, tramp, timeout, index.sites, prover)
        seconds = time.monotonic() - t0
        if prover.new_proofs:
            cache.add(tag, {}, prover.new_proofs)
    finally:
        cache.close()
    if not rows:
        raise InputError(f"{function.name}: no code for it in an executable section of {path}")
    mark = _mark(spec, function, [r.row.address for r in rows])

    def name(address: int):
        f = index.functions.containing(address)
        return None if f is None else (f.name, f.start)
    texts = tuple(disassemble(r.row.raw, r.row.address, name) for r in rows)
    return Shown("image", path, function, tuple(rows), texts, tramp, mark, seconds, index.image.notes)


def disassemble(raw: bytes, address: int, name: Callable[[int], tuple[str, int] | None]) -> str:
    """The instruction as text (AT&T, capstone cross-checked by iced-x86: ``x86.decode``), immediates in hex
    and a branch or call target named ``<function+0xoff>`` as objdump does."""
    from ..x86.att import objdump_immediates
    from ..x86.decode import decode

    d = decode(raw, address)
    if isinstance(d, Disagreement):
        return "(the decoders disagree)"
    if not isinstance(d, Instruction):
        return "(undecodable)"
    text = objdump_immediates(d.text)
    if d.branch_target is not None:
        hit = name(d.branch_target)
        if hit is not None:
            fname, start = hit
            text += f" <{fname}+{d.branch_target - start:#x}>" if d.branch_target != start else f" <{fname}>"
    return text
