"""Verify every instruction of a kernel image: one verdict each, totals that add up.

image -> functions -> instructions -> plan -> proof -> store -> summary.  ``run`` sets up (the store, the
image's functions and sites, the run's ``Scope``), then runs the steps of ``PHASES`` that the options ask
for, each made of phases (``engine/phases``) that the scheduler drives on one pool of workers
(``schedule.phase.drive``), the workers keeping what they learn for the whole run (``worker``):

    verdicts      survey, proofs, rows: one verdict per instruction (``phases.board`` says what they share)
    replacements  every alternative's replacement, verified at its live address
    passes        analyses added from outside (``engine.passes``)
    stored_passes readings of the stored rows (``engine.passes.StoredPass``: the tracer audit)
    jump_probes   per instruction, whether a jump probe can sit there

and makes the summary from the store, with each stored pass's section added after the run is recorded (the
section is what this run's request read, not part of the run: the same command again, answered from the store
by ``again``, does not repeat it).  Functions already stored under the same configuration (trampoline,
tool versions, sites) are skipped, so a rerun resumes where a run stopped.  A solver timeout, a hang or a
crashing worker makes the instructions concerned ``unknown`` with the reason, and the run goes on.
"""

from __future__ import annotations

import json
import os
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
from ..store.cache import CachedFinding, ProofCache
from ..store.shard import leftover_shards
from ..store.store import Store
from ..versions import tool_versions
from ..schedule.dask_pool import DaskPool
from ..schedule.local_pool import LocalPool
from ..schedule.phase import drive
from ..schedule.progress import Progress
from ..schedule.smt_helper import SmtHelper
from .phases.board import Board, PhaseCounts
from .phases.harvest import harvest
from .phases.jump_answers import JumpAnswers, jump_summary
from .phases.pass_rows import PassRows
from .phases.proofs import Proofs
from .phases.replacements import Replacements
from .phases.rows import Rows
from .phases.stored_rows import StoredRows
from .phases.survey import StoredCount, Survey
from .pipeline import WATCHDOG_MARGIN_S
from .site_memo import found_sites, kept_sites, site_data
from .worker_kind import ENGINE_WORKERS
from .summary import render_summary, summarize
from .worker import Job


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
    stored_passes: tuple = ()  # passes over every function's stored rows (``engine.passes.StoredPass``)


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
    stored: dict | None = None  # stored pass name -> its section (None: none asked)


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
    previous = None if options.jump_probes or options.stored_passes else _again(image.identity, store_path, config,
                                                                                 options, t0)
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
        if work.stored is not None:
            summary["stored_passes"] = work.stored
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
    store.merge_shards(leftover_shards(store.path, this_boot=True))  # functions a killed run finished are kept
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


@dataclass(frozen=True)
class Work:
    """What each phase of a run is given: the session (its pool: ``pool``), whether the run owns it, the job,
    the store, the run's scope and options, the proof cache (the session's copy of its findings:
    ``cached``), the cache tag and the configuration the rows are stored under, the progress line, and the
    phases' seconds (each adds its own)."""

    session: Session
    own: bool
    job: Job
    store: Store
    scope: Scope
    options: RunOptions
    cache: ProofCache
    cached: dict
    tag: bytes
    config: str
    progress: Progress
    seconds: dict

    @property
    def pool(self):
        return self.session.pool


def _verdicts(w: Work) -> tuple[PhaseCounts, int]:
    """Survey, proofs and rows over the functions to do (``phases.board``: what they hand each other); the
    counts, and the instructions expected, those of functions stored before included."""
    counts = PhaseCounts()
    if w.scope.todo:
        board = Board(w.pool, w.job, w.store, w.cache, w.tag, w.config)
        w.seconds["survey_s"] = drive(w.pool, Survey(board, list(w.scope.todo)), w.progress)
        misses = board.misses()
        with paused():  # the findings coming back live on, with no reference cycles: no full pass over them
            w.seconds["proofs_s"] = drive(w.pool, Proofs(board, misses), w.progress)
        w.seconds["rows_s"] = drive(w.pool, Rows(board), w.progress)
        counts = board.counts(len(misses))
    stored = StoredCount(sorted(w.scope.done))
    if stored.fids:
        drive(w.pool, stored, w.progress)
    return counts, counts.instructions + stored.n


def _replacements(w: Work) -> dict:
    """The summary's ``alternative_replacements``: every alternative's replacement verified at its address."""
    phase = Replacements(w.job, w.store, w.scope.image_id)
    drive(w.pool, phase, w.progress)
    return phase.summary


def _passes(w: Work) -> dict:
    """The summary's ``passes``: each pass's section, by name, in the order the options give them."""
    out = {}
    for k, p in enumerate(w.options.passes):
        phase = PassRows(w.store, w.scope.image_id, k, p)
        drive(w.pool, phase, w.progress)
        out[p.name] = phase.summary
    return out


def _stored_passes(w: Work) -> dict:
    """Each stored pass's section, by name, in the order the options give them.  The stored verdicts are read as
    claims: the image's seals are checked first (``StoreError`` if some were altered)."""
    image_id = w.scope.image_id
    w.store.check_seals(image_id)
    functions = len(w.store.function_names(image_id))
    if w.options.limit is not None:
        functions = min(functions, w.options.limit)
    out = {}
    for k, p in enumerate(w.options.stored_passes):
        phase = StoredRows(w.job.image, image_id, k, p, functions)
        drive(w.pool, phase, w.progress)
        out[p.name] = phase.section
    return out


def _jump_probes(w: Work) -> int:
    """The block proofs the jump-probe answers took (the answers themselves go to the store)."""
    if w.own:  # the block proofs need nothing the workers learned: new ones start without its memory
        harvest(w.pool, w.cache, w.tag, w.cached)
        w.session.fresh_workers()
        w.session.pool_for(w.job)
    phase = JumpAnswers(w.pool, w.store, w.scope.image_id)
    drive(w.pool, phase, w.progress)
    return phase.proofs


@dataclass(frozen=True)
class PhaseRow:
    """One step of a run: its name (its seconds go to ``<name>_s`` when ``timed``), whether a run does it
    (given the options and the image's sites, None when not looked for), what it does, and why it is there."""

    name: str
    wanted: Callable[[RunOptions, object], bool]
    run: Callable[[Work], object]
    timed: bool
    why: str


#: A run's steps, in order.  A step's value goes to ``Verification`` under its name.
PHASES: tuple[PhaseRow, ...] = (
    PhaseRow("verdicts", lambda o, sites: True, _verdicts, False,
             "one verdict per instruction: survey, proofs, rows, each timed on its own"),
    PhaseRow("replacements", lambda o, sites: sites is not None, _replacements, True,
             "what a kernel runs is also each alternative's replacement, patched in at boot"),
    PhaseRow("passes", lambda o, sites: bool(o.passes), _passes, True,
             "analyses added from outside (``engine.passes``), after the verdicts they may read"),
    PhaseRow("stored_passes", lambda o, sites: bool(o.stored_passes), _stored_passes, True,
             "readings of every function's stored verdicts (the tracer audit), once they are all written"),
    PhaseRow("jump_probes", lambda o, sites: o.jump_probes, _jump_probes, True,
             "asked for: whether a jump probe can sit on each instruction, which reads the stored verdicts"),
)


def _verify(image: Image, store: Store, scope: Scope, functions: list[Function], sites, options: RunOptions,
            session: Session, own: bool, tag: bytes, config: str, rules, progress: Progress,
            phases: dict[str, float]) -> Verification:
    """``PHASES`` on ``session``'s pool, those the options and the sites ask for.  ``own``: the run's own
    session, whose workers are told to end here (``Session.stop``) and which ``run`` closes."""
    t0 = time.monotonic()
    cache, cached = session.findings(tag)
    skip = overlaps(image, list(scope.functions.items()))
    ranges = None
    if options.jump_probes:
        from .jumps import patch_ranges

        ranges = patch_ranges(image, functions, sites, options.policy)
    job = Job(image, scope.functions, options.tramp, options.timeout_s, sites, cached, options.cache_dir, tag,
              store.path, scope.config_id, store.outcome_ids_now(), skip, scope.stale, rules, ranges,
              options.reuse_rows, options.passes, options.stored_passes)
    session.pool_for(job)
    phases["setup_s"] = phases.get("setup_s", 0.0) + time.monotonic() - t0  # the overlaps, the job, the pool
    work = Work(session, own, job, store, scope, options, cache, cached, tag, config, progress, phases)
    found = {}
    for row in PHASES:
        if row.wanted(options, sites):
            t1 = time.monotonic()
            found[row.name] = row.run(work)
            if row.timed:
                phases[f"{row.name}_s"] = time.monotonic() - t1
    harvest(work.pool, cache, tag, cached)
    if own:
        session.stop()
    counts, expected = found["verdicts"]
    unchecked = tuple(ranges.unchecked) if ranges is not None else ()
    return Verification(expected, counts, found.get("replacements"), found.get("jump_probes"), unchecked,
                        found.get("passes"), found.get("stored_passes"))


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
    if options.jump_probes or options.stored_passes:
        return None
    return _again(identity, store_path, _config(options, cache_tag(POLICIES[options.policy])), options,
                  time.monotonic())


def _again(identity: str, store_path: str, config: str, options: RunOptions, t0: float) -> dict | None:
    """The same command again: when the store holds a complete run of this image under this
    configuration and scope, and every function of the image is stored under it, that run's
    summary is the answer (recorded as a new run), without finding functions or sites."""
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


def _with_bytes(image: Image, functions: list[Function]):
    """(start, size, name, section, bytes) of each function, from the section its ``section`` names
    (``b""`` when that section does not hold it whole), each section looked up once."""
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


__all__ = ["RunOptions", "Session", "Scope", "PhaseCounts", "Verification", "Work", "PhaseRow", "PHASES",
           "make_pool", "run", "again", "render_summary", "overlaps", "jump_summary"]
