"""The tracer audit as a pass of the engine (``engine.passes.StoredPass``): its first pass on the run's workers, its
second in the parent; the same summary as ``audit.audit_store``, which does both in one process.

Per chunk of functions, in a worker (``WorkerAudit``, a chunk's value an ``AuditChunk``): each function's
boundary walks (kprobes' ``can_probe``), its instructions grouped into cases (``audit.add_cases``), and each
per-function model's outcomes (optprobes).  In the parent (``AuditMerge``), the chunks in function order: the
walks the workers made, the cases merged as one walk over the functions would have grouped them
(``audit.merge_cases``), each per-function model's outcomes into its tally; then every case judged once per
per-instruction model, in case order (``audit.judge_cases``), by the request's own ``Auditor``, as now.

What makes it the same summary, ``counts`` included.  The auditor's memos (proofs filed this audit, the
obligations, the pieces of blocks, the walks, the per-function outcomes) are shared from function to
function: one process proving an obligation lets a later function share it.  So a worker keeps no count and
files nothing for the parent: its auditor (the parent's as it was when the worker was forked, its own copy;
else one read from the cache directory, without the cache's proofs, which may have grown since the parent
read them) only saves it work.  What it found is replayed in the parent, function by function in function
order, against the parent's auditor: a function whose per-function outcomes the parent remembers (from
before, or from an earlier function of this run) takes them, counting nothing, as in one process; one the
worker judged has each of its ``Auditor.verdict`` calls (``audit.Told``) looked up again in the parent's
memos, in order: shared when the parent has the proof or the obligation, else made, with the pieces of
blocks it composed counted when new to the parent (``replayed``).  A worker knows at most what the parent
knows when it reaches the function (what it knew when forked, and what it found in earlier functions,
which the parent merged before), so the parent's answer can only differ from the worker's by knowing more:
when the replayed answer is the worker's, the worker's outcomes are one process's; when one is not (a proof
the parent had filed differs from the one the worker made; the worker knew something the parent does not:
a task run out of order), the function is judged again in the parent (``Auditor.function_outcomes``), as
one process would.  A function whose outcomes the worker remembered from before it started is the parent's
too (never changed once filed), and is tallied in the worker (``Tallied``).

Outside the audit's summary: each proof filed from a worker's replay keeps the worker's proof time.

What one process does not give the same twice, neither does this: the values of a counterexample z3 finds
for a proof made during the audit.  z3's model for the same obligation depends on what the process proved
before it (``audit_store`` after a ``--jobs 1`` verification, which proves in the parent, and after a
``--jobs 2`` one give different ones for the AVX instructions of ``blake2s_compress_avx512``, whose replays
on unicorn and on this CPU then differ too: the group's name, ``confirmed on CPU`` or not, and
``counts.cpu_replays``).  Here the per-function models' proofs are made in the workers, each after its own
earlier ones, and the parent judges after none of them: other histories, and there other values.  A warm
audit proves nothing: from the same remembered outcomes it gives ``audit_store``'s summary byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass

from ..engine.keys import KeyMaker
from ..engine.passes import StoredFunction, StoredMerge, StoredPass
from ..image.functions import find_functions
from ..image.source import load_source
from ..kernel.patch_range import PatchRanges
from ..kernel.sites import find_sites
from .audit import (AuditPlan, Auditor, ImageFacts, Tally, Told, TracerOutcome, add_cases, add_rows, image_summary,
                    masks_of, merge_cases, judge_cases, unfiled, walks_of)
from .optprobes import entries_of


def image_facts(image, sites: bool, thunks: tuple[int, int] | None = None) -> ImageFacts:
    """What optprobes reads from an image: the retpoline thunk range (``thunks``, else the image's
    own ``__indirect_thunk_start..end``), and every transfer into a range (``kernel.patch_range``:
    one walk over every function, and the site tables when ``sites``)."""
    ranges = PatchRanges(image, find_functions(image), find_sites(image) if sites else None)
    if thunks is None:
        thunks = thunks_of(image)

    def digest(start: int, size: int) -> bytes:
        return hashlib.blake2b(repr(ranges.entries_inside(start - 1, size + 1)).encode(), digest_size=12).digest()

    return ImageFacts(thunks, entries_of(ranges), digest)


def thunks_of(vmlinux) -> tuple[int, int] | None:
    """A kernel's ``__indirect_thunk_start..end``, or None."""
    lo, hi = vmlinux.symbol_address("__indirect_thunk_start"), vmlinux.symbol_address("__indirect_thunk_end")
    return None if lo is None or hi is None else (lo, hi)


def facts_of(image, sites: bool, kernels: dict) -> ImageFacts:
    """``image_facts`` of an image as the audit reads it: a module's thunk range is its vmlinux's (loaded from the
    module's source, kept in ``kernels`` by identity)."""
    source = getattr(image, "source", None)
    thunks = None
    if source is not None and source.kind == "module" and source.kernel is not None:
        kernel = kernels.get(source.kernel.identity)
        if kernel is None:
            kernel = kernels[source.kernel.identity] = load_source(source.kernel)
        thunks = thunks_of(kernel)
    return image_facts(image, sites, thunks)


@dataclass(frozen=True)
class Tallied:
    """A per-function model's outcomes of consecutive functions of a chunk, as the parent would tally them: outcomes
    remembered before the worker started, which the parent has too (``tally``, the adds in order)."""

    model: int  # its index in the plan's ``per_function``
    tally: Tally


@dataclass(frozen=True)
class Judged:
    """A per-function model's outcomes of one function, for the parent to resolve: the function and its outcomes'
    key (``Auditor.function_key``); the outcomes the worker judged (kind, verdict, reason, method, group), each
    group's first detail, and what its ``Auditor.verdict`` calls found (``Told``), in order; all three None when
    the worker had remembered them from an earlier function of its own (the parent has them then)."""

    model: int
    k: bytes
    function: StoredFunction
    rows: tuple | None
    details: dict | None
    told: tuple | None


@dataclass(frozen=True)
class AuditChunk:
    """What a worker found in consecutive functions: how many functions and instructions, their cases (as
    ``add_cases`` grouped them, in order), the walks it made ((spec, key, offsets not reached)), and its per-function
    models' outcomes (``Tallied`` and ``Judged``, in function order)."""

    functions: int
    instructions: int
    cases: dict
    walks: tuple
    steps: tuple


class WorkerAudit:
    """A worker's side of the audit pass, kept from chunk to chunk and image to image: its auditor, the keys of the
    per-function outcomes it judged itself, and the facts of the image it is on."""

    def __init__(self, auditor: Auditor, plan: AuditPlan, sites: bool):
        self.auditor, self.plan, self.sites = auditor, plan, sites
        self.km = KeyMaker(auditor.tramp)
        self.own: dict[str, set[bytes]] = {m.name: set() for m in plan.per_function}
        self._facts: dict[str, ImageFacts] = {}
        self._kernels: dict = {}

    def facts(self, image) -> ImageFacts:
        if not self.plan.per_function:
            return ImageFacts()
        found = self._facts.get(image.identity)
        if found is None:
            self._facts = {image.identity: facts_of(image, self.sites, self._kernels)}  # the image it is on, alone
            found = self._facts[image.identity]
        return found

    def chunk(self, image, functions) -> AuditChunk:
        a, plan = self.auditor, self.plan
        facts = self.facts(image)
        cases: dict = {}
        steps: list = []
        tallying: dict[int, Tally] = {}  # per-function model -> the tally its next outcomes go on
        a.walked = walked = []
        n = rows = 0
        try:
            for f in functions:
                off_walk = walks_of(a, plan, f.data, f.start, f.rows)
                if plan.per_function:
                    masks = masks_of(f.rows)
                    for i, m in enumerate(plan.per_function):
                        self._function(i, m, f, masks, plan.gaps(m, off_walk), facts, steps, tallying)
                add_cases(cases, self.km, plan, off_walk, f.start, f.name, f.data, f.rows)
                n, rows = n + 1, rows + len(f.rows)
        finally:
            a.walked = None
        return AuditChunk(n, rows, cases, tuple(walked), tuple(steps))

    def _function(self, i: int, m, f: StoredFunction, masks: dict, gaps: frozenset[int], facts: ImageFacts,
                  steps: list, tallying: dict[int, Tally]) -> None:
        a = self.auditor
        k = a.function_key(m, f.data, f.start, f.rows, masks, gaps, facts)
        if k not in self.own[m.name]:
            memo = a.outcomes[m.name]
            found = memo.get(k)
            if found is not None:  # remembered before this worker started: the parent has the same outcomes
                tally = tallying.get(i)
                if tally is None:
                    tally = tallying[i] = Tally()
                    steps.append(Tallied(i, tally))
                tally.add_remembered(found, memo.get(b"details", {}), f.start, f.name, f.data, f.rows)
                return
            a.trace = told = []
            try:
                out = a.judge_function(m, f.data, f.start, f.name, f.rows, masks, gaps, facts)
            finally:
                a.trace = None
            a.remember_function(m, k, out)
            self.own[m.name].add(k)
            details: dict[str, str] = {}
            for o in out:
                details.setdefault(o.group, o.detail)
            steps.append(Judged(i, k, f, tuple(o.row()[:5] for o in out), details, tuple(told)))
        else:
            steps.append(Judged(i, k, f, None, None, None))
        tallying.pop(i, None)  # this model's later outcomes go on after this step


_MISSING = object()


def replayed(a: Auditor, told: tuple[Told, ...]) -> bool:
    """A worker's ``Auditor.verdict`` calls for one function, in order, as ``a`` answers them now: counted and
    filed as they would have been here, and True, when every answer is the worker's; else nothing of them is
    kept (counts and filings undone) and False."""
    undo: list[tuple[dict, object, object]] = []
    counts = dict(a.counts)

    def put(d: dict, key, value) -> None:
        undo.append((d, key, d.get(key, _MISSING)))
        d[key] = value

    for t in told:
        if not _replay(a, t, put):
            for d, key, old in reversed(undo):
                if old is _MISSING:
                    del d[key]
                else:
                    d[key] = old
            a.counts.update(counts)
            return False
    return True


def _replay(a: Auditor, t: Told, put) -> bool:
    """One ``Auditor.verdict`` call as ``a`` answers it now (its lookups in the same order): whether the answer
    is the one the worker had."""
    hit = a.proof_hit(t.key)
    if hit is not None:
        a.counts["proofs_shared"] += 1
        return _same((hit.verdict, hit.reason, hit.method, None), t.value)
    if t.source == "proof":  # the worker had a proof ``a`` has not: it knew more than ``a`` knows
        return False
    seen = None if t.same is None else a.verdicts.get(t.same)
    if seen is not None:
        a.counts["proofs_shared"] += 1
        return _same(unfiled(seen), t.value)
    if t.source != "made":
        return False
    if t.pieces is not None:
        new = 0
        for key, ok in t.pieces:
            have = a.pieces.get(key)
            if have is None:
                put(a.pieces, key, ok)
                new += 1
            elif have != ok:
                return False
        a.counts["pieces_proved"] += new
    if t.composed:
        a.counts["blocks_composed"] += 1
    else:
        a.counts["proofs_made"] += 1
        a.counts["cpu_replays"] += int(t.replayed)
    if t.proof is not None:
        put(a.new_proofs, t.key, t.proof)
    if t.filed is not None:
        put(a.verdicts, t.same, t.filed)
    return True


def _same(mine: tuple, theirs: tuple) -> bool:
    """Two answers (verdict, reason, method, counterexample) alike, the counterexample as JSON holds it."""
    return mine[:3] == theirs[:3] and json.dumps(mine[3]) == json.dumps(theirs[3])


class AuditMerge(StoredMerge):
    """The parent's side for one image: the chunks in function order, then the judging and the summary."""

    def __init__(self, owner: AuditPass, image):
        self.owner, self.auditor, self.plan, self.image = owner, owner.auditor, owner.plan, image
        self.t0 = time.monotonic()
        self.tallies = {m.name: Tally() for m in self.auditor.models}
        self.cases: dict = {}
        self.functions = self.total = 0
        self._facts: ImageFacts | None = None

    def add(self, value: AuditChunk) -> None:
        a = self.auditor
        for spec, k, hit in value.walks:
            a.learn_walk(spec, k, hit)
        for step in value.steps:
            m = self.plan.per_function[step.model]
            if isinstance(step, Tallied):
                self.tallies[m.name].merge(step.tally)
            else:
                f = step.function
                add_rows(self.tallies[m.name], self._resolved(m, step), f.start, f.name, f.data, f.rows)
        merge_cases(self.cases, value.cases)
        self.functions += value.functions
        self.total += value.instructions

    def _resolved(self, m, step: Judged) -> list[TracerOutcome]:
        """One function's outcomes of model ``m`` as one process would have them here (the module's doc)."""
        a, f = self.auditor, step.function
        outs = a.remembered(m, step.k)
        if outs is not None:
            return outs
        if step.rows is not None and replayed(a, step.told):
            return a.remember_function(m, step.k, [TracerOutcome(*r, step.details[r[4]]) for r in step.rows])
        self.owner.judged_here += 1
        gaps = self.plan.gaps(m, walks_of(a, self.plan, f.data, f.start, f.rows))
        return a.function_outcomes(m, f.data, f.start, f.name, f.rows, masks_of(f.rows), gaps, self._image_facts())

    def _image_facts(self) -> ImageFacts:
        if self._facts is None:
            self._facts = facts_of(self.image, self.owner.sites, {})
        return self._facts

    def section(self) -> dict:
        t1 = time.monotonic()
        judge_cases(self.auditor, self.plan, self.cases, self.tallies, self.owner.say_for(self.image))
        return image_summary(self.auditor, self.total, self.functions, self.cases, self.tallies, (self.t0, t1))


class AuditPass(StoredPass):
    """The audit of each image a run verifies, by ``auditor`` (the request's, in the parent), its section of the
    run's summary ``stored_passes["audit"]`` (``audit.audit_store``'s summary).  ``sites``: the run's kernel sites
    (the image facts' site tables); ``cache_dir``: where a worker not forked from the parent reads the auditor's
    memos; ``say``: the judging's progress (a kernel's, not a module's).  ``judged_here``: the functions the parent
    judged again (the module's doc), in the parent's copy."""

    name = "audit"

    def __init__(self, auditor: Auditor, sites: bool, cache_dir: str | None, say=None):
        self.auditor, self.say = auditor, say
        self.plan = AuditPlan.of(auditor.models)
        self.sites, self.cache_dir = sites, cache_dir
        self.tramp, self.timeout_s, self.rules = auditor.tramp, auditor.timeout_s, auditor.rules
        self.parent = os.getpid()
        self.judged_here = 0

    def __getstate__(self) -> dict:
        """What a worker is sent: no auditor (it holds the parent's connections and memos), no progress, and of the
        models only those a worker asks (per-function models, those that read past an instruction)."""
        state = dict(self.__dict__)
        plan = self.plan
        state.update(auditor=None, say=None, plan=AuditPlan(plan.per_function, (), plan.walkers, plan.readers))
        return state

    def start(self) -> WorkerAudit:
        if self.auditor is not None and os.getpid() != self.parent:
            auditor = self.auditor  # a forked worker: the parent's auditor as it was at the fork, its own copy
        else:  # in the parent (one worker, in process) or sent the pass: the memos read from the cache directory
            auditor = Auditor(list(self.plan.per_function), self.tramp, self.timeout_s, self.cache_dir, self.rules)
            auditor.cache.close()
            auditor.proofs = {}  # the cache may hold proofs made since the parent read it, which the parent lacks
        return WorkerAudit(auditor, AuditPlan(self.plan.per_function, (), self.plan.walkers, self.plan.readers),
                           self.sites)

    def chunk(self, state: WorkerAudit, image, functions) -> AuditChunk:
        return state.chunk(image, functions)

    def merger(self, image, image_id: int) -> AuditMerge:
        return AuditMerge(self, image)

    def say_for(self, image):
        source = getattr(image, "source", None)
        return None if source is not None and source.kind == "module" else self.say


__all__ = ["AuditChunk", "AuditMerge", "AuditPass", "Judged", "Tallied", "WorkerAudit", "facts_of", "image_facts",
           "replayed", "thunks_of"]
