"""``relocverify export``: the probe points a store's verdicts make safe, in a tracer's own syntax.

    relocverify export STORE --format bpftrace [--functions 'vfs_*'] [--verdict proved] [-o probes.bt]

One probe per instruction whose verdict is one of ``--verdict`` (default: ``proved`` only), in every
function whose name matches ``--functions`` (an fnmatch glob, case-sensitive), in the store's kernel
images (a vmlinux, and the modules of a package store):

  bpftrace  a program: ``kprobe:vfs_read+5 { @[probe] = count(); }`` per line (decimal offsets)
  perf      a shell script: ``perf probe -a 'relocverify:vfs_read_5=vfs_read+5'`` per line (``-m MODULE``
            for a module's function); each probe is named, so one function can carry any number of them
  dtrace    a D program for FreeBSD's kinst provider: ``kinst::vfs_read:5 { ... }`` (decimal offsets)
  json      every matching instruction: function, offset, address, verdict, reason, section, module, and
            its image (an index into the document's ``images``)

``docs/export.md`` says where each syntax comes from.  A tracer names a probe point FUNCTION+OFFSET, so
the three tool formats leave out (and say, in a comment at the top, how many and why) the functions
that syntax cannot address or that would land elsewhere: a name several functions share (static
functions: the kernel resolves a name to one of them, perf and kinst to all), a name with characters
the probe syntax cannot take, code freed after boot (``.init.text``, ``.exit.text``: the kernel refuses
probes there, and one probe that fails to attach stops a bpftrace script), user-space images, and for
bpftrace the functions of modules.  JSON leaves nothing out and says these per probe.

A verdict holds for the kernel build the store verified (its sha256 is in the header) and the
trampoline its run planned for; probing another build with these offsets is unchecked.  Exit 0, or 2
for an unusable store or a glob that matches no function.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import TextIO

from ..errors import InputError, StoreError
from .render import escape

EXIT_CLEAN = 0
FORMATS = ("bpftrace", "perf", "dtrace", "json")

#: The names FUNC+OFF can address in all three tools' probe syntax: a C identifier, plus the '.' of
#: compiler clones (foo.isra.0, foo.cold): bpftrace since 0.10 (bpftrace PR #1111), perf-probe (its
#: special characters are = @ + : ;) and DTrace probe descriptions all take it.
ADDRESSABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
#: Sections the kernel frees after boot (a module's after its init): no probe can be placed there.
FREED = (".init.text", ".exit.text")
PERF_GROUP = "relocverify"
EVENT_MAX = 63  # perf and the kernel's trace events: at most 64 bytes with the terminating NUL
BPFTRACE_BODY = "{ @[probe] = count(); }"
DTRACE_BODY = "{ @[probefunc, probename] = count(); }"


@dataclass(frozen=True)
class Image:
    """One image of the store: its id, kind (``kernel``, ``module`` or ``user``), module name, path, sha256,
    and the trampoline its newest run planned for."""

    id: int
    kind: str
    module: str | None
    path: str
    sha256: str
    tramp: int | None


@dataclass(frozen=True, slots=True)  # millions of them for a whole kernel
class ProbePoint:
    """An instruction a probe may be placed on: its function, offset, address, verdict and reason, where it
    lies, and whether its function's name is the only one of its kind in the store's kernel images."""

    image: Image
    function: str
    offset: int
    address: int
    verdict: str
    reason: str
    section: str
    unique: bool


@dataclass(frozen=True)
class Export:
    """What the store gives for the options: its images, the matching probe points in address order per
    image, and how many functions matched."""

    store: str
    verdicts: tuple[str, ...]
    glob: str | None
    images: tuple[Image, ...]
    points: tuple[ProbePoint, ...]
    functions: int


def _verdicts(text: str) -> tuple[str, ...]:
    """An argparse type: VERDICT[,VERDICT...] from the Verdict enum, in verdict order."""
    from ..proof.verdict import Verdict

    names = {t.strip() for t in text.split(",") if t.strip()}
    known = [v.value for v in Verdict]
    bad = sorted(names - set(known))
    if not names or bad:
        raise argparse.ArgumentTypeError(f"--verdict takes verdicts from {', '.join(known)}, comma-separated; "
                                         f"not {text!r}")
    return tuple(v for v in known if v in names)


def add_parser(sub, types: dict) -> None:
    e = sub.add_parser("export", help="write the probe points a store's verdicts make safe, for bpftrace, perf "
                                      "probe, DTrace (kinst) or as JSON",
                       description="One probe per instruction whose verdict is one of --verdict (default: "
                                   "proved), in the functions matching --functions, in each tool's own syntax. "
                                   "Functions a tool cannot address by FUNCTION+OFFSET (a name several functions "
                                   "share, code freed after boot, ...) are left out with a comment saying how "
                                   "many and why. Exit 0; 2 for an unusable store or a glob matching nothing.")
    e.add_argument("store", metavar="STORE", type=types["IN_FILE"],
                   help="a store written by `relocverify vmlinux` (or `package`)")
    e.add_argument("--format", required=True, choices=FORMATS, help="the syntax to write")
    e.add_argument("--functions", default=None, metavar="GLOB",
                   help="only functions whose name matches GLOB (fnmatch, case-sensitive: 'vfs_*', 'tcp_v4_?cv')")
    e.add_argument("--verdict", type=_verdicts, default=("proved",), metavar="VERDICT[,VERDICT...]",
                   help="the verdicts that make a probe point (default: proved; anything weaker is not a proof "
                        "that the relocated instruction behaves as the original)")
    e.add_argument("-o", "--output", default=None, metavar="FILE", type=types["OUT_FILE"],
                   help="write FILE (atomically) instead of the standard output")
    e.set_defaults(func=command)


def command(args, out: TextIO) -> int:
    from ..outputs import write_atomic

    found = collect(args.store, args.functions, args.verdict)
    text = RENDERERS[args.format](found)
    if args.output:
        write_atomic(args.output, text)
    else:
        out.write(text)
    return EXIT_CLEAN


# ---------------------------------------------------------------------------------------------------------
# What the store holds
# ---------------------------------------------------------------------------------------------------------

#: Above this many matching functions, one pass over the image's rows beats a query per function.
PER_FUNCTION_LIMIT = 2000


def collect(path: str, glob: str | None, verdicts: tuple[str, ...]) -> Export:
    """The probe points of the store at ``path``: see the module doc."""
    from ..store.store import Store

    try:
        store = Store(path, readonly=True)
    except StoreError as exc:
        raise InputError(str(exc)) from None
    try:
        store.check_integrity()  # every point comes from a row: never export from a damaged store
        images = _images(store, path)
        functions = {image.id: list(store.iter_functions(image.id)) for image in images}
        names: dict[str, int] = {}
        for image in images:
            if image.kind != "user":
                for r in functions[image.id]:
                    names[r.name] = names.get(r.name, 0) + 1
        wanted = set(verdicts)
        reasons: dict[str, str] = {}  # one string per distinct reason: a kernel has millions of rows, few reasons
        points: list[ProbePoint] = []
        matched = 0
        for image in images:
            chosen = {(r.start, r.name): r for r in functions[image.id]
                      if glob is None or fnmatch.fnmatchcase(r.name, glob)}
            matched += len(chosen)
            for row in _rows(store, image, chosen):
                if row.verdict in wanted:
                    r = chosen[(row.function_start, row.function)]
                    points.append(ProbePoint(image, r.name, row.address - r.start, row.address, row.verdict,
                                             reasons.setdefault(row.reason, row.reason), r.section,
                                             names.get(r.name, 0) == 1))
    finally:
        store.close()
    if glob is not None and not matched:
        raise InputError(f"--functions {glob!r} matches no function of {path} (the glob is case-sensitive, "
                         f"fnmatch: 'vfs_*', 'tcp_v4_?cv')")
    return Export(path, verdicts, glob, tuple(images), tuple(points), matched)


def _rows(store, image: Image, chosen: dict):
    """The rows of the chosen functions (a query each, or one pass over the image when they are many)."""
    if len(chosen) > PER_FUNCTION_LIMIT:
        return (row for row in store.iter_rows(image.id) if (row.function_start, row.function) in chosen)
    return (row for r in sorted(chosen.values(), key=lambda r: (r.start, r.name)) for row in store.function_rows(r.id))


def _images(store, path: str) -> list[Image]:
    """The store's images: the kernel first, then modules by name, then user-space images."""
    runs: dict[int, list[dict]] = {}
    for run in store.runs():
        runs.setdefault(run["image"], []).append(run)
    newest = store.find_image()
    ids = set(runs) | ({newest} if newest is not None else set())
    if not ids:
        raise InputError(f"{path}: the store holds no image yet; run `relocverify vmlinux --db {path}` first")
    images = []
    for i in ids:
        info = store.image_info(i)
        config = _config(runs.get(i, []))
        if config.get("policy") == "user":
            kind, module = "user", None
        elif info.get("format") == "module":
            kind, module = "module", module_name(info.get("path") or "")
        else:
            kind, module = "kernel", None
        tramp = config.get("tramp")
        images.append(Image(i, kind, module, info.get("path") or "", info.get("sha256") or "",
                            tramp if isinstance(tramp, int) else None))
    order = {"kernel": 0, "module": 1, "user": 2}
    return sorted(images, key=lambda m: (order[m.kind], m.module or "", m.path, m.id))


def _config(runs: list[dict]) -> dict:
    """The configuration of the image's newest run that has one."""
    for run in reversed(runs):
        try:
            return dict(json.loads(run["config"] or "{}"))
        except (ValueError, TypeError):
            continue
    return {}


def module_name(path: str) -> str:
    """The name the kernel knows a module by: its file name without .ko (and .xz, .zst, .gz), '-' as '_'."""
    name = os.path.basename(path)
    for suffix in (".xz", ".zst", ".gz"):
        name = name.removesuffix(suffix)
    return name.removesuffix(".ko").replace("-", "_")


# ---------------------------------------------------------------------------------------------------------
# Which probe points a tool can take
# ---------------------------------------------------------------------------------------------------------

#: (key, why), in the order they are checked: the first that applies is the one counted.
LEFT_OUT = (
    ("user", "in user-space images (uprobes, not kprobes)"),
    ("module", "of kernel modules (bpftrace checks a kprobe's offset in vmlinux, which lacks them)"),
    ("freed", "in .init.text or .exit.text (freed after boot: the kernel refuses probes there)"),
    ("name", "whose names the probe syntax cannot take (only [A-Za-z_][A-Za-z0-9_.]*)"),
    ("shared", "whose names several functions share (static functions: FUNC+OFF cannot tell them apart)"),
)


def _why_not(p: ProbePoint, tool: str) -> str | None:
    if p.image.kind == "user":
        return "user"
    if tool == "bpftrace" and p.image.kind == "module":
        return "module"
    if p.section.startswith(FREED):
        return "freed"
    if not ADDRESSABLE.fullmatch(p.function):
        return "name"
    if not p.unique:
        return "shared"
    return None


def usable(found: Export, tool: str) -> tuple[list[ProbePoint], dict[str, tuple[set, set, int]]]:
    """(the probe points ``tool`` can take, {reason: (function names, functions, probe points) left out})."""
    kept, left = [], {}
    for p in found.points:
        why = _why_not(p, tool)
        if why is None:
            kept.append(p)
        else:
            names, functions, n = left.get(why, (set(), set(), 0))
            names.add(p.function)
            functions.add((p.image.id, p.address - p.offset))
            left[why] = (names, functions, n + 1)
    return kept, left


def header(found: Export, kept: list[ProbePoint], left: dict, tool: str) -> list[str]:
    """The comment lines at the top of a tool's file (without the comment marker; escaped)."""
    fns = len({(p.image.id, p.function, p.address - p.offset) for p in kept})
    what = f"functions {found.glob!r}" if found.glob is not None else "every function"
    lines = [(f"relocverify export --format {tool}: {_n(len(kept), 'probe point')} in {_n(fns, 'function')} "
              f"(verdicts {', '.join(found.verdicts)}; {what}: {found.functions:,} matched)"),
             f"from the store {found.store}"]
    for image in found.images:
        if image.kind == "user":
            continue
        tramp = f", trampoline {image.tramp:#x}" if image.tramp is not None else ""
        label = f"module {image.module}" if image.module else "kernel"
        lines.append(f"{label}: {image.path} (sha256 {image.sha256}{tramp}): the offsets hold for this build only")
    for key, why in LEFT_OUT:
        if key in left:
            names, functions, n = left[key]
            sample = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
            lines.append(f"left out: {_n(len(functions), 'function')} ({_n(n, 'probe point')}) {why}: {sample}")
    return [escape(line) for line in lines]


def _n(n: int, thing: str) -> str:
    return f"{n:,} {thing}{'' if n == 1 else 's'}"


# ---------------------------------------------------------------------------------------------------------
# The formats
# ---------------------------------------------------------------------------------------------------------

def render_bpftrace(found: Export) -> str:
    kept, left = usable(found, "bpftrace")
    notes = header(found, kept, left, "bpftrace")
    kernel = next((m for m in found.images if m.kind == "kernel"), None)
    if kernel is not None and kept:
        notes.append(escape(f"bpftrace checks each offset against vmlinux's symbols: run it with "
                            f"BPFTRACE_VMLINUX={kernel.path} (or that build's debug vmlinux)"))
    if len(kept) > 512:
        notes.append(f"bpftrace attaches at most $BPFTRACE_MAX_PROBES probes (512 by default): run it with "
                     f"BPFTRACE_MAX_PROBES={len(kept)}")
    lines = ["#!/usr/bin/env bpftrace"] + [f"// {n}" for n in notes]
    lines += [f"kprobe:{p.function}+{p.offset} {BPFTRACE_BODY}" for p in kept]
    if not kept:  # a program needs a probe
        lines.append('BEGIN { printf("relocverify export: no probe points\\n"); exit(); }')
    return "\n".join(lines) + "\n"


def render_perf(found: Export) -> str:
    kept, left = usable(found, "perf")
    notes = header(found, kept, left, "perf")
    notes.append(f"each probe is the event {PERF_GROUP}:FUNCTION_OFFSET; remove them all with: "
                 f"perf probe -d '{PERF_GROUP}:*'")
    lines = ["#!/bin/sh"] + [f"# {n}" for n in notes]
    events: set[str] = set()
    for p in kept:
        module = f"-m {p.image.module} " if p.image.module else ""
        lines.append(f"perf probe {module}-a '{PERF_GROUP}:{event_name(p, events)}={p.function}+{p.offset}'")
    return "\n".join(lines) + "\n"


def event_name(p: ProbePoint, taken: set[str]) -> str:
    """A perf event name for the probe point: FUNCTION_OFFSET as a C identifier of at most ``EVENT_MAX``
    characters ('.' as '_'; a long name shortened with a hash of the whole), unique among ``taken``."""
    suffix = f"_{p.offset}"
    base = re.sub(r"[^A-Za-z0-9_]", "_", p.function)
    if len(base) + len(suffix) > EVENT_MAX:
        digest = hashlib.sha1(p.function.encode()).hexdigest()[:8]
        base = f"{base[:EVENT_MAX - len(suffix) - 9]}_{digest}"
    name, n = base + suffix, 1
    while name in taken:
        n += 1
        extra = f"_{n}"
        name = base[:EVENT_MAX - len(suffix) - len(extra)] + extra + suffix
    taken.add(name)
    return name


def render_dtrace(found: Export) -> str:
    kept, left = usable(found, "dtrace")
    notes = [n.replace("*/", "* /") for n in header(found, kept, left, "dtrace")]
    notes.append("kinst is FreeBSD's instruction provider (kinst(4)); these offsets are of the store's kernel")
    lines = ["#!/usr/sbin/dtrace -s"] + [f"/* {n} */" for n in notes]
    lines += [f"kinst:{p.image.module or ''}:{p.function}:{p.offset} {DTRACE_BODY}" for p in kept]
    if not kept:  # a program needs a probe
        lines.append("BEGIN { exit(0); }")
    return "\n".join(lines) + "\n"


def render_json(found: Export) -> str:
    head = {"store": found.store, "verdicts": list(found.verdicts), "functions": found.glob,
            "matched": found.functions, "probe_points": len(found.points),
            "images": [{"kind": m.kind, "module": m.module, "path": m.path, "sha256": m.sha256,
                        "trampoline": None if m.tramp is None else hex(m.tramp)} for m in found.images]}
    text = json.dumps(head, ensure_ascii=True, indent=1)[:-2]  # reopened to append the probes, one a line
    which = {m.id: i for i, m in enumerate(found.images)}
    probes = ",\n".join(json.dumps(probe_json(p, which[p.image.id]), ensure_ascii=True, separators=(",", ":"))
                         for p in found.points)
    return text + ',\n "probes": [\n' + probes + ("\n" if probes else "") + "]}\n"


def probe_json(p: ProbePoint, image: int) -> dict:
    """One probe point; ``image`` is its image's index in the document's ``images``."""
    return {"function": p.function, "offset": p.offset, "address": hex(p.address), "verdict": p.verdict,
            "reason": p.reason, "section": p.section, "module": p.image.module, "image": image,
            "unique_name": p.unique}


RENDERERS = {"bpftrace": render_bpftrace, "perf": render_perf, "dtrace": render_dtrace, "json": render_json}
