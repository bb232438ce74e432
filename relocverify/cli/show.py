"""``relocverify show``: one function annotated in the terminal, one line per instruction, as engineers read
``perf annotate`` or ``objdump -d --disassemble=FUNC``: its offset, bytes, disassembly, plan, verdict and
the whole reason (folded at word boundaries to the terminal's width, never cut).

    relocverify show /tmp/k.sqlite vfs_read              from a store a ``relocverify vmlinux`` run wrote
    relocverify show vmlinux tcp_v4_rcv+0x1c             from an image: the function is verified first
    relocverify show vmlinux show_cpuinfo@0xffffffff81045a10 --json

FUNCTION is a name, NAME@0xADDR when several static functions share the name, NAME+OFF (the instruction
there is marked with ``>``) or an address inside a function.  From a store the answer is the store's rows
(one indexed query per function); from a vmlinux or bzImage the function is decoded, planned and proved
instruction by instruction with its kernel sites and their variants (``engine.one_function``), the proof
cache asked first, the image's index cached on disk (``store.image_index``).  Exit 0, or 2 for an
unknown or ambiguous function or an unusable SOURCE.
"""

from __future__ import annotations

import bisect
import json
import os
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from ..errors import InputError, StoreError
from ..image.functions import Function
from ..image.locations import FunctionIndex, LocationSpec
from ..plan.plan import DEFAULT_TRAMP
from ..proof.verdict import Verdict
from .render import escape

EXIT_CLEAN = 0
SQLITE_MAGIC = b"SQLite format 3\x00"

#: ANSI colours by verdict (``--color``): proved green, opaque and unknown yellow, rejected dim, refuted red.
COLOURS = {"proved": "\x1b[32m", "opaque": "\x1b[33m", "unknown": "\x1b[33m", "rejected": "\x1b[2m",
           "refuted": "\x1b[1;31m"}
RESET = "\x1b[0m"
MIN_REASON = 40  # below this many columns left for the reason, it starts on the next line
HANG = 8  # the indent of a reason folded under a prefix too wide for it
MAX_TEXT = 40  # the widest the disassembly column grows; a longer instruction pushes its line right
MIN_TEXT = 24  # the narrowest it shrinks to, to leave the reason room on the instruction's line
BYTES_PER_LINE = 7  # as objdump -d: a longer instruction's bytes go on below


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


def add_parser(sub, types: dict) -> None:
    s = sub.add_parser("show", help="one function annotated: per instruction its bytes, disassembly, plan, "
                                    "verdict and reason (from a store, or verified now from an image)",
                       description="Print a function as `perf annotate` does, with relocverify's answer per "
                                   "instruction: offset, bytes, disassembly, plan kind, verdict and the whole "
                                   "reason. SOURCE is a result store (instant) or a vmlinux/bzImage (the "
                                   "function is verified first). Exit 0; 2 for an unknown or ambiguous "
                                   "function or an unusable SOURCE.")
    s.add_argument("source", metavar="SOURCE", type=types["IN_FILE"],
                   help="a store written by `relocverify vmlinux`, or a vmlinux ELF or bzImage")
    s.add_argument("function", metavar="FUNCTION", type=types["LOCATION"],
                   help="a function name, NAME@0xADDR (one of several static functions of that name), "
                        "NAME+0x1c (marks that instruction) or an address inside a function")
    s.add_argument("--system-map", default=None, metavar="FILE", type=types["IN_FILE"],
                   help="System.map or kallsyms for an image without function symbols (a bzImage)")
    s.add_argument("--json", action="store_true",
                   help="print the function and every instruction (address, offset, bytes, text, plan, rule, "
                        "verdict, method, reason, sites, variants) as JSON")
    s.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour verdicts: auto (when the output is a terminal and NO_COLOR is unset), "
                        "always or never")
    s.add_argument("--tramp", type=types["TRAMP"], default=DEFAULT_TRAMP, metavar="ADDR",
                   help=f"with an image: the trampoline address T the plans use (default {DEFAULT_TRAMP:#x}, "
                        f"as `relocverify vmlinux`); a store answers for its run's")
    s.add_argument("--timeout", type=types["SECONDS"], default=10.0, metavar="S",
                   help="with an image: solver timeout per proof in seconds (default 10)")
    s.add_argument("--no-cache", action="store_true",
                   help="with an image: neither read nor write the persistent proof cache")
    s.set_defaults(func=command)


def command(args, out: TextIO) -> int:
    spec: LocationSpec = args.function
    if _is_sqlite(args.source):
        if args.system_map:
            raise InputError(f"--system-map is for an image; {args.source} is a store")
        shown = from_store(args.source, spec)
    else:
        shown = from_image(args.source, args.system_map, spec, args.tramp, args.timeout, not args.no_cache)
    if args.json:
        json.dump(as_json(shown), out, indent=2, ensure_ascii=True)
        out.write("\n")
        return EXIT_CLEAN
    out.write(render(shown, _width(), _colour(args.color, out)))
    return EXIT_CLEAN


def _is_sqlite(path: str) -> bool:
    from ..inputs import open_input

    with open_input(path, "file") as fh:
        return fh.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC


def _width() -> int:
    import shutil

    return max(shutil.get_terminal_size().columns, 40)


def _colour(choice: str, out: TextIO) -> bool:
    if choice != "auto":
        return choice == "always"
    isatty = getattr(out, "isatty", None)
    return bool(isatty and isatty()) and not os.environ.get("NO_COLOR")


# ---------------------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------------------

def from_store(path: str, spec: LocationSpec) -> Shown:
    """The function ``spec`` names, as the store at ``path`` holds it (every image in the store is searched)."""
    from ..engine.one_function import FunctionRow
    from ..store.store import Store

    try:
        store = Store(path, readonly=True)
    except StoreError as exc:
        raise InputError(str(exc)) from None
    try:
        images = _images(store, path)
        records, starts = _candidates(store, images, spec)
        function = _resolve(spec, records, lambda: _all_functions(store, images))
        image, record = records[(function.start, function.name, function.end)]
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
        return Shown("store", path, function, tuple(rows), texts, _store_tramp(store, image), mark)
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


def _resolve(spec: LocationSpec, records: dict, everything: Callable[[], list[Function]]) -> Function:
    """The one function ``spec`` names among the candidates; InputError (with the candidates, or the names
    close to it) otherwise."""
    index = FunctionIndex(Function(r.name, r.start, end, r.section) for (_, _, end), (_, r) in records.items())
    if not spec.symbolic:
        found = index.containing(spec.absolute)
        if found is None:
            raise InputError(f"no function holds {spec.absolute:#x}: give a function name, or an address inside "
                             f"a function's code")
        return found
    if not records:
        FunctionIndex(everything()).named(spec.name, spec.at)  # raises, with the names close to it
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
    return Shown("image", path, function, tuple(rows), texts, tramp, mark, seconds)


def disassemble(raw: bytes, address: int, name: Callable[[int], tuple[str, int] | None]) -> str:
    """The instruction as text (AT&T, capstone cross-checked by iced-x86: ``x86.decode``), a branch or call
    target named ``<function+0xoff>`` as objdump does."""
    from ..x86.decode import decode
    from ..x86.instruction import Disagreement, Instruction

    d = decode(raw, address)
    if isinstance(d, Disagreement):
        return "(the decoders disagree)"
    if not isinstance(d, Instruction):
        return "(undecodable)"
    text = d.text
    if d.branch_target is not None:
        hit = name(d.branch_target)
        if hit is not None:
            fname, start = hit
            text += f" <{fname}+{d.branch_target - start:#x}>" if d.branch_target != start else f" <{fname}>"
    return text


# ---------------------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------------------

def counts(shown: Shown) -> dict[str, int]:
    """Instructions per verdict, in verdict order (strongest first), the verdicts present only."""
    tally: dict[str, int] = {}
    for r in shown.rows:
        tally[r.row.verdict] = tally.get(r.row.verdict, 0) + 1
    return {v.value: tally[v.value] for v in Verdict if v.value in tally}


def reason_text(r) -> str:
    """The row's whole reason, its kernel sites, its live variants and the replay line of a refutation:
    everything the table says about it past the verdict (``--json`` also gives the method and rule)."""
    row = r.row
    text = row.reason
    if row.sites:
        text += f"; sites: {', '.join(row.sites)}"
    if r.variants:
        text += "; variants: " + ", ".join(f"{name} {verdict}" for name, verdict, _ in sorted(r.variants))
    if r.counterexample and r.counterexample.get("replay"):
        text += f"; replay: {r.counterexample['replay']}"
    return escape(text)


def render(shown: Shown, width: int, colour: bool) -> str:
    f = shown.function
    lines = [(f"{escape(f.name)}: {f.start:#x}..{f.end:#x} ({f.size} bytes, {len(shown.rows)} instructions) "
              f"in {escape(f.section)}")]
    where = "the store" if shown.source == "store" else "verified now from the image"
    took = f" in {shown.seconds:.2f} s" if shown.seconds is not None else ""
    tramp = f"; trampoline {shown.tramp:#x}" if shown.tramp is not None else ""
    lines.append(f"  {where} {escape(shown.path)}{took}{tramp}")
    lines.append("  " + ", ".join(f"{v} {n}" for v, n in counts(shown).items()))
    offsets = [f"+{r.row.address - f.start:#x}" for r in shown.rows]
    ow = max(len("offset"), *(len(o) for o in offsets))
    bw = max(len("bytes"), *(3 * min(r.row.length, BYTES_PER_LINE) - 1 for r in shown.rows))
    texts = [escape(t) for t in shown.texts]
    # the disassembly column as wide as its texts, up to MAX_TEXT; narrower (down to MIN_TEXT) on a terminal
    # that would otherwise leave the reason less than MIN_REASON columns; on a narrower one the reasons go on
    # the lines below, and the column shrinks to keep the other columns within the width (a longer text
    # pushes its own line right)
    fixed = 2 + ow + 2 + bw + 2 + 2 + 7 + 2 + 8 + 2
    tw = min(max(len(t) for t in texts), MAX_TEXT)
    room = width - MIN_REASON - fixed if width - MIN_REASON - fixed >= MIN_TEXT else width - fixed + 2
    tw = max(min(tw, room), len("instruction"))
    lines.append(f"  {'offset':<{ow}}  {'bytes':<{bw}}  {'instruction':<{tw}}  {'plan':<7}  {'verdict':<8}  reason")
    for r, off, text in zip(shown.rows, offsets, texts):
        row = r.row
        marker = "> " if shown.mark is not None and row.address == shown.mark else "  "
        chunks = [row.raw[i:i + BYTES_PER_LINE].hex(" ") for i in range(0, row.length, BYTES_PER_LINE)] or [""]
        head = f"{marker}{off:<{ow}}  {chunks[0]:<{bw}}  {text:<{tw}}  {row.plan_kind:<7}  "
        more = [f"{'':<{2 + ow}}  {c}" for c in chunks[1:]]  # objdump's way: the bytes go on below
        entry = fold(head + f"{row.verdict:<8}  ", reason_text(r), width, more)
        if colour and row.verdict in COLOURS:
            first, at = entry[0], len(head)
            entry[0] = first[:at] + COLOURS[row.verdict] + row.verdict + RESET + first[at + len(row.verdict):]
        lines.extend(entry)
    return "\n".join(lines) + "\n"


def fold(prefix: str, reason: str, width: int, below: list[str] = ()) -> list[str]:
    """``prefix`` then ``reason`` folded at word boundaries to ``width`` columns, the continuation lines
    indented under the reason (or by ``HANG`` on lines of their own when the prefix leaves it less than
    ``MIN_REASON`` columns), with the lines ``below`` (the rest of a long instruction's bytes) on the left
    of the continuation lines: never cut mid-word, never truncated (a word longer than a line gets a line of
    its own)."""
    options = {"break_long_words": False, "break_on_hyphens": False}
    room = width - len(prefix)
    if room >= MIN_REASON:
        folded = textwrap.wrap(reason, width=room, **options) or [""]
        lines = [prefix + folded[0]]
        for i in range(1, max(len(folded), len(below) + 1)):
            left = below[i - 1] if i - 1 < len(below) else ""
            right = folded[i] if i < len(folded) else ""
            lines.append(f"{left:<{len(prefix)}}{right}" if right else left)
        return [line.rstrip() for line in lines]
    folded = textwrap.wrap(reason, width=width, initial_indent=" " * HANG, subsequent_indent=" " * HANG, **options)
    return [line.rstrip() for line in [prefix, *below, *folded]]


def as_json(shown: Shown) -> dict:
    f = shown.function
    return {
        "source": {"kind": shown.source, "path": shown.path, "trampoline": None if shown.tramp is None
                   else hex(shown.tramp), "seconds": None if shown.seconds is None else round(shown.seconds, 3)},
        "function": {"name": f.name, "start": hex(f.start), "end": hex(f.end), "size": f.size, "section": f.section,
                     "instructions": len(shown.rows), "verdicts": counts(shown),
                     "marked": None if shown.mark is None else hex(shown.mark)},
        "instructions": [instruction_json(r, f, text) for r, text in zip(shown.rows, shown.texts)],
    }


def instruction_json(r, f: Function, text: str) -> dict:
    row = r.row
    return {"address": hex(row.address), "offset": row.address - f.start, "bytes": row.raw.hex(), "text": text,
            "plan": row.plan_kind, "rule": row.rule, "class": row.klass, "verdict": row.verdict,
            "method": row.method, "reason": row.reason, "sites": list(row.sites),
            "variants": [{"name": n, "verdict": v, "reason": why} for n, v, why in sorted(r.variants)],
            "counterexample": r.counterexample}
