"""Verify every instruction of a kernel image: one verdict each, totals that add up.

image -> functions -> instructions -> plan -> proof -> store -> summary.

Two phases, each on forked worker processes that share the loaded image:

1. the survey: one verdict for each distinct byte string whose verdict
   depends on its bytes alone (``depends_on_bytes_only``);
2. the functions: every instruction of whole functions; the survey's
   verdicts are looked up, the rest (RIP-relative operands, branches,
   calls) are planned and proved per instance through the shape cache,
   and kernel sites and their boot-time variants are applied.

The parent alone writes the store, one transaction per batch of whole
functions (see store.py: nothing is half-written, and a rerun resumes where
a run stopped).  A solver timeout, a hang, or a crashing worker marks the
instructions concerned ``unknown`` with the reason, and the run goes on.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import multiprocessing
import os
import re
import signal
import sys
import time
from dataclasses import dataclass

from .decoders import decode, decoder_versions, field_shape, rebase, with_fields
from .errors import InputError
from .functions import Function, find_functions, iter_instruction_spans
from .image import Image, load_image
from .instruction import Instruction
from .plan import PlanKind, fits_s32, make_plan, rel_from
from .policy import classify
from .proof import cache_key, prove_plan, reusable
from .store import Store
from .verdict import ProofResult, Verdict

CHUNK_FUNCTIONS = 64
SURVEY_CHUNK = 2000
# The solver gets the timeout; a watchdog this much later stops anything else that hangs.
WATCHDOG_MARGIN_S = 0.5
DEFAULT_KERNEL = "debian-6.1-cloud"  # what ``relocverify vmlinux`` verifies when given no path
WRITE_EVERY_S = 2.0

_HEX = re.compile(r"0x[0-9a-f]+|\b[0-9a-f]{6,}\b")


def reason_key(verdict: str, rule: str, method: str, reason: str) -> str:
    """A reason with its instance-specific numbers removed, for counting."""
    if verdict == Verdict.PROVED.value:
        return f"proved by {method}"
    if verdict == Verdict.REJECTED.value and not rule.startswith("site:"):
        return f"{rule}: {_HEX.sub('N', reason.split(':')[0] if rule in ('undecodable', 'decoder-disagreement') else reason)[:140]}"
    return _HEX.sub("N", reason)[:160]


# ---------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


@dataclass
class _Context:
    image: Image
    tramp: int
    timeout_s: float
    cache: dict  # proof-cache key -> (verdict, reason, method)
    bytes_only: dict  # raw -> verdict row, for instructions whose verdict depends on their bytes alone
    sites: object = None  # sites.SiteIndex, or None
    variants: object = None  # variants.VariantFinder, or None


_CTX: _Context | None = None
_DECODED: dict[bytes, object] = {}

# A verdict row: (verdict, reason, method, plan kind, rule, class, reason key)
Row = tuple


_SHAPES: dict[bytes, Instruction] = {}
_CACHE_LIMIT = 200_000  # decodes kept per worker: beyond it the caches start afresh (memory, not correctness)


def _decode(raw: bytes, address: int):
    """decoders.decode, once per distinct byte string and, for encodings with
    displacement or immediate fields, once per shape (decoders.with_fields)."""
    hit = _DECODED.get(raw)
    if hit is not None:
        return rebase(hit, address)
    shape = field_shape(raw)
    if shape is not None:
        base = _SHAPES.get(shape)
        if base is not None:
            d = with_fields(base, raw, address)
            if d is not None:
                return d
    d = decode(raw, address)
    if len(_DECODED) >= _CACHE_LIMIT:
        _DECODED.clear()
        _SHAPES.clear()
    _DECODED[raw] = d
    if shape is not None and isinstance(d, Instruction):
        _SHAPES[shape] = d
    return d


def _row(verdict: str, reason: str, method: str, kind: str, rule: str, klass: str) -> Row:
    return verdict, reason, method, kind, rule, klass, reason_key(verdict, rule, method, reason)


def verify_instruction(raw: bytes, address: int, tramp: int, timeout_s: float, cache: dict,
                       new_cache: dict) -> Row:
    """The verdict row of one instruction: decode, plan, cached proof or a new one."""
    decoded = _decode(raw, address)
    klass = decoded.opname if isinstance(decoded, Instruction) else type(decoded).__name__.lower()
    plan = make_plan(decoded, tramp)
    if plan.kind is PlanKind.REJECT:
        return _row(Verdict.REJECTED.value, plan.reason, "policy", plan.kind.value, plan.rule, klass)
    key = cache_key(decoded, plan)
    if key is not None:
        hit = cache.get(key) or new_cache.get(key)
        if hit is not None:
            return _row(hit[0], hit[1], hit[2], plan.kind.value, plan.rule, klass)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s + WATCHDOG_MARGIN_S)
    try:
        result = prove_plan(decoded, plan, timeout_ms=int(timeout_s * 1000))
    except _Timeout:
        result = ProofResult(Verdict.UNKNOWN, f"timeout: no verdict within {timeout_s:g} s", "timeout")
    except Exception as exc:  # a bug in a third-party library must not stop the run
        result = ProofResult(Verdict.UNKNOWN, f"internal error: {type(exc).__name__}: {str(exc)[:100]}", "error")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    if key is not None and reusable(key, result):
        new_cache[key] = (result.verdict.value, result.reason, result.method)
    return _row(result.verdict.value, result.reason, result.method, plan.kind.value, plan.rule, klass)


def depends_on_bytes_only(decoded) -> bool:
    """True if the verdict of ``decoded`` is the same at every address A (for
    a given T within rel32 reach of A+len): a decode failure, or an
    instruction without a RIP-relative operand or relative branch that the
    policy copies or rejects.  See proof.cache_key for why."""
    if not isinstance(decoded, Instruction):
        return True
    if decoded.rip_relative or decoded.branch_target is not None:
        return False
    return classify(decoded).strategy in ("copy", "reject")


def _jump_back_in_reach(address: int, length: int, tramp: int) -> bool:
    return fits_s32(rel_from(tramp + length + 5, address + length))


def _survey(items: list[tuple[bytes, int]]):
    """Phase 1: one verdict per distinct byte string whose verdict depends on its bytes only."""
    ctx = _CTX
    new_cache: dict = {}
    bytes_only, other = {}, []
    for raw, address in items:
        decoded = _decode(raw, address)
        if depends_on_bytes_only(decoded) and _jump_back_in_reach(address, len(raw), ctx.tramp):
            bytes_only[raw] = verify_instruction(raw, address, ctx.tramp, ctx.timeout_s, ctx.cache, new_cache)
        else:
            other.append(raw)
    return bytes_only, other, new_cache


def _verify_functions(functions: list[Function]):
    """Phase 2: every instruction of whole functions."""
    ctx = _CTX
    known = ctx.bytes_only
    new_cache: dict = {}
    out = []
    for fn in functions:
        rows = []
        for address, raw in iter_instruction_spans(ctx.image, fn):
            row = known.get(raw)
            if row is None or not _jump_back_in_reach(address, len(raw), ctx.tramp):
                row = verify_instruction(raw, address, ctx.tramp, ctx.timeout_s, ctx.cache, new_cache)
            kinds = ""
            if ctx.sites is not None:
                found = ctx.sites.sites_at(address, len(raw))
                if found:
                    row = _with_sites(row, found, address, raw, ctx, new_cache)
                    kinds = "," + ",".join(dict.fromkeys(s.kind for s in found)) + ","
            rows.append((address, fn.section, fn.name, raw) + row + (kinds,))
        out.append((fn.start, fn.name, rows))
    return out, new_cache


_RANK = {v.value: v.rank for v in Verdict}


def site_verdict(image: Image, sites, raw: bytes, address: int, tramp: int, timeout_s: float,
                 row: Row) -> tuple[Row, tuple]:
    """One instruction's verdict row in the light of the image's sites, and those sites."""
    from .variants import VariantFinder

    found = tuple(sites.sites_at(address, len(raw)))
    if not found:
        return row, found
    ctx = _Context(image, tramp, timeout_s, {}, {}, sites, VariantFinder(image))
    return _with_sites(row, found, address, raw, ctx, {}), found


def _with_sites(row: Row, found, address: int, raw: bytes, ctx: _Context, new_cache: dict) -> Row:
    """The row's verdict in the light of the kernel sites covering the instruction.

    The weakest verdict wins (``Verdict`` order): a site the policy rejects
    makes it ``rejected``; at a boot-patched site every variant that can run
    is verified and the weakest of their verdicts is kept, and a site whose
    variants are not in the image makes it ``unknown``.  A refutation of the
    bytes on disk is never hidden."""
    from .sites import POLICY_BY_KIND
    from .variants import NoVariants

    worst = row
    for site in found:
        policy = POLICY_BY_KIND.get(site.kind)
        if policy is None or policy.consequence == "mark":
            continue
        if policy.consequence == "reject":
            cand = _row(Verdict.REJECTED.value, f"site {site.kind}: {policy.reason}", "site", row[3],
                        f"site:{site.kind}", row[5])
        else:
            variants = ctx.variants.variants_at(site, address, raw)
            if isinstance(variants, NoVariants):
                cand = _row(Verdict.UNKNOWN.value, f"site {site.kind}: {variants.reason}", "site", row[3],
                            f"site:{site.kind}", row[5])
            else:
                cand = row
                for v in variants:
                    if v.raw == raw:
                        continue
                    vr = verify_instruction(v.raw, address, ctx.tramp, ctx.timeout_s, ctx.cache, new_cache)
                    if _RANK[vr[0]] > _RANK[cand[0]]:
                        cand = _row(vr[0], f"site {site.kind}, variant {v.name}: {vr[1]}", vr[2], vr[3], vr[4],
                                    row[5])
        if _RANK[cand[0]] > _RANK[worst[0]]:
            worst = cand
    return worst


def _crashed_rows(fn: Function, ctx: _Context, why: str):
    rows = [(a, fn.section, fn.name, bytes(r), Verdict.UNKNOWN.value, why, "crash", "", "", "", why, "")
            for a, r in iter_instruction_spans(ctx.image, fn)]
    return fn.start, fn.name, rows


# ---------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------


@dataclass
class Progress:
    total: int
    enabled: bool
    start: float = 0.0
    done: int = 0
    last: float = 0.0

    def advance(self, n: int, final: bool = False) -> None:
        self.done += n
        now = time.monotonic()
        if not self.enabled or (now - self.last < 0.5 and not final):
            return
        self.last = now
        rate = self.done / max(now - self.start, 1e-9)
        eta = (self.total - self.done) / rate if rate > 0 else 0
        width = 30
        filled = int(width * self.done / max(self.total, 1))
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done:,}/{self.total:,} insn "
                         f"{rate:,.0f} insn/s ETA {eta:,.0f}s ")
        if final:
            sys.stderr.write("\n")
        sys.stderr.flush()


def tool_versions() -> dict:
    import angr
    import claripy
    import pyvex
    import unicorn
    import z3

    from . import __version__

    return {"relocverify": __version__, **decoder_versions(), "pyvex": pyvex.__version__, "angr": angr.__version__,
            "claripy": claripy.__version__, "z3": z3.get_version_string(), "unicorn": unicorn.__version__}


def run(image: Image, store: Store, tramp: int, jobs: int, timeout_s: float, limit: int | None = None,
        progress: bool = True, with_sites: bool = True) -> dict:
    """Verify every instruction of ``image`` (its first ``limit`` functions) into ``store``.

    Phase 1 gives one verdict to each distinct byte string whose verdict
    depends on its bytes alone (``depends_on_bytes_only``), in parallel, each
    proved once.  Phase 2 walks whole functions, in parallel: it looks those
    verdicts up and plans and proves the rest (RIP-relative operands,
    branches, calls) instance by instance, through the shape cache."""
    global _CTX
    t0 = time.monotonic()
    functions = find_functions(image)
    if limit is not None:
        functions = functions[:limit]
    versions = tool_versions()
    config = json.dumps({"tramp": tramp, "versions": versions, "sites": with_sites}, sort_keys=True)
    tag = hashlib.sha256(config.encode()).digest()[:12]
    done = store.done_functions(image.identity, config)
    todo = [f for f in functions if f.start not in done]
    store.add_image(image.identity, image.path, image.format, image.symbol_source,
                    {"sections": [s.name for s in image.iter_executable_sections()], "notes": list(image.notes)})
    previous = None if todo else store.last_summary(image.identity, config)
    run_id = store.start_run(image.identity, tramp, config)
    byte_verdicts = store.load_byte_verdicts(tag) if todo else {}
    from .sites import find_sites
    from .variants import VariantFinder

    sites = find_sites(image) if with_sites else None
    _CTX = _Context(image, tramp, timeout_s, store.load_cache() if todo else {}, {}, sites,
                    VariantFinder(image) if sites is not None else None)
    first_seen: dict[bytes, int] = {}
    total = 0
    for f in todo:
        for address, raw in iter_instruction_spans(image, f):
            total += 1
            if raw not in byte_verdicts and raw not in first_seen:
                first_seen[raw] = address
    status = "complete"
    alternatives = None
    surveyed = 0
    phases = {"setup_s": round(time.monotonic() - t0, 3)}
    bar = Progress(total, progress, time.monotonic())
    try:
        t1 = time.monotonic()
        _survey_pool(sorted(first_seen.items()), store, tag, byte_verdicts, jobs, progress)
        phases["survey_s"] = round(time.monotonic() - t1, 3)
        surveyed = len(first_seen)
        del first_seen
        _CTX.bytes_only = {raw: row for raw, row in byte_verdicts.items() if row is not None}
        bar.start = time.monotonic()
        t1 = time.monotonic()
        _run_pool(todo, store, image.identity, run_id, jobs, bar, config)
        phases["functions_s"] = round(time.monotonic() - t1, 3)
        if sites is not None:
            t1 = time.monotonic()
            alternatives = verify_replacements(sites, _CTX)
            phases["replacements_s"] = round(time.monotonic() - t1, 3)
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        bar.advance(0, final=True)
        if previous is not None and previous.get("functions") == len(functions) and status == "complete":
            summary = previous  # nothing was verified: every stored row is as that run left it
        else:
            summary = summarize(store, image, functions, 0.0, sites)
        summary["run"] = {"id": run_id, "status": status, "verified_now": bar.done, "resumed": len(done),
                          "distinct_byte_strings_surveyed": surveyed, "phases": phases}
        if alternatives is not None:
            summary["alternative_replacements"] = alternatives
        wall = time.monotonic() - t0
        summary["wall_s"] = round(wall, 3)
        summary["instructions_per_s"] = round(bar.done / wall, 1) if wall > 0 else None
        store.finish_run(run_id, status, summary)
    return summary


def _chunks(items, n):
    for i in range(0, len(items), n):
        yield items[i:i + n]


def _pool(jobs: int):
    return cf.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork"))


def _survey_pool(items: list[tuple[bytes, int]], store: Store, tag: bytes, byte_verdicts: dict, jobs: int,
                 progress: bool) -> None:
    if not items:
        return
    bar = Progress(len(items), progress, time.monotonic())
    chunks = list(_chunks(items, SURVEY_CHUNK))

    shared: dict[tuple, tuple] = {}

    def absorb(result):
        found, other, cache = result
        batch = {raw: shared.setdefault(row, row) for raw, row in found.items()}
        batch.update({raw: None for raw in other})
        byte_verdicts.update(batch)
        _CTX.cache.update(cache)
        store.write_byte_verdicts(tag, batch, cache)
        bar.advance(len(batch))

    def lost(chunk):
        # A worker died surveying these: leave them to phase 2, which verifies them
        # instance by instance and isolates a crash to one function (not stored).
        byte_verdicts.update({raw: None for raw, _ in chunk})
        bar.advance(len(chunk))

    if jobs <= 1:
        for c in chunks:
            absorb(_survey(c))
    else:
        with _pool(jobs) as pool:
            futures = {pool.submit(_survey, c): c for c in chunks}
            try:
                for fut in cf.as_completed(futures):
                    try:
                        absorb(fut.result())
                    except cf.process.BrokenProcessPool:
                        lost(futures[fut])
            except cf.process.BrokenProcessPool:
                for fut, c in futures.items():
                    if not fut.done():
                        lost(c)
    bar.advance(0, final=True)


def _run_pool(todo: list[Function], store: Store, image: str, run_id: int, jobs: int, bar: Progress,
              config: str) -> None:
    pending_rows: list = []
    pending_cache: dict = {}
    last_write = time.monotonic()

    def absorb(results, cache):
        pending_rows.extend(results)
        pending_cache.update(cache)
        _CTX.cache.update(cache)
        bar.advance(sum(len(r[2]) for r in results))
        if time.monotonic() - last_write > WRITE_EVERY_S:
            flush()

    def flush():
        nonlocal last_write
        if pending_rows or pending_cache:
            store.write_functions(image, run_id, pending_rows, pending_cache, config)
        pending_rows.clear()
        pending_cache.clear()
        last_write = time.monotonic()

    chunks = list(_chunks(todo, CHUNK_FUNCTIONS))
    try:
        if jobs <= 1:
            for chunk in chunks:
                absorb(*_verify_functions(chunk))
            return
        retry: list[list[Function]] = []
        with _pool(jobs) as pool:
            futures = {pool.submit(_verify_functions, c): c for c in chunks}
            try:
                for fut in cf.as_completed(futures):
                    try:
                        absorb(*fut.result())
                    except cf.process.BrokenProcessPool:
                        retry.append(futures[fut])
            except cf.process.BrokenProcessPool:
                retry.extend(c for f, c in futures.items() if not f.done())
        for chunk in retry:  # isolate the crash: one function per fresh worker
            for fn in chunk:
                with _pool(1) as pool:
                    try:
                        absorb(*pool.submit(_verify_functions, [fn]).result())
                    except cf.process.BrokenProcessPool:
                        absorb([_crashed_rows(fn, _CTX, "worker crashed while verifying this function")], {})
    finally:
        flush()


# ---------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------


def summarize(store: Store, image: Image, functions: list[Function], wall_s: float, site_index=None) -> dict:
    """Counts over every stored instruction of the image, in one scan of the store."""
    from collections import Counter

    ident = image.identity
    by_verdict = Counter({v.value: 0 for v in Verdict})
    by_section: dict[str, Counter] = {}
    by_class: dict[str, Counter] = {}
    by_function: dict[str, Counter] = {}
    reasons, methods, plans, site_rows = Counter(), Counter(), Counter(), Counter()
    for sec, verdict, rkey, method, kind, klass, sites, n in store.db.execute(
            "SELECT section, verdict, reason_key, method, plan_kind, klass, sites, count(*) "
            "FROM instructions WHERE image=? GROUP BY 1, 2, 3, 4, 5, 6, 7", (ident,)):
        by_verdict[verdict] += n
        by_section.setdefault(sec, Counter())[verdict] += n
        by_class.setdefault(klass, Counter())[verdict] += n
        reasons[rkey] += n
        methods[method] += n
        plans[kind] += n
        for k in (sites or "").strip(",").split(","):
            if k:
                site_rows[k] += n
    for verdict, fn, n in store.db.execute(
            "SELECT verdict, function, count(*) FROM instructions WHERE image=? AND verdict != 'proved' "
            "GROUP BY 1, 2", (ident,)):
        by_function.setdefault(verdict, Counter())[fn] += n
    n = sum(by_verdict.values())
    done = store.db.execute("SELECT count(*) FROM functions_done WHERE image=?", (ident,)).fetchone()[0]
    expected = expected_instruction_count(image, functions)
    summary = {
        "image": {"path": image.path, "identity": ident, "format": image.format,
                  "compression": image.compression, "symbols": image.symbol_source},
        "instructions": n,
        "instructions_expected": expected,
        "functions": len(functions),
        "functions_verified": done,
        "by_verdict": dict(by_verdict),
        "by_method": dict(methods),
        "by_plan": dict(plans),
        "by_reason": dict(reasons.most_common()),
        "by_section": {k: dict(v) for k, v in sorted(by_section.items())},
        "by_class": {k: dict(v) for k, v in sorted(by_class.items(), key=lambda kv: -sum(kv[1].values()))},
        "top_functions": {v: [{"function": f, "instructions": c} for f, c in by_function.get(v, Counter()).most_common(10)]
                          for v in ("rejected", "unknown", "opaque", "refuted")},
        "wall_s": round(wall_s, 3),
        "instructions_per_s": round(n / wall_s, 1) if wall_s > 0 else None,
        "totals_add_up": n == sum(by_verdict.values()) == expected,
    }
    if site_index is not None:
        counts = site_index.count_by_kind()
        summary["by_site"] = {k: {"sites": counts.get(k, 0), "instructions": site_rows.get(k, 0)}
                              for k in site_index.kinds()}
        summary["sites_missing"] = list(site_index.missing)
    return summary


def expected_instruction_count(image: Image, functions: list[Function]) -> int:
    """How many distinct instructions (by address) the functions hold.

    Function bounds may overlap (retbleed_untrain_ret holds
    retbleed_return_thunk one byte in); an address decoded in both is one
    instruction and gets one verdict."""
    from .functions import count_instructions

    total, prev = 0, None
    overlapping = []
    for f in sorted(functions, key=lambda f: (f.start, f.end)):
        total += count_instructions(image, f)
        if prev is not None and f.start < prev.end:
            overlapping.append((prev, f))
        if prev is None or f.end > prev.end:
            prev = f
    for a, b in overlapping:
        shared = {x for x, _ in iter_instruction_spans(image, a)} & {x for x, _ in iter_instruction_spans(image, b)}
        total -= len(shared)
    return total


def verify_replacements(sites, ctx: _Context) -> dict:
    """Every alternative's replacement, verified instruction by instruction at its live address."""
    from .variants import NoVariants

    by_verdict = {v.value: 0 for v in Verdict}
    reasons: dict[str, int] = {}
    n_sites = n_insns = 0
    cache: dict = {}
    for site in sites.iter_sites("alternative"):
        n_sites += 1
        insns = ctx.variants.replacement_instructions(site)
        if isinstance(insns, NoVariants):
            by_verdict[Verdict.UNKNOWN.value] += 1
            reasons[insns.reason] = reasons.get(insns.reason, 0) + 1
            continue
        for address, raw in insns:
            n_insns += 1
            row = verify_instruction(raw, address, ctx.tramp, ctx.timeout_s, ctx.cache, cache)
            by_verdict[row[0]] += 1
            if row[0] != Verdict.PROVED.value:
                reasons[row[6]] = reasons.get(row[6], 0) + 1
    return {"sites": n_sites, "instructions": n_insns, "by_verdict": by_verdict,
            "by_reason": dict(sorted(reasons.items(), key=lambda kv: -kv[1]))}


def render_summary(s: dict) -> str:
    lines = [f"image: {s['image']['path']} ({s['image']['format']}, symbols: {s['image']['symbols']})",
             f"instructions: {s['instructions']:,} in {s['functions']:,} functions "
             f"({s['functions_verified']:,} verified); expected {s['instructions_expected']:,}; "
             f"totals add up: {s['totals_add_up']}",
             "by verdict: " + ", ".join(f"{k} {v:,}" for k, v in s["by_verdict"].items()),
             "by method: " + ", ".join(f"{k} {v:,}" for k, v in sorted(s["by_method"].items())),
             "by section:"]
    for sec, d in sorted(s["by_section"].items()):
        lines.append(f"  {sec:<24} " + ", ".join(f"{k} {v:,}" for k, v in sorted(d.items())))
    lines.append("top reasons:")
    for r, c in list(s["by_reason"].items())[:15]:
        lines.append(f"  {c:>9,}  {r}")
    for verdict in ("rejected", "unknown"):
        tops = s["top_functions"][verdict][:5]
        if tops:
            lines.append(f"top functions by {verdict}: " + ", ".join(f"{t['function']} ({t['instructions']})" for t in tops))
    if "by_site" in s:
        lines.append("sites (table entries / instructions covered):")
        for k, v in s["by_site"].items():
            lines.append(f"  {k:<18} {v['sites']:>8,} {v['instructions']:>10,}")
    if "alternative_replacements" in s:
        a = s["alternative_replacements"]
        lines.append(f"alternative replacements: {a['sites']:,} sites, {a['instructions']:,} instructions: "
                     + ", ".join(f"{k} {v:,}" for k, v in a["by_verdict"].items()))
    lines.append(f"wall: {s['wall_s']:.1f} s, {s['instructions_per_s'] or 0:,.0f} insn/s verified in this run")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# Command
# ---------------------------------------------------------------------------


def command(args, out) -> int:
    path, system_map = args.path, args.system_map
    if path is None:
        from .fetch import fetch

        k = fetch(DEFAULT_KERNEL, None)
        path = str(k.vmlinux)
    image = load_image(path, system_map)
    db = args.db or os.path.join(os.path.dirname(os.path.abspath(path)), f"relocverify-{image.identity[:12]}.sqlite")
    jobs = args.jobs or os.cpu_count() or 1
    if jobs < 1:
        raise InputError("--jobs must be at least 1")
    store = Store(db)
    try:
        summary = run(image, store, args.trampoline_base, jobs, args.timeout, args.limit, not args.no_progress)
    finally:
        store.close()
    out.write(render_summary(summary))
    out.write(f"store: {db}\n")
    if args.summary_json:
        with open(args.summary_json, "w") as fh:
            json.dump(summary, fh, indent=2)
    bad = summary["by_verdict"].get("refuted", 0)
    return 1 if bad else 0
