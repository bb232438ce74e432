"""The tracer audit over whole inputs: a kernel image or user-space ELF (``audit_image``), kernel
modules laid out in module space (``audit_modules``), a kernel's vmlinux and every module
(``audit_package``).

Each image is first verified into the store as the batch commands do (``engine.run.run``: a
complete earlier run is reused), which gives relocverify's own verdict for every instruction;
then ``audit.audit_store`` buckets the image's instructions per tracer, with one ``Auditor`` for
all the images of a command (its proofs and remembered outcomes are shared between them).
Several images' summaries are added up by ``merge``: per tracer, the instructions and the buckets
sum, the groups merge by name, and ``totals_add_up`` is checked again over the sum.  Nothing here
writes to the command's output: the command line calls one of these and renders the summary.
"""

from __future__ import annotations

import hashlib
import time
from typing import Callable, Optional

from .audit import BUCKETS, EXAMPLES, Auditor, ImageFacts, audit_store

#: Where progress goes: (phase, done, total), or None.
Say = Optional[Callable[[str, int, int], None]]


def image_facts(image, sites: bool, thunks: tuple[int, int] | None = None) -> ImageFacts:
    """What optprobes reads from an image: the retpoline thunk range (``thunks``, else the image's
    own ``__indirect_thunk_start..end``), and every transfer into a range (``kernel.patch_range``:
    one walk over every function, and the site tables when ``sites``)."""
    from ..image.functions import find_functions
    from ..kernel.patch_range import PatchRanges
    from ..kernel.sites import find_sites
    from .optprobes import entries_of

    ranges = PatchRanges(image, find_functions(image), find_sites(image) if sites else None)
    if thunks is None:
        lo, hi = image.symbol_address("__indirect_thunk_start"), image.symbol_address("__indirect_thunk_end")
        thunks = None if lo is None or hi is None else (lo, hi)

    def digest(start: int, size: int) -> bytes:
        return hashlib.blake2b(repr(ranges.entries_inside(start - 1, size + 1)).encode(), digest_size=12).digest()

    return ImageFacts(thunks, entries_of(ranges), digest)


def _needs_facts(auditor: Auditor) -> bool:
    return any(getattr(m, "per_function", False) for m in auditor.models)


def audit_image(image, db: str, options, auditor: Auditor, say: Say = None, session=None,
                thunks: tuple[int, int] | None = None) -> dict:
    """One image: verified into ``db`` (``options``: the engine's ``RunOptions``), then audited.  The
    summary is ``audit_store``'s, with the image and relocverify's own verdicts added."""
    from ..schedule.progress import Progress
    from ..engine.run import run
    from ..store.store import Store

    own = run(image, db, options, Progress(enabled=say is not None), session)
    store = Store(db, readonly=True)
    try:
        image_id = store.find_image(image.identity)
    finally:
        store.close()
    facts = image_facts(image, options.with_sites, thunks) if _needs_facts(auditor) else None
    summary = audit_store(db, auditor, image_id, options.limit, say, facts)
    summary["image"] = {"path": image.path, "identity": image.identity, "policy": options.policy}
    summary["own"] = {"by_verdict": own["by_verdict"], "instructions": own["instructions"]}
    return summary


def audit_modules(paths: list[str], vmlinux, db: str, options, auditor: Auditor, base: int | None = None,
                  say: Say = None) -> dict:
    """Kernel modules, laid out in module space from ``base`` and relocated against ``vmlinux``'s
    symbols (``image.module``), each audited; the summaries merged (a module without a function
    counts zero instructions)."""
    from ..image.module import MODULE_BASE, load_modules

    thunks = _thunks(vmlinux)
    parts = {}
    for k, (path, image) in enumerate(load_modules(paths, vmlinux, MODULE_BASE if base is None else base)):
        parts[path] = _one_module(image, db, options, auditor, None, thunks)
        if say is not None:
            say("modules", k + 1, len(paths))
    return merge(parts, auditor)


def audit_package(source: str, db: str, options, auditor: Auditor, dbg: str | None = None,
                  limit_modules: int | None = None, say: Say = None) -> dict:
    """A whole kernel: its vmlinux and every module (the first ``limit_modules``) that ``source`` names
    (``engine.verify.kernel_parts``), on one session's workers; the summaries merged."""
    from ..engine.run import Session
    from ..engine.verify import kernel_parts
    from ..image.loader import load_image, require_kernel
    from ..image.module import load_modules

    parts = kernel_parts(source, dbg)
    vmlinux = load_image(parts.vmlinux, parts.system_map)
    require_kernel(vmlinux)
    modules = parts.modules[:limit_modules]
    thunks = _thunks(vmlinux)
    out = {}
    with Session(options) as session:
        out["vmlinux"] = audit_image(vmlinux, db, options, auditor, say, session)
        for k, ((name, _), (_, image)) in enumerate(zip(modules, load_modules([p for _, p in modules], vmlinux))):
            out[name] = _one_module(image, db, options, auditor, session, thunks)
            if say is not None:
                say("modules", k + 1, len(modules))
    summary = merge(out, auditor)
    summary["source"] = parts.used
    return summary


def _one_module(image, db, options, auditor, session, thunks) -> dict:
    from ..image.functions import find_functions

    if not find_functions(image):  # a module of data alone: nothing to verify, nothing to audit
        return {"instructions": 0, "functions": 0, "tracers": {m.name: _empty_tally() for m in auditor.models},
                "image": {"path": image.path, "identity": image.identity, "policy": options.policy}}
    return audit_image(image, db, options, auditor, None, session, thunks)


def _thunks(vmlinux) -> tuple[int, int] | None:
    lo, hi = vmlinux.symbol_address("__indirect_thunk_start"), vmlinux.symbol_address("__indirect_thunk_end")
    return None if lo is None or hi is None else (lo, hi)


def _empty_tally() -> dict:
    return {"instructions": 0, "buckets": {b: 0 for b in BUCKETS}, "totals_add_up": True,
            "groups": {b: [] for b in BUCKETS}}


def merge(parts: dict[str, dict], auditor: Auditor) -> dict:
    """Several images' audit summaries as one: per tracer the instructions and buckets summed, the
    groups merged by (bucket, group) with their counts summed and the first few instances kept, and
    per image its instructions and buckets (``images``)."""
    t0 = time.monotonic()
    tracers: dict[str, dict] = {}
    for part in parts.values():
        for name, t in part["tracers"].items():
            into = tracers.setdefault(name, _empty_tally() | {"source": t.get("source", "")})
            into["instructions"] += t["instructions"]
            for k, n in t.get("cpu_replay", {}).items():
                into.setdefault("cpu_replay", {})[k] = into.get("cpu_replay", {}).get(k, 0) + n
            for b in BUCKETS:
                into["buckets"][b] += t["buckets"][b]
                groups = {g["group"]: g for g in into["groups"][b]}
                for g in t["groups"][b]:
                    have = groups.get(g["group"])
                    if have is None:
                        groups[g["group"]] = dict(g, examples=list(g["examples"]))
                    else:
                        have["count"] += g["count"]
                        have["examples"].extend(g["examples"][:EXAMPLES - len(have["examples"])])
                into["groups"][b] = sorted(groups.values(), key=lambda g: -g["count"])
    for t in tracers.values():
        t["totals_add_up"] = sum(t["buckets"].values()) == t["instructions"] and sum(
            g["count"] for gs in t["groups"].values() for g in gs) == t["instructions"]
    images = {label: {"instructions": p["instructions"],
                      "tracers": {n: t["buckets"] for n, t in p["tracers"].items()}} for label, p in parts.items()}
    return {"instructions": sum(p["instructions"] for p in parts.values()),
            "functions": sum(p.get("functions", 0) for p in parts.values()), "tramp": hex(auditor.tramp),
            "cases": sum(p.get("cases", 0) for p in parts.values()), "tracers": tracers, "images": images,
            "counts": dict(auditor.counts), "wall_s": round(sum(p.get("wall_s", 0) for p in parts.values())
                                                          + time.monotonic() - t0, 3)}
