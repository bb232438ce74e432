"""An ``Export``'s probe points as a file in a tracer's own syntax (``relocverify export --format``):

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
bpftrace the functions of modules.  JSON leaves nothing out and says these per probe.  Every name taken
from the store is escaped (``text.printable``) in the comments.  Pure: text in, text out.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex

from ..text import printable
from .probe_points import Export, ProbePoint

#: The names FUNC+OFF can address in all three tools' probe syntax: a C identifier, plus the '.' of
#: compiler clones (foo.isra.0, foo.cold): bpftrace since 0.10 (bpftrace PR #1111), perf-probe (its
#: special characters are = @ + : ;) and DTrace probe descriptions all take it.
ADDRESSABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
#: A module name a DTrace probe description can hold: its module field ends at ':' and takes no glob
#: characters, quotes or white space (D's probe-description grammar); kernel modules are named so.
DTRACE_MODULE = re.compile(r"[A-Za-z0-9_.-]+")
#: Sections the kernel frees after boot (a module's after its init): no probe can be placed there.
FREED = (".init.text", ".exit.text")
PERF_GROUP = "relocverify"
EVENT_MAX = 63  # perf and the kernel's trace events: at most 64 bytes with the terminating NUL
BPFTRACE_BODY = "{ @[probe] = count(); }"
DTRACE_BODY = "{ @[probefunc, probename] = count(); }"


# ---------------------------------------------------------------------------------------------------------
# Which probe points a tool can take
# ---------------------------------------------------------------------------------------------------------

#: (key, why), in the order they are checked: the first that applies is the one counted.
LEFT_OUT = (
    ("user", "in user-space images (uprobes, not kprobes)"),
    ("module", "of kernel modules (bpftrace checks a kprobe's offset in vmlinux, which lacks them)"),
    ("freed", "in .init.text or .exit.text (freed after boot: the kernel refuses probes there)"),
    ("name", "whose names the probe syntax cannot take (only [A-Za-z_][A-Za-z0-9_.]*)"),
    ("module-name", "of modules whose file names the probe syntax cannot take (only [A-Za-z0-9_.-]+)"),
    ("module-control", "of modules whose file names hold control, invisible or undecodable characters (a terminal "
                       "that shows or pastes the line acts on them)"),
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
    if tool == "dtrace" and p.image.module and not DTRACE_MODULE.fullmatch(p.image.module):
        return "module-name"
    if tool == "perf" and p.image.module and not p.image.module.isprintable():
        return "module-control"  # shell-quoted it is one word to sh, but an escape sequence to a terminal
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
    if found.refused:
        lines.append(f"left out: {_n(found.refused, 'instruction')} whose stored verdict the policy does not allow "
                     f"for its bytes: the store was altered; verify the image again into a new store")
    for key, why in LEFT_OUT:
        if key in left:
            names, functions, n = left[key]
            sample = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
            lines.append(f"left out: {_n(len(functions), 'function')} ({_n(n, 'probe point')}) {why}: {sample}")
    return [printable(line) for line in lines]


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
        notes.append(printable(f"bpftrace checks each offset against vmlinux's symbols: run it with "
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
        module = f"-m {shlex.quote(p.image.module)} " if p.image.module else ""  # a file name, any bytes
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
            "refused": found.refused,  # rows whose stored verdict the policy does not allow: an altered store
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


#: The formats, each a function of an ``Export`` to the file's whole text.
RENDERERS = {"bpftrace": render_bpftrace, "perf": render_perf, "dtrace": render_dtrace, "json": render_json}
FORMATS = tuple(RENDERERS)
