"""Verify every instruction of a kernel image: one verdict each, totals that add up.

image -> functions -> instructions -> plan -> proof -> store -> summary, in
three phases on a pool of workers (``schedule``) that keep what they learn
for the whole run (``worker``):

1. survey: every instruction gets an instance key (``keys``); the keys the
   persistent proof cache does not know are collected, one representative each;
2. proofs: each unknown key's representative is decoded, planned and
   proved once, on whichever worker is free; each worker is then sent the
   findings of its functions' keys that the other workers made, and the
   proof cache is written by a thread of the parent's (``Behind``) while
   the rows are made;
3. rows: every function is walked again on the worker that surveyed it; each
   instruction takes its key's finding (instances whose key cannot stand for
   them are proved one by one), kernel sites and their variants are applied,
   and whole functions are written to the store.  Then every alternative's
   replacement is verified at its live address.

Functions already stored under the same configuration (trampoline, tool
versions, sites) are skipped, so a rerun resumes where a run stopped.  A
solver timeout, a hang or a crashing worker makes the instructions
concerned ``unknown`` with the reason, and the run goes on.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from ..collector import paused
from ..errors import ImageError
from ..image.functions import Function, find_functions, iter_instruction_spans
from ..image.image import Image
from ..plan.policy import POLICIES
from ..proof.cache_key import cache_tag
from ..proof.verdict import Finding, Verdict
from ..store.cache import CachedFinding, ProofCache, merge_jump_entries
from ..store.forking import sqlite_work
from ..store.jump_rows import pack_jump_row
from ..store.shard import leftover_shards
from ..store.store import Store
from ..versions import tool_versions
from ..schedule.local_pool import LocalPool, Task
from ..schedule.progress import Progress
from ..schedule.smt_helper import SmtHelper
from .keys import KeyMaker
from .pipeline import WATCHDOG_MARGIN_S
from .site_memo import found_sites, kept_sites, site_data
from .worker_kind import ENGINE_WORKERS
from .summary import render_summary, replacement_summary, summarize
from .worker import Job, Learned, Worker

CHUNK_FUNCTIONS = 64
PROVE_CHUNK = 256
REPLACEMENT_CHUNK = 256
#: The rows phase's shards are closed and merged into the store (``Store.merge_shards_behind``) this many
#: times, the last at the phase's end, so that most of the merging runs beside the workers rather than after
#: them.  Any number >= 1 gives the same store; more rounds mean smaller merges, each with its own
#: transaction (docs/performance.md has the measurements).
ROWS_ROUNDS = 4


@dataclass(frozen=True)
class RunOptions:
    tramp: int
    jobs: int
    timeout_s: float
    limit: int | None = None
    with_sites: bool = True
    cache_dir: str | None = None  # None: no persistent proof cache
    policy: str = "kernel"  # plan.policy.POLICIES: "kernel", or "user" for user-space ELF
    scheduler: str | None = None  # a Dask scheduler's address: run the tasks on its cluster
    dask_local: int | None = None  # run the tasks on a Dask LocalCluster of this many worker processes
    jump_probes: bool = False  # also answer, per instruction, whether a jump probe can sit there
    reuse_rows: bool = True  # copy functions' rows the proof cache keeps (``row_memo``), and keep new ones
    passes: tuple = ()  # passes over every function after the verdicts (``engine.passes.FunctionPass``)


class Session:
    """What consecutive runs share (``relocverify package``: a vmlinux and a thousand modules into
    one store): one pool of workers, which keep what they learn from image to image (instance
    keys, findings, the proof cache's full-key proofs, read once per worker), and the persistent
    cache's findings, read once.  ``run`` makes a session of its own when given none."""

    def __init__(self, options: RunOptions):
        self.options = options
        self.pool = None
        self.cache: ProofCache | None = None
        self.cached: dict[bytes, CachedFinding] = {}
        self.smt: SmtHelper | None = None

    def start_smt_helper(self, tag: bytes, first: Callable[[], bytes] | None = None) -> bool:
        """Start the session's SMT helper (``smt_helper``) when its first image is proved cold by a local pool:
        the helper imports the SMT check on the second core while this process finds functions and sites, and
        the workers never import it.  A warm cache leaves few proofs to make (a worker that needs the check
        imports it), and the jump probes' block proofs import it in every worker anyway.  ``first``: work the
        helper does before that import (``SmtHelper.first_value``).  Whether it started one, and so does ``first``."""
        o = self.options
        if self.smt is not None or o.jobs <= 1 or o.scheduler is not None or o.dask_local is not None \
                or o.jump_probes or self.findings(tag)[1]:
            return False
        self.smt = SmtHelper(WATCHDOG_MARGIN_S, first)
        return True

    def findings(self, tag: bytes) -> tuple[ProofCache, dict[bytes, CachedFinding]]:
        if self.cache is None:
            self.cache = ProofCache(self.options.cache_dir)
            self.cached = self.cache.findings(tag)
        return self.cache, self.cached

    def pool_for(self, job: Job):
        if self.pool is None:
            self.pool = make_pool(job, self.options, self.smt)
        else:
            self.pool.set_job(job)
        return self.pool

    def fresh_workers(self) -> None:
        """Let the next image start on new workers.  What the workers learned is in the session's
        findings already (each run harvests it), and new workers are forked with them; what goes is the
        memory a whole kernel's proofs left behind in each worker (solver and lifter caches, freed
        blocks the allocator keeps), which bounds a package run's peak memory (docs/performance.md)."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def stop(self) -> None:
        """A run's session, its work done: its local workers told to end and not waited for (``close`` waits),
        so they tear down while the run makes its summary."""
        if self.pool is not None:
            self.pool.stop()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.smt is not None:
            self.smt.close()
            self.smt = None
        if self.cache is not None:
            self.cache.close()
            self.cache = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def make_pool(job: Job, options: RunOptions, smt: SmtHelper | None = None):
    """The run's executor: the local process pool (the default), or a Dask cluster; its workers send their SMT
    checks to ``smt`` when given (forked once it listens)."""
    if options.scheduler is not None or options.dask_local is not None:
        from ..schedule.dask_pool import DaskPool

        return DaskPool(ENGINE_WORKERS, job, scheduler=options.scheduler, local_workers=options.dask_local)
    if smt is not None:
        from ..proof import prove  # noqa: F401 - the proofs' own modules, shared by the workers (not the SMT check)

        smt.wait_listening()
    elif options.jobs > 1 and not job.cached:
        # A cold cache: some proof will need the solver path (claripy, angr's IR operations, z3).  Imported once
        # here, before the fork, rather than by each worker, so that its pages are shared between them (the
        # peak memory's share is in docs/performance.md); not imported, the workers import it when needed.
        from ..proof import smt_check  # noqa: F401
    return LocalPool(ENGINE_WORKERS, job, options.jobs, smt.address if smt is not None else None)


def _chunks(items: list, n: int) -> list[list]:
    return [items[i:i + n] for i in range(0, len(items), n)]


def overlaps(image: Image, functions: list[tuple[int, Function]]) -> dict[int, frozenset[int]]:
    """function id -> the addresses of its instructions that an earlier overlapping
    function (by start) also decodes and owns, so that each gets one verdict."""
    skip: dict[int, set[int]] = {}
    prev: tuple[int, Function] | None = None
    for fid, f in sorted(functions, key=lambda p: (p[1].start, p[1].end)):
        if prev is not None and f.start < prev[1].end:
            theirs = {a for a, _ in iter_instruction_spans(image, prev[1])} - skip.get(prev[0], set())
            shared = {a for a, _ in iter_instruction_spans(image, f)} & theirs
            if shared:
                skip.setdefault(fid, set()).update(shared)
        if prev is None or f.end > prev[1].end:
            prev = (fid, f)
    return {fid: frozenset(a) for fid, a in skip.items()}


@dataclass(frozen=True)
class Scope:
    """What a run does for an image, as its store says when the run starts: the image's id and
    description, its functions by id, the configuration's id, the functions stored under the same
    configuration before (``done``) or under another one (``stale``), those to verify (``todo``, by
    address), the summary of the last run with the same scope when nothing is left to do, and this
    run's id."""

    image_id: int
    info: dict
    functions: dict[int, Function]
    config_id: int
    done: frozenset[int]
    stale: frozenset[int]
    todo: tuple[int, ...]
    previous: dict | None
    run_id: int


@dataclass(frozen=True)
class PhaseCounts:
    """What the survey, proofs and rows phases did: the instructions of the functions they walked, the
    distinct instance keys (``keys``), of which the persistent cache knew ``cached`` and ``proved`` were
    proved now, and the rows written; ``reused`` functions' rows were copied from the cache
    (``row_memo``), their instance keys not counted (they were not made)."""

    instructions: int = 0
    keys: int = 0
    cached: int = 0
    proved: int = 0
    rows: int = 0
    reused: int = 0


@dataclass(frozen=True)
class Verification:
    """What the workers did for an image: the instructions of every function in scope (verified now, or
    stored by an earlier run), the phases' counts, the alternative replacements' summary (None: no
    sites), the block proofs the jump-probe phase made (None: not asked) and the range rules it did not
    check (``PatchRanges.unchecked``)."""

    expected: int
    counts: PhaseCounts
    alternatives: dict | None = None
    jump_proofs: int | None = None
    unchecked: tuple[str, ...] = ()
    passes: dict | None = None  # pass name -> its section of the summary (None: no passes asked)


def run(image: Image, store_path: str, options: RunOptions, progress: Progress | None = None,
        session: Session | None = None) -> dict:
    """Verify every instruction of ``image`` (its first ``limit`` functions) into the store at
    ``store_path``, on ``session``'s workers if given (else on a pool of its own); returns the summary
    (``summary.summarize``, with the run's section), as the store records it."""
    progress = progress or Progress(enabled=False)
    t0 = time.monotonic()
    phases: dict[str, float] = {}
    rules = POLICIES[options.policy]
    tag = cache_tag(rules)
    config = _config(options, tag)
    previous = None if options.jump_probes else _again(image.identity, store_path, config, options, t0)
    if previous is not None:
        return previous
    own = session is None
    if own:
        session = Session(options)
    try:
        store, scope, functions, sites, versions = _set_up(image, store_path, options, session, tag, config)
    except BaseException:
        if own:
            session.close()
        raise
    try:
        phases["setup_s"] = time.monotonic() - t0
        work = _verify(image, store, scope, functions, sites, options, session, own, tag, config, rules, progress,
                       phases)
    except BaseException as exc:
        if own:
            session.close()
        store.finish_run(scope.run_id, "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed", None)
        store.close()
        raise
    try:
        with paused():
            summary = _summary(store, image, scope, len(functions), sites, work, options.jump_probes, phases)
        _add_run_section(summary, scope, work, phases, versions, time.monotonic() - t0)
        store.finish_run(scope.run_id, "complete", summary)
    finally:
        store.close()
        if own:
            session.close()  # its workers were told to end when the phases did (``Session.stop``)
    return summary


def _set_up(image: Image, store_path: str, options: RunOptions, session: Session, tag: bytes, config: str):
    """(the store, open; the run's ``Scope``; the functions; the sites; the tools' versions).  A cold run's SMT
    helper imports the SMT check on the second core while this process sets up; first, it finds the sites the
    cache does not keep, while this process finds the functions and adds them to the store."""
    sites = site_cache = None
    missing = False
    if options.with_sites:  # a session's images share its open cache (a package: a thousand modules)
        cache = session.findings(tag)[0]
        site_cache = cache if cache.enabled else None
        with paused():  # many objects, no reference cycles
            sites = kept_sites(image, site_cache)
        missing = sites is None
    helped = session.start_smt_helper(tag, partial(site_data, image) if missing else None)
    with paused():  # functions, sites and the store's function rows: many objects, no reference cycles
        functions = find_functions(image)
        if not functions:
            raise ImageError(f"{image.path}: no functions found: its code sections hold no function symbols; "
                             f"pass the build's System.map (--system-map) or an unstripped vmlinux")
        if options.limit is not None:
            functions = functions[:options.limit]
        versions = tool_versions()
        store = Store(store_path)
        try:
            scope = _scope(store, image, functions, config, versions, options.limit)
            if missing:
                sites = found_sites(image, site_cache, session.smt.first_value() if helped else None)
        except BaseException:
            store.close()
            raise
    return store, scope, functions, sites, versions


def _add_run_section(summary: dict, scope: Scope, work: Verification, phases: dict[str, float], versions: dict,
                     wall: float) -> None:
    """The summary's ``run`` section (what this run did, its phases' seconds), its wall time and speed."""
    summary["run"] = {"id": scope.run_id, "status": "complete", "verified_now": work.counts.rows,
                      "resumed": len(scope.done),
                      "proof_cache": {"keys": work.counts.keys, "cached": work.counts.cached,
                                      "proved": work.counts.proved, "functions_reused": work.counts.reused},
                      "phases": {k: round(v, 3) for k, v in phases.items()}, "versions": versions}
    summary["wall_s"] = round(wall, 3)
    summary["instructions_per_s"] = round(work.counts.rows / wall, 1) if wall > 0 else None


def _scope(store: Store, image: Image, functions: list[Function], config: str, versions: dict,
           limit: int | None) -> Scope:
    """The store made ready for a run of ``image``: runs a killed process left marked abandoned, the
    functions it finished merged in, the image and its functions added; the run started."""
    store.mark_abandoned_runs()
    store.merge_shards(leftover_shards(store.path))  # functions a killed run finished are kept
    info = {"path": image.path, "format": image.format, "compression": image.compression,
            "symbols": image.symbol_source, "sections": [s.name for s in image.iter_executable_sections()],
            "notes": list(image.notes)}
    image_id = store.image_id(image.identity, image.path, image.format, image.symbol_source, info)
    ids = store.add_functions(image_id, _with_bytes(image, functions))
    by_id = {ids[(f.start, f.name)]: f for f in functions}
    config_id = store.config_id(config)
    # a function whose stored findings were altered since they were sealed is verified again, never resumed
    done = frozenset(store.verified_functions(image_id, config) & set(by_id)) - store.altered_functions(image_id)
    stale = frozenset(store.stale_functions(image_id, config))
    todo = tuple(fid for fid, f in sorted(by_id.items(), key=lambda p: (p[1].start, p[1].name)) if fid not in done)
    previous = None if todo else store.last_summary(image_id, config, limit)
    run_id = store.start_run(image_id, config, versions, limit)
    return Scope(image_id, info, by_id, config_id, done, stale, todo, previous, run_id)


def _verify(image: Image, store: Store, scope: Scope, functions: list[Function], sites, options: RunOptions,
            session: Session, own: bool, tag: bytes, config: str, rules, progress: Progress,
            phases: dict[str, float]) -> Verification:
    """The phases on ``session``'s pool over the functions to do: survey, proofs and rows; the counts of those
    done before; the alternatives' replacements; the jump probes.  ``own``: the run's own session, whose
    workers are told to end here (``Session.stop``) and which ``run`` closes."""
    t0 = time.monotonic()
    cache, cached = session.findings(tag)
    skip = overlaps(image, list(scope.functions.items()))
    ranges = None
    if options.jump_probes:
        from .jumps import patch_ranges

        ranges = patch_ranges(image, functions, sites, options.policy)
    job = Job(image, scope.functions, options.tramp, options.timeout_s, sites, cached, options.cache_dir, tag,
              store.path, scope.config_id, store.outcome_ids_now(), skip, scope.stale, rules, ranges,
              options.reuse_rows, options.passes)
    pool = session.pool_for(job)
    phases["setup_s"] = phases.get("setup_s", 0.0) + time.monotonic() - t0  # the overlaps, the job, the pool
    counts = Phases(pool, job, store, cache, tag, config, progress, phases).run(list(scope.todo))
    expected = counts.instructions + _count_done(pool, job, sorted(scope.done))
    alternatives = jump_proofs = None
    if sites is not None:
        t1 = time.monotonic()
        alternatives = _replacements(pool, job, store, scope.image_id, progress)
        phases["replacements_s"] = time.monotonic() - t1
    passes = None
    if options.passes:
        t1 = time.monotonic()
        passes = {p.name: _run_pass(pool, store, scope.image_id, k, p, progress) for k, p in enumerate(options.passes)}
        phases["passes_s"] = time.monotonic() - t1
    if options.jump_probes:
        t1 = time.monotonic()
        if own:  # the block proofs need nothing the workers learned: new ones start without its memory
            _harvest(pool, cache, tag, cached)
            session.fresh_workers()
            pool = session.pool_for(job)
        jump_proofs = _jump_probes(pool, store, scope.image_id, progress)
        phases["jump_probes_s"] = time.monotonic() - t1
    _harvest(pool, cache, tag, cached)
    if own:
        session.stop()
    unchecked = tuple(ranges.unchecked) if ranges is not None else ()
    return Verification(expected, counts, alternatives, jump_proofs, unchecked, passes)


def _summary(store: Store, image: Image, scope: Scope, functions: int, sites, work: Verification,
             jump_probes: bool, phases: dict[str, float]) -> dict:
    """The image's summary from the store (the last run's, when this one verified nothing), with the
    alternative replacements' and, when asked for, the jump probes' sections."""
    t1 = time.monotonic()
    alternatives = work.alternatives
    if scope.previous is not None and scope.previous.get("functions") == functions:
        summary = scope.previous  # nothing was verified: every stored row is as that run left it
        alternatives = scope.previous.get("alternative_replacements")
    else:
        summary = summarize(store, scope.image_id, scope.info | {"identity": image.identity}, functions,
                            work.expected, sites)
    phases["summary_s"] = time.monotonic() - t1
    if alternatives is not None:
        summary["alternative_replacements"] = alternatives
    if work.passes is not None:
        summary["passes"] = work.passes
    if jump_probes:
        summary["jump_probe"] = jump_summary(store, scope.image_id, summary["instructions"], work.jump_proofs,
                                             work.unchecked)
    return summary


def _config(options: RunOptions, tag: bytes) -> str:
    """The configuration a run's rows are stored under: the trampoline, the cache tag, sites, the policy."""
    config = {"tramp": options.tramp, "tag": tag.hex(), "sites": options.with_sites, "policy": options.policy}
    if options.passes:  # a run with passes is not answered by one without them
        config["passes"] = [p.name for p in options.passes]
    return json.dumps(config, sort_keys=True)


def again(identity: str, store_path: str, options: RunOptions) -> dict | None:
    """``run``'s answer to the same command again, for the image whose identity is ``identity``, without
    the image: the summary when the store holds a complete run of it under the same configuration and
    scope (recorded as a new run), else None (then ``run`` has work to do).  What lets a repeated
    ``vmlinux`` command skip loading the image (``image.loader.remembered_identity``)."""
    if options.jump_probes:
        return None
    return _again(identity, store_path, _config(options, cache_tag(POLICIES[options.policy])), options,
                  time.monotonic())


def _again(identity: str, store_path: str, config: str, options: RunOptions, t0: float) -> dict | None:
    """The same command again: when the store holds a complete run of this image under this
    configuration and scope, and every function of the image is stored under it, that run's
    summary is the answer (recorded as a new run), without finding functions or sites."""
    import os

    if not os.path.exists(store_path):
        return None
    store = Store(store_path)
    try:
        store.mark_abandoned_runs()
        image_id = store.find_image(identity)
        if image_id is None or not store.all_verified(image_id, config) or store.altered_functions(image_id):
            return None  # altered findings (``store.row_seals``) are verified again, not repeated
        previous = store.last_summary(image_id, config, options.limit)
        if previous is None:
            return None
        run_id = store.start_run(image_id, config, tool_versions(), options.limit)
        summary = dict(previous)
        wall = time.monotonic() - t0
        summary["run"] = {"id": run_id, "status": "complete", "verified_now": 0,
                          "resumed": summary.get("functions_verified", 0), "again": previous["run"]["id"],
                          "proof_cache": {"keys": 0, "cached": 0, "proved": 0},
                          "phases": {"setup_s": round(wall, 3)}, "versions": tool_versions()}
        summary["wall_s"] = round(wall, 3)
        summary["instructions_per_s"] = 0.0
        store.finish_run(run_id, "complete", summary)
        return summary
    finally:
        store.close()


def _bytes_of(image: Image, f: Function) -> bytes:
    section = image.get_section(f.section)
    if section is None or not section.contains(f.start, f.size) or not section.data:
        return b""
    return section.data[f.start - section.address:f.start - section.address + f.size]


def _with_bytes(image: Image, functions: list[Function]):
    """(start, size, name, section, bytes) of each function, as ``_bytes_of`` reads them, each section
    looked up once."""
    sections: dict[str, tuple[int, int, bytes]] = {}
    for f in functions:
        got = sections.get(f.section)
        if got is None:
            section = image.get_section(f.section)
            got = sections[f.section] = (0, -1, b"") if section is None or not section.data else (
                section.address, section.address + section.size, section.data)
        base, end, data = got
        size = f.end - f.start
        yield (f.start, size, f.name, f.section,
               data[f.start - base:f.end - base] if base <= f.start and f.end <= end else b"")


class Phases:
    """Survey, proofs and rows over the functions to do, on one pool, and what they hand each other.

    survey   each worker walks its functions, makes every instruction's instance key and keeps the keys
             it cannot answer (``owned``: key -> its first instance), the cache's hits, and the functions
             it can write at once; it writes those (``rows``, ``reused``);
    proofs   every unknown key's representative (the first instance over all workers) is proved once, on
             whichever worker is free (``learned``);
    rows     each worker is sent the findings of its keys that other workers made (``outbox``) and writes
             its other functions' rows; a round's shards go into the store while the workers go on.

    A worker that dies is handled by the phase's ``crashed_*``: what it finished stays, the function or key in
    hand is stored as crashed, and the rest goes again; the rows a dead worker's replacement cannot write
    are written in this process by a fallback worker.  Shards are merged at each phase's end (``merge``)."""

    def __init__(self, pool: LocalPool, job: Job, store: Store, cache: ProofCache, tag: bytes, config: str,
                 progress: Progress, phases: dict):
        """``config``: the configuration's text the run's rows are stored under (``_config``); ``phases``: each
        phase's seconds are added to it."""
        self.pool, self.job, self.store, self.cache, self.tag, self.config = pool, job, store, cache, tag, config
        self.progress, self.phases = progress, phases
        self.fallback: list[Worker] = []
        self.total = 0  # instructions of the functions walked
        self.rows = self.reused = 0
        self.merged: dict[int, int] = {}  # provisional outcome id -> store id, of merges since the last ``merge``
        self.owned: list[dict] = [{} for _ in range(pool.n)]
        self.hits: set[bytes] = set()
        self.waiting: list[list[int]] = [[] for _ in range(pool.n)]
        self.learned: dict[bytes, Learned] = {}
        self.outbox: list[dict[bytes, Learned]] = [{} for _ in range(pool.n)]
        self.traced = True

    def run(self, todo: list[int]) -> PhaseCounts:
        if not todo:
            return PhaseCounts()
        self.survey(todo)
        misses = self.misses()
        self.prove(misses)
        self.write_rows()
        return PhaseCounts(self.total, len(misses) + len(self.hits), len(self.hits), len(misses), self.rows,
                           self.reused)

    def merge(self) -> None:
        """At the end of a phase: every worker's shard into the store, and the store's ids of the
        provisional outcome ids to every worker."""
        paths = self.pool.close_shards() + [w.close_shard() for w in self.fallback]
        final = self.merged | self.store.merge_shards([p for p in paths if p] + leftover_shards(self.job.store_path))
        self.merged.clear()
        if final:
            self.pool.broadcast("learn_ids", lambda w: (final,))
            self.pool.remember("learn_ids", (final,))
            for w in self.fallback:
                w.learn_ids(final)

    def crashed_function(self, task, at, pid):
        """A worker died on function ``task.args[0][at]``: it is stored as crashed, the dead worker's
        shard (whole functions it finished) is merged, and every function of the task not stored
        yet goes to a fresh worker."""
        fids = task.args[0]
        if not self.fallback:
            self.fallback.append(Worker(self.job))
        w = self.fallback[0]
        n = w.crashed(fids[at], "worker crashed while verifying this function")
        if task.method == "survey":
            self.total += n
        self.merged.update(self.store.merge_shards(leftover_shards(self.job.store_path, pid) + [w.close_shard()]))
        stored = self.store.verified_functions_among(fids, self.config)
        rest = [f for f in fids if f not in stored]
        return [Task(task.method, (rest,) + task.args[1:], task.tag)] if rest else []

    # -- survey --------------------------------------------------------------------
    def survey(self, todo: list[int]) -> None:
        pool, t1 = self.pool, time.monotonic()
        chunks = _chunks(todo, CHUNK_FUNCTIONS)
        gather = pool.pinned  # each worker keeps its keys until its surveys end (``Worker.survey``)
        queues = [[Task("survey", (c, gather), w) for c in chunks[w::pool.n]] for w in range(pool.n)]
        n_insns = sum(self.job.functions[f].size for f in todo)  # bytes: the survey's progress unit is instructions,
        estimate = max(1, n_insns // 4)                           # so the total is an estimate until it is done
        base = pool.items_done()
        self.progress.phase("survey", estimate, "instructions")
        pool.run(queues, self._surveyed, self.crashed_function,
                 tick=lambda: self.progress.update(min(estimate, pool.items_done() - base)))
        self.progress.total = self.total
        self.progress.end()
        if gather:
            pool.run([[Task("gathered", (), w)] for w in range(pool.n)],
                     lambda task, value: self.owned[task.tag].update(value))
        self.merge()
        self.phases["survey_s"] = time.monotonic() - t1

    def _surveyed(self, task, value) -> None:
        misses, n, known, later, written, reused = value
        self.owned[task.tag].update(misses)
        self.hits.update(known)
        self.waiting[task.tag].extend(later)
        self.total += n
        self.rows += written
        self.reused += reused

    def misses(self) -> dict[bytes, tuple[bytes, int]]:
        """Every key no worker could answer, with its representative: the first instance over all workers."""
        misses: dict[bytes, tuple[bytes, int]] = {}
        for owned in self.owned:
            for key, rep in owned.items():
                if key not in misses or rep[1] < misses[key][1]:
                    misses[key] = rep
        return misses

    # -- proofs --------------------------------------------------------------------
    def prove(self, misses: dict[bytes, tuple[bytes, int]]) -> None:
        """Each key's representative proved once.  In key order: a key begins with its kind and then the
        instruction's bytes, so neighbours share an opcode, and with it the decoders', libVEX's and the
        admission's paths (the order changes no finding).  What each worker will be sent (``_wanted``) is made
        as the findings come in; ``traced`` False (a worker died while proving: the fresh one lacks what the dead
        one proved; or a task came back without its worker's index): each worker is sent every finding of its
        keys instead."""
        pool, t1 = self.pool, time.monotonic()
        items = [(k, raw, a) for k, (raw, a) in sorted(misses.items())]
        base = pool.items_done()
        self.progress.phase("proofs", len(items), "distinct instance keys")
        pool.run([[Task("prove", (c,)) for c in _chunks(items, PROVE_CHUNK)]], self._proved, self._crashed_key,
                 tick=lambda: self.progress.update(pool.items_done() - base), shared=True)
        self.progress.end()
        self.phases["proofs_s"] = time.monotonic() - t1

    def _proved(self, task, value) -> None:
        self.learned.update(value)
        self.traced = self.traced and task.tag is not None
        if self.traced:
            for w in range(self.pool.n):
                if w != task.tag:
                    _wanted(value, self.owned[w], self.outbox[w])

    def _crashed_key(self, task, at, pid):
        key, raw, address = task.args[0][at]
        why = "worker crashed while proving this instruction"
        f = Finding(Verdict.UNKNOWN, why, "crash", "", "", "")
        self.learned[key] = Learned(CachedFinding(True, f.verdict.value, why, "crash"), address, f)
        self.traced = False
        rest = task.args[0][at + 1:]
        return [Task("prove", (rest,))] if rest else []

    def sent(self, w: int) -> dict[bytes, Learned]:
        """What worker ``w`` is sent before its rows: the findings of its keys that it did not make."""
        return self.outbox[w] if self.traced else _wanted(self.learned, self.owned[w])

    # -- rows ----------------------------------------------------------------------
    def write_rows(self) -> None:
        """Every waiting function's rows.  The proof cache is written behind (``Behind``) from the first result
        on, once every worker has its findings (every queue's first task), not before: the writing thread would
        slow the making of the messages."""
        pool, t1 = self.pool, time.monotonic()
        queues = self._rows_queues()
        self._closed: dict[int, list[str]] = {}
        self._arrived = [0] * self._rounds
        self._keeping: list[Behind | None] = []
        base = pool.items_done()
        self.progress.phase("rows", self.total - self.rows, "instructions")
        try:
            pool.run(queues, self._rows_done, self._crashed_row,
                     tick=lambda: self.progress.update(pool.items_done() - base))
        finally:
            self._keep_behind()
            if self._keeping[0] is not None:
                self._keeping[0].join()
        self.progress.end()
        self.merge()
        for w in self.fallback:
            w.close()
        self.phases["rows_s"] = time.monotonic() - t1

    def _rows_queues(self) -> list[list[Task]]:
        """Each worker's queue: its findings first (a pinned pool: as the first task, so one starts on its rows
        while the parent makes the other's message), then its rows tasks cut into rounds (``_in_rounds``)."""
        pool = self.pool
        if pool.pinned:
            queues = [[Task("accept", (), w, late=lambda w=w: (self.sent(w),))] for w in range(pool.n)]
        else:
            pool.broadcast("accept", lambda w: (self.sent(w),))
            queues = [[] for _ in range(pool.n)]
        pool.remember("accept", (self.learned,))  # a worker forked in a dead one's place is given every finding
        tasks = [[Task("rows", (c,), w) for c in _chunks(self.waiting[w], CHUNK_FUNCTIONS)] for w in range(pool.n)]
        # at most a round per task of the shortest queue: a package's modules, a task or two each, merge once
        self._rounds = max(1, min(ROWS_ROUNDS, *map(len, tasks))) if pool.pinned else 1
        for w in range(pool.n):
            queues[w] += _in_rounds(tasks[w], self._rounds, w)
        return queues

    def _keep_behind(self) -> None:
        if not self._keeping:
            self._keeping.append(_harvest(self.pool, self.cache, self.tag, self.job.cached, behind=True, ask=False))

    def _rows_done(self, task, value) -> None:
        self._keep_behind()  # every queue's first task, its findings, was sent before any result came back
        if task.method == "rows":
            self.rows += value
        elif task.method == "close_shard":  # a round's shards go into the store while the workers go on
            r = task.tag[1]
            if value:
                self._closed.setdefault(r, []).append(value)
            self._arrived[r] += 1
            if self._arrived[r] == self.pool.n and r in self._closed:
                self.store.merge_shards_behind(self._closed.pop(r))

    def _crashed_row(self, task, at, pid):
        if task.method == "accept":
            return []  # its replacement was given every finding (``remember``)
        if task.method == "close_shard":
            return []  # the dead worker's shards are merged with the phase's last (``leftover_shards``)
        return self.crashed_function(task, at, pid)


def _in_rounds(tasks: list[Task], rounds: int, w: int) -> list[Task]:
    """Worker ``w``'s rows tasks with a ``close_shard`` task (tagged (w, round)) after each of the first
    ``rounds - 1`` of ``rounds`` equal parts.  Every worker's queue is cut at the same fractions, so a round's
    shards hold neighbouring functions (the workers' chunks alternate), and the round's merge appends to the
    store's B-trees as one merge at the end did."""
    out: list[Task] = []
    n = len(tasks)
    cut = 0
    for r in range(1, rounds):
        end = n * r // rounds
        out += tasks[cut:end]
        out.append(Task("close_shard", (), (w, r - 1)))
        cut = end
    return out + tasks[cut:]


def _count_done(pool: LocalPool, job: Job, done: list[int]) -> int:
    """Instruction counts of functions stored by an earlier run (for the expected total)."""
    if not done:
        return 0
    n = [0]
    chunks = _chunks(done, CHUNK_FUNCTIONS * 4)
    pool.run([[Task("count", (c,)) for c in chunks[w::pool.n]] for w in range(pool.n)],
             lambda task, value: n.__setitem__(0, n[0] + value))
    return n[0]


def _replacements(pool: LocalPool, job: Job, store: Store, image_id: int, progress: Progress) -> dict:
    """Every alternative's replacement, verified instruction by instruction at its live address."""
    indexes = list(range(sum(1 for _ in job.sites.iter_sites("alternative"))))
    rows: list[tuple] = []
    chunks = _chunks(indexes, REPLACEMENT_CHUNK)
    progress.phase("replacements", len(indexes), "alternatives")
    pool.run([[Task("replacements", (c,)) for c in chunks[w::pool.n]] for w in range(pool.n)],
             lambda task, value: (rows.extend(value), progress.update(len({r[0] for r in rows}))))
    progress.end()
    store.write_replacements(image_id, rows)
    return replacement_summary(store.replacement_rows(image_id), len(indexes))


JUMP_CHUNK = 32
PASS_CHUNK = 64


def _run_pass(pool, store: Store, image_id: int, index: int, p, progress: Progress) -> dict:
    """Pass ``p`` (the job's ``index``-th) over the image's functions it has no rows for, its rows written as
    they come; a function a worker dies on gets no rows (a rerun tries it again).  Its section of the summary,
    from every stored row."""
    fids = store.functions_without_pass(image_id, p.name)
    chunks = _chunks(fids, PASS_CHUNK)

    def crashed(task, at, pid):
        rest = task.args[1][at + 1:]
        return [Task(task.method, (index, rest), task.tag)] if rest else []

    base = pool.items_done()
    progress.phase(p.name, len(fids), "functions")
    pool.run([[Task("pass_rows", (index, c), w) for c in chunks[w::pool.n]] for w in range(pool.n)],
             lambda task, value: store.write_pass_rows(p.name, value), crashed,
             tick=lambda: progress.update(pool.items_done() - base))
    progress.end()
    return p.summarize(p.row(*r) for r in store.iter_pass_rows(image_id, p.name))


def _jump_probes(pool, store: Store, image_id: int, progress: Progress) -> int:
    """Every stored function without jump-probe answers gets them; returns the block proofs made."""
    fids = store.functions_without_jump_probes(image_id)
    chunks = _chunks(fids, JUMP_CHUNK)
    made = [0]
    inboxes: list[dict] = [{} for _ in range(pool.n)]  # what each worker has not heard from the others

    def got(task, value):
        rows, examples, proofs, learned = value
        store.write_jump_probes(rows, examples)
        made[0] += proofs
        if learned:
            for w, inbox in enumerate(inboxes):
                if w != task.tag:
                    merge_jump_entries(inbox, learned)

    def news(w: int) -> tuple[dict]:
        inbox, inboxes[w] = inboxes[w], {}
        return (inbox,)

    def crashed(task, at, pid):
        """A worker died on function ``task.args[0][at]``: its instructions are refused as
        ``error:crashed`` (the int3 verdicts stand), and the task's other functions go again."""
        job = pool.job
        fid = task.args[0][at]
        fn = job.functions[fid]
        skip = job.skip.get(fid, ())
        row = pack_jump_row(fid, [(off, "error:crashed") for off, _, _ in KeyMaker(job.tramp).keys(
            _bytes_of(job.image, fn), fn.start) if fn.start + off not in skip])
        store.write_jump_probes([row], {"error:crashed": "the worker crashed while answering for this function"})
        rest = task.args[0][:at] + task.args[0][at + 1:]  # the task's answers die with the worker
        return [Task(task.method, (rest,), task.tag)] if rest else []

    base = pool.items_done()
    progress.phase("jump probes", sum(pool.job.functions[f].size for f in fids) // 4 or 1, "instructions")
    pool.run([[Task("jump_probes", (c,), w, partial(news, w)) for c in chunks[w::pool.n]] for w in range(pool.n)],
             got, crashed,
             tick=lambda: progress.update(pool.items_done() - base))
    progress.end()
    return made[0]


def jump_summary(store: Store, image_id: int, instructions: int, proofs: int | None,
                 unchecked: tuple[str, ...] = ()) -> dict:
    """The summary's ``jump_probe``: eligible, and refusals by bucket, adding up to the instructions;
    ``block_proofs``: the proofs the phase made (whole blocks, and the pieces of blocks composed from
    them: ``engine.jumps``); ``unchecked``: the range rules not asked of this image, with why
    (``PatchRanges.unchecked``)."""
    counts = store.jump_probe_counts(image_id)
    eligible = counts.pop("eligible", 0)
    out = {"eligible": eligible, "refused": counts, "instructions": instructions,
           "totals_add_up": eligible + sum(counts.values()) == instructions,
           "share": round(eligible / instructions, 4) if instructions else 0.0,
           "examples": {k: v for k, v in store.jump_probe_examples().items() if k in counts}}
    if proofs is not None:
        out["block_proofs"] = proofs
    if unchecked:
        out["unchecked"] = list(unchecked)
    return out


def _wanted(found: dict[bytes, Learned], owned: dict[bytes, tuple[bytes, int]],
            out: dict[bytes, Learned] | None = None) -> dict[bytes, Learned]:
    """The findings of ``found`` that a worker is sent, added to ``out``: those of the keys its functions hold
    (``owned``: its first instance of each key), the representative's own finding (its counterexample, its
    fresh mark) only when the representative is that instance, as no other instance is that one.  Sending a
    worker every finding would give the same rows, later (the messages are made between the phases)."""
    out = {} if out is None else out
    for k, hit in found.items():
        mine = owned.get(k)
        if mine is not None:
            out[k] = hit if hit.address == mine[1] else Learned(hit.cached)
    return out


def _harvest(pool: LocalPool, cache: ProofCache, tag: bytes, cached: dict, behind: bool = False,
             ask: bool = True) -> Behind | None:
    """Collect what the workers proved since the last harvest into the persistent cache (and into
    ``cached``, the session's copy, which a worker started later is given).  ``behind``: the cache is
    written by a thread of its own (``Behind``: join it), while the workers go on.  ``ask`` False: only what
    came back with the tasks' values (``LocalPool.harvested``: the proofs phase's), without a harvest task."""
    findings, proofs, derivations, jumps = pool.harvest() if ask else pool.harvested()
    cached.update(findings)

    def keep(into: ProofCache) -> None:
        into.add(tag, findings, proofs, derivations)
        for jtag, entries in jumps.items():
            into.add_jump_entries(jtag, entries)

    if not behind or not cache.enabled:
        keep(cache)
        return None
    return Behind(cache.directory, keep)


class Behind(threading.Thread):
    """Writes the proof cache on a connection of its own while the main thread waits on the workers
    (between the proofs and the rows, written in the main thread, its inserts kept both workers waiting);
    ``join`` raises what the writing raised."""

    def __init__(self, directory: str, keep: Callable[[ProofCache], None]):
        super().__init__(name="relocverify-harvest", daemon=True)
        self._directory, self._keep, self._error = directory, keep, None
        self.start()

    def run(self) -> None:
        try:
            with sqlite_work():  # no worker is forked meanwhile (``store.forking``)
                cache = ProofCache(self._directory)
                try:
                    self._keep(cache)
                finally:
                    cache.close()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread by join
            self._error = exc

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self._error is not None:
            error, self._error = self._error, None
            raise error


__all__ = ["RunOptions", "Session", "Scope", "PhaseCounts", "Verification", "make_pool", "run", "again",
           "render_summary", "overlaps", "jump_summary"]
