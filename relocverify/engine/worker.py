"""What a worker does: the tasks of the run's phases (``engine/phases``), over its share of the image.  The
verdicts' three:

  survey   walk functions, give every instruction an instance key
           (``keys``), and report the keys the proof cache does not know,
           each with one representative (bytes, address);
  prove    verify representatives (``pipeline``): each becomes the finding of
           every instruction with its key;
  rows     walk functions again (or reuse the survey's keys), look every
           instruction's finding up, prove what must be proved per instance,
           apply kernel sites and their variants, and write whole functions
           to the store, one transaction per batch.

and the other phases' (``replacements``, ``jump_probes``, ``pass_rows``, ``stored_rows``, ``count``).  A
``Worker`` keeps what it learns for the whole run: the survey's keys per function, the findings it was given
and the ones it made.  It is built from a ``Job``, everything a run shares, which a local pool hands to forked
processes and a distributed one rebuilds from the image's path.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from bisect import bisect_right
from functools import lru_cache
from itertools import accumulate

from ..image.functions import Function
from ..image.image import Image
from ..kernel.site_verdicts import site_finding
from ..kernel.sites import POLICY_BY_KIND, SiteIndex, kind_key
from ..kernel.variants import NoVariants, VariantFinder
from ..proof.verdict import Finding, Verdict
from ..store.cache import CachedFinding, CachedProof, ProofCache, merge_jump_entries
from ..store.jump_rows import JumpRow
from ..store.packed_rows import pack_u32, pack_wide_ids
from ..store.shard import ShardWriter, shard_path
from ..store.store import RowBatch, site_mask
from ..x86.decode import decode
from ..x86.registers import MASK64
from .keys import KeyMaker, per_instance
from .native_rows import ROW_PACK
from .passes import PassMemo, StoredReader
from .pipeline import Prover, answers_json
from .row_keeper import RowKeeper
from .row_memo import function_key

KEEP = "keep"  # Job.rules in a job sent to a live worker: keep the policy table it has
NOT_KEPT = frozenset({"crash", "timeout", "error"})  # methods whose findings are not cached
_UNSET = object()  # an argument not given
#: A proof task's items decoded ahead of its proofs (``Worker.prove``), at most: well inside ``decode``'s cache
#: of 8,192, which each proof also adds its trampoline's instructions to.  (A task holds ``phases.sizes.PROVE_CHUNK``.)
DECODE_AHEAD = 1024
KEEP_BYTES = 4 << 20  # kept rows (``row_memo``) a worker holds before writing them to the proof cache


def stored_bytes(image: Image, fn: Function) -> bytes:
    """Function ``fn``'s bytes as a run walks them: from the section its ``section`` names, ``b""`` when that
    section does not hold it whole (``engine.run``'s rows of functions are made the same way)."""
    section = image.get_section(fn.section)
    if section is None or not section.contains(fn.start, fn.size) or not section.data:
        return b""
    off = fn.start - section.address
    return section.data[off:off + fn.size]


@dataclass
class Job:
    """Everything the workers of one run share."""

    image: Image
    functions: dict[int, Function]  # function id -> bounds
    tramp: int
    timeout_s: float
    sites: SiteIndex | None
    cached: dict[bytes, CachedFinding] | None  # instance key -> finding, from the persistent cache
    #                                            (None only in ``Worker.reset``: keep the worker's)
    cache_dir: str | None  # the persistent cache (its full-key proofs are read when first wanted)
    tag: bytes  # the cache tag (versions and policy)
    store_path: str = ""  # workers write shards next to it (store.shard)
    config: int = 0  # the store's id of the run's configuration
    outcomes: dict[tuple, tuple[int, str]] = field(default_factory=dict)  # the store's outcomes at the start
    skip: dict[int, frozenset[int]] = field(default_factory=dict)  # function id -> addresses another one owns
    stale: frozenset[int] = frozenset()  # functions stored under another configuration: rows replaced
    rules: tuple | None = None  # the policy table (plan.policy.POLICIES; None: the kernel's)
    ranges: object = None  # kernel.patch_range.PatchRanges, when the run answers for jump probes
    reuse_rows: bool = True  # copy functions' rows the proof cache keeps (``row_memo``), and keep new ones
    passes: tuple = ()  # the run's passes (``engine.passes.FunctionPass``), after the verdicts
    stored: tuple = ()  # the run's passes over the stored rows (``engine.passes.StoredPass``), after the verdicts


def empty_harvest() -> tuple[dict, dict, dict, dict]:
    """What ``merge_harvest`` adds workers' harvests into: findings, proofs, derivations, jump answers."""
    return {}, {}, {}, {}


def merge_harvest(into: tuple[dict, dict, dict, dict], harvest: tuple[dict, dict, dict, dict]) -> None:
    """One worker's ``Worker.harvest`` added to ``into``: later findings, proofs and derivations win
    (a key's are the same wherever made); jump answers merge by ``store.cache.merge_jump_entries``, so a
    branch token two workers saw standing for two piece keys is caught."""
    for mine, theirs in zip(into[:3], harvest[:3]):
        mine.update(theirs)
    for tag, entries in harvest[3].items():
        merge_jump_entries(into[3].setdefault(tag, {}), entries)


class Learned:
    """A finding an instance key stands for, with where it was first made (for ``fresh``).

    ``shared`` is the finding every other instance of the key gets (one object
    for all of them), or None when the key is per instance.

    Between processes (a kernel's proofs send about 40 thousand of these to the parent and again to the
    workers) a representative's finding that its cached finding gives back as it is (``from_cached`` with
    its fresh mark: no counterexample, the same fields) travels as that mark alone and is made again when
    first asked for: unpickling a ``Finding`` was most of the parent's CPU in a cold run's proof phase."""

    __slots__ = ("cached", "address", "_finding", "_shared", "ids", "plain")

    def __init__(self, cached: CachedFinding, address: int | None = None, finding: Finding | bool | None = None):
        self.cached = cached
        self.address = address  # the representative's address if proved in this run
        # the representative's own finding (its counterexample included); a bool: ``from_cached`` with that fresh mark
        self._finding = finding
        self._shared = _UNSET  # made when first asked: the parent never asks, and a worker not for every key
        self.ids = None  # (outcome id, outcome reason) of ``shared`` in the store, once asked
        self.plain = None  # (outcome id, proof µs clipped to u32) when ``shared`` fits a plain store row, once asked

    @property
    def finding(self) -> Finding | None:
        f = self._finding
        if f.__class__ is bool:
            f = self._finding = from_cached(self.cached, f)
        return f

    @property
    def shared(self) -> Finding | None:
        shared = self._shared
        if shared is _UNSET:
            shared = self._shared = None if self.cached.per_instance else from_cached(self.cached)
        return shared

    def __reduce__(self):
        f = self._finding
        if f is not None and f.__class__ is not bool and f.counterexample is None and from_cached(self.cached, f.fresh) == f:
            f = f.fresh
        return Learned, (self.cached, self.address, f)


def _own(finding: Finding | None, raw: bytes, address: int) -> Finding | None:
    """A key's shared finding as the instance ``raw`` at ``address`` has it: the decoders' answers, which a finding
    keeps when they disagree, are this instance's own (its text, its displacement and immediate), not those of
    the instance the key was proved on.  So a row's answers do not depend on which instance represented its
    key, which the split of a run's work between its workers decides (only the representative's row keeps
    its key's counterexample, when there is one: it is that instance's)."""
    if finding is None or finding.answers is None:
        return finding
    answers = answers_json(decode(raw, address))
    return finding if answers == finding.answers else replace(finding, answers=answers)


def to_cached(finding: Finding, shareable: bool) -> CachedFinding:
    return CachedFinding(not shareable, finding.verdict.value, finding.reason, finding.method,
                         finding.plan_kind, finding.rule, finding.klass, finding.proof_us, finding.answers)


def from_cached(c: CachedFinding, fresh: bool = False) -> Finding:
    return Finding(Verdict(c.verdict), c.reason, c.method, c.plan_kind, c.rule, c.klass, c.proof_us, fresh,
                   answers=c.answers)


class SurveyTasks:
    """Phase 1, the survey: every instruction of the functions keyed (``keys``), the keys nobody knows
    collected, the functions whose every key is known written at once, the others kept waiting compactly.  A part of ``Worker``."""

    def _forget_survey(self) -> None:
        """What the survey keeps of an image until its rows are written, compactly: each waiting
        function's instruction lengths (offsets are their running sums) and key numbers, and the key
        table they index.  As tuples of (offset, length, key) the keys of a whole kernel took about
        280 MB per worker; as a string of lengths and an array of numbers, 5 bytes per instruction."""
        self.surveyed: dict[int, tuple[bytes, array]] = {}
        self._gathered: dict[bytes, tuple[bytes, int]] = {}  # ``survey(gather=True)``'s keys nobody knows
        self.function_keys: dict[int, bytes] = {}  # a waiting function's key (``row_memo.function_key``)
        self.function_sites: dict[int, list] = {}  # the sites over a waiting function, when its key needed them
        self.key_number = _Numbering()
        self.key_table: list[bytes] = []  # number -> key, made when first wanted

    def _keys(self, fid: int, got: tuple[bytes, array] | None = None):
        """(offset, length, key) of each instruction of a function: as given (its lengths and key numbers), as
        its survey kept them, or walked again."""
        if got is None:
            got = self.surveyed.pop(fid, None)
        if got is None:
            fn = self.job.functions[fid]
            return self.keys.keys(self._function_bytes(fn), fn.start)
        lengths, numbers = got
        if len(self.key_table) != len(self.key_number):
            self.key_table = list(self.key_number)  # a dict keeps insertion order: the numbers'
        return zip(accumulate(lengths, initial=0), lengths, map(self.key_table.__getitem__, numbers))

    def survey(self, fids: list[int], gather: bool = False
               ) -> tuple[dict[bytes, tuple[bytes, int]], int, set[bytes], list[int], int, int]:
        """Walk functions and key their instructions.  A function whose rows the proof cache keeps
        (``row_memo``) is copied; one whose every key is known is verified now; the others wait for
        the proofs.

        Returns the keys nobody knows yet, each with a representative (bytes,
        address); how many instructions the functions hold (overlaps owned
        elsewhere left out); the keys that were known; the functions left
        waiting; the rows written; and how many functions were copied.
        ``gather``: the keys nobody knows stay here, added to those of the worker's earlier surveys as
        the run's parent would add them (a later task's instance replacing an earlier one), and the
        first value is empty; ``gathered`` hands them over once (a task's keys repeat the last task's:
        a kernel's surveys reported 581 k keys for 40 k distinct ones, 18 MB through the pipes)."""
        misses: dict[bytes, tuple[bytes, int]] = {}
        hits: set[bytes] = set()
        waiting: list[int] = []
        total = 0
        batch = _Batch()
        context = self.kept.context(self.job, self.variants)
        reused = self.kept.reused
        prepared = [self._prepared(fid, context) for fid in fids]
        kept = self.kept.rows_of(self.job.cache_dir, [p[4] for p in prepared]) if context is not None else {}
        heads = self.kept.heads(self.job, [p[0] for p in prepared if p[4] in kept]) if kept else {}
        for i, (fid, fn, data, here, fkey) in enumerate(prepared):
            if self.current is not None:
                self.current(i)
            value = kept.get(fkey)
            if value is not None:
                n = self.kept.reuse(fid, value, batch, self.ids, heads.get(fid))
                if n is not None:
                    total += n
                    self._tell(n)
                    continue
            lengths, keys = self.keys.walk(data, fn.start)
            complete, n = self._survey_keys(fn.start, data, lengths, keys, self.job.skip.get(fid), misses, hits)
            total += n
            numbered = (lengths, array("I", map(self.key_number.__getitem__, keys)))
            if complete:
                self.function_rows(fid, batch, numbered, here, fkey)
            else:
                self._wait(fid, numbered, here, fkey)
                waiting.append(fid)
            self._tell(len(keys))
        written = batch.n
        self.write(batch.done(self.ids))
        if gather:
            self._gathered.update(misses)
            misses = {}
        return misses, total, hits, waiting, written, self.kept.reused - reused

    def _survey_keys(self, start: int, data: bytes, lengths: bytes, keys: list[bytes], skip: frozenset[int] | None,
                     misses: dict[bytes, tuple[bytes, int]], hits: set[bytes]) -> tuple[bool, int]:
        """Whether every key of a function is known, and how many instructions it owns (those at ``skip``
        another function owns); the known keys added to ``hits``, the others to ``misses`` with their first
        instance (in address order) as its representative."""
        cached, learned = self.job.cached, self.learned
        complete = True
        total = 0
        for off, n, key in zip(accumulate(lengths, initial=0), lengths, keys):
            if skip and start + off in skip:
                continue
            total += 1
            if key in cached or key in learned:
                hits.add(key)
            else:
                complete = False
                if key not in misses:
                    misses[key] = (data[off:off + n], start + off)
        return complete, total

    def _prepared(self, fid: int, context: bytes | None) -> tuple:
        """(id, function, its bytes, the sites over it, its function key): the sites are found here only for its
        key (else ``_UNSET``: found when its rows are made), the key only when rows are kept (``context``)."""
        fn = self.job.functions[fid]
        data = self._function_bytes(fn)
        here, fkey = _UNSET, None
        if context is not None:
            here = self.job.sites.sites_at(fn.start, fn.size) if self.job.sites is not None else None
            fkey = function_key(context, fn.start, fn.size, data, self.job.skip.get(fid), here, self.job.image)
        return fid, fn, data, here, fkey

    def _wait(self, fid: int, numbered: tuple[bytes, array], here, fkey: bytes | None) -> None:
        """Keep a function until the proofs are in, compactly (its lengths and key numbers: ``_forget_survey``),
        with its key and the sites found for it."""
        self.surveyed[fid] = numbered
        if fkey is not None:
            self.function_keys[fid] = fkey
        if here is not _UNSET:  # found for its key: its rows need them too
            self.function_sites[fid] = here

    def gathered(self) -> dict[bytes, tuple[bytes, int]]:
        """The keys nobody knew in the surveys made with ``gather``, each with its representative; forgotten here."""
        out, self._gathered = self._gathered, {}
        return out

    def count(self, fids: list[int]) -> int:
        """How many instructions the functions hold, as the survey walks them (no key kept)."""
        total = 0
        for fid in fids:
            fn = self.job.functions[fid]
            skip = self.job.skip.get(fid, ())
            for off, _, _ in self.keys.keys(self._function_bytes(fn), fn.start):
                if fn.start + off not in skip:
                    total += 1
        return total


class RowTasks:
    """Phase 3, the rows: a waiting function's rows made from its keys' findings (by ``row_pack.c``, or
    walked in Python), sites and variants applied, whole functions written to this worker's shard.  A part of ``Worker``."""

    def rows(self, fids: list[int]) -> int:
        """Every instruction of the functions, with its finding, sites and live variants, written to
        this worker's shard; returns how many."""
        batch = _Batch()
        for i, fid in enumerate(fids):
            if self.current is not None:
                self.current(i)
            n = batch.n
            self.function_rows(fid, batch)
            self._tell(batch.n - n)
        written = batch.n
        self.write(batch.done(self.ids))
        return written

    def write(self, batch: RowBatch) -> None:
        """Whole functions, one transaction, into this worker's shard; the rows kept of them
        (``row_memo``) into the proof cache once they fill ``KEEP_BYTES``."""
        if self.shard is None:
            self._shards += 1
            self.shard = ShardWriter(shard_path(self.job.store_path, os.getpid(), self._shards))
            batch.outcomes, batch.names = self.ids.definitions(), self.ids.name_definitions()  # all, for a new shard
            self.ids.take_new()
        else:  # the shard has every provisional id defined before: only the new ones (all, each batch, was quadratic)
            batch.outcomes, batch.names = self.ids.take_new()
        self.shard.write(self.job.config, batch)
        if self.kept.new_bytes >= KEEP_BYTES:
            self.kept.flush(self.job.cache_dir)

    def close_shard(self) -> str | None:
        """Close the shard (the run merges it); the next write opens a new one.  The store, read for the seals of
        copied rows, is closed too."""
        self.kept.close_store()
        path = None if self.shard is None else self.shard.close()
        self.shard = None
        return path

    def function_rows(self, fid: int, batch: _Batch, numbered: tuple[bytes, array] | None = None,
                      here: list | None | object = _UNSET, fkey: bytes | None | object = _UNSET) -> None:
        """Every instruction of a function, with its finding, its kernel sites and their live variants,
        added to ``batch``; kept for the proof cache under its function key (``row_memo``) when no finding
        of it is one the cache does not keep.  ``here``: the sites overlapping it, when known.

        Nearly every instruction takes its key's plain shared finding, at no site, and is not its key's
        representative: ``row_pack`` writes those from the worker's tables by key number (``_oid``, ``_us``,
        ``_rep``), in C.  Every other position (``row_pack.scan``) takes the per-instruction path below, in
        address order, exactly as ``_walk_rows`` does; ``row_pack.pack`` then numbers the outcomes and writes
        the row as that walk would."""
        if ROW_PACK is None:
            return self._walk_rows(fid, batch, numbered, here, fkey)
        fn = self.job.functions[fid]
        start = fn.start
        lengths, numbers = self._numbers(fid, numbered)
        skip = self.job.skip.get(fid)
        here, fkey = self._sites_and_key(fid, fn, here, fkey)
        offs = list(accumulate(lengths, initial=0))
        at_site = _site_positions(here, offs, lengths, start) if here else {}
        forced, marks = _site_split(at_site)
        specials = self._specials(start, lengths, numbers, offs, forced, skip)
        n0, f0, v0 = batch.n, len(batch.full), len(batch.variants)
        s_oid, s_us, s_flags, s_mask = array("q"), array("I"), bytearray(), array("I")
        v_special, v_vid, v_j = array("I"), array("q"), array("i")
        names: dict[int, int] = {}  # variant name id -> the function's own index j of it
        made = unkept = False  # a packed row marked fresh (kept unmarked); a finding the cache does not keep
        data = self._function_bytes(fn) if specials else b""
        key_table = self.key_table
        learned = self.learned
        for s, i in enumerate(specials):
            off, n, j = offs[i], lengths[i], numbers[i]
            address = start + off
            if skip is not None and address in skip:
                s_oid.append(0), s_us.append(0), s_flags.append(_DROPPED), s_mask.append(0)
                continue  # an overlapping function owns this instruction
            key = key_table[j]
            hit = learned.get(key) or self.lookup(key)
            finding, ids, shared = self._instance(hit, key, data, off, n, address)
            if shared and hit.plain is not None:  # the tables serve its key's later instances
                self._oid[j], self._us[j] = hit.plain
                self._rep[j] = (hit.address or 0) & MASK64
            unkept = unkept or finding.method in NOT_KEPT
            live = ()
            mask = None
            sites = at_site.get(i)
            if sites:
                finding, ids, live, mask = self._at_sites(finding, ids, sites, address, data, off, n)
            # a site's finding may be fresh though the instruction's was not
            made = _special_row(finding, ids, mask, (s_oid, s_us, s_flags, s_mask), batch, fid, off, n) or made
            if live:
                unkept = self._packed_variants(live, s, fid, off, names, (v_special, v_vid, v_j), batch) or unkept
        order, counts, plain, at_sites, variants = ROW_PACK.pack(
            lengths, numbers, self._oid, self._us, specials, s_oid, s_us, s_flags, s_mask, v_special, v_vid, v_j, marks)
        batch.end_packed(fid, order, counts, plain, at_sites, names, variants)
        if fkey is not None and not unkept:
            kmap = dict(zip(order, range(len(order))))
            self.kept.keep(fkey, batch, batch.n - n0, f0, v0, kmap, names, made, self.ids, order)

    def _sites_and_key(self, fid: int, fn: Function, here, fkey) -> tuple[list | None, bytes | None]:
        """The sites over a function and its function key (``row_memo``): as given, as its survey kept them,
        or found now (a function another worker surveyed: its rows task taken from that worker's queue)."""
        if here is _UNSET:
            here = self.function_sites.pop(fid, _UNSET)
        if here is _UNSET:
            here = self.job.sites.sites_at(fn.start, fn.size) if self.job.sites is not None else None
        if fkey is _UNSET:
            fkey = self.function_keys.pop(fid, _UNSET)
        if fkey is _UNSET:
            context = self.kept.context(self.job, self.variants)
            fkey = None if context is None else function_key(context, fn.start, fn.size, self._function_bytes(fn),
                                                             self.job.skip.get(fid), here, self.job.image)
        return here, fkey

    def _specials(self, start: int, lengths: bytes, numbers: array, offs: list[int], forced: set[int],
                  skip) -> array:
        """The positions ``row_pack.scan`` leaves to the per-instruction path: those its tables cannot serve,
        those ``forced`` (at kernel sites that do more than mark) and those another function owns (``skip``)."""
        if skip:
            forced.update(i for i, off in enumerate(offs[:-1]) if start + off in skip)
        grown = len(self.key_number) - len(self._oid)
        if grown > 0:
            self._oid.frombytes(bytes(8 * grown))
            self._us.frombytes(bytes(4 * grown))
            self._rep.frombytes(bytes(8 * grown))
        specials = array("I")
        specials.frombytes(ROW_PACK.scan(lengths, numbers, start & MASK64, self._oid, self._rep,
                                         array("I", sorted(forced))))
        return specials

    def _instance(self, hit: Learned | None, key: bytes, data: bytes, off: int, n: int, address: int
                  ) -> tuple[Finding, tuple[int, str], bool]:
        """(an instance's finding, its outcome ids, whether it is its key's shared finding): the shared one
        (its ids made once, and its plain row when it has one; its own decoder answers when the shared one
        has some), or, for the key's representative or a key with no shared finding, its own."""
        finding = None if hit is None else hit.shared
        if finding is None or hit.address == address:
            finding = self.finding(data[off:off + n], address, key)
            return finding, self.ids.outcome(finding), False
        ids = hit.ids
        if ids is None:
            ids = hit.ids = self.ids.outcome(finding)
            if finding.answers is None and finding.reason == ids[1] and finding.method not in NOT_KEPT:
                us = finding.proof_us
                hit.plain = (ids[0], us if us < _U32 else _U32 - 1)
        if finding.answers is not None:
            finding = _own(finding, data[off:off + n], address)
        return finding, ids, True

    def _packed_variants(self, live, s: int, fid: int, off: int, names: dict[int, int], into: tuple, batch) -> bool:
        """The live variants of special position ``s`` for ``row_pack.pack`` (``into``: its special index, outcome
        id and name index arrays; a variant with a reason of its own is a row of ``batch.variants``); whether
        one has a finding the cache does not keep."""
        v_special, v_vid, v_j = into
        unkept = False
        for name, vf in live:
            vid, vreason = self.ids.outcome(vf)
            v_special.append(s)
            v_vid.append(vid)
            if vf.reason == vreason:
                nid = self.ids.name(name)
                vj = names.get(nid)
                if vj is None:
                    vj = names[nid] = len(names)
                v_j.append(vj)
            else:
                v_j.append(-1)
                batch.variants.append((fid, off, name, vid, vf.reason))
            unkept = unkept or vf.method in NOT_KEPT
        return unkept

    def _walked_variants(self, live, fid: int, off: int, kmap: dict[int, int], count: list[int],
                         names: dict[int, int], variants: array, batch) -> bool:
        """``_packed_variants`` for the walk: each variant's outcome numbered in ``kmap``/``count``, its
        (offset, name index, outcome index) in ``variants``."""
        unkept = False
        for name, vf in live:
            vid, vreason = self.ids.outcome(vf)
            vk = kmap.get(vid)
            if vk is None:
                vk = kmap[vid] = len(count)
                count.append(0)
            if vf.reason == vreason:
                nid = self.ids.name(name)
                j = names.get(nid)
                if j is None:
                    j = names[nid] = len(names)
                variants.extend((off, j, vk))
            else:
                batch.variants.append((fid, off, name, vid, vf.reason))
            unkept = unkept or vf.method in NOT_KEPT
        return unkept

    def _at_sites(self, finding: Finding, ids: tuple[int, str], sites: list, address: int, data: bytes, off: int,
                  n: int) -> tuple[Finding, tuple[int, str], tuple, int | None]:
        """What the kernel sites over the instruction at ``data[off:off + n]`` make of its finding: (finding,
        its outcome ids, the live variants, the sites' mask).  Sites that only mark keep the finding; a
        rejection depends on the finding and the sites' kinds alone, so it is made once per pair; otherwise
        every variant that can run there is verified (``site_verdicts.site_finding``)."""
        kinds = tuple([site.kind for site in sites])
        how, mask = _site_effect(kinds)
        live = ()
        if how == _VARIANTS:
            finding, live = site_finding(finding, sites, address, data[off:off + n], self.variants,
                                         lambda other: self.finding(other, address, self.keys.key(other, address)),
                                         self._variant_made)
            ids = self.ids.outcome(finding)
        elif how == _REJECT:
            got = self._rejected.get((id(finding), kinds))
            if got is None or got[0] is not finding:
                got = self._rejected[(id(finding), kinds)] = (
                    finding, site_finding(finding, sites, address, b"", self.variants, None)[0])
            finding = got[1]
            ids = self.ids.outcome(finding)
        return finding, ids, live, mask

    def _numbers(self, fid: int, numbered: tuple[bytes, array] | None) -> tuple[bytes, array]:
        """A function's instruction lengths and key numbers: as given, as its survey kept them, or walked again."""
        got = numbered if numbered is not None else self.surveyed.pop(fid, None)
        if got is None:
            fn = self.job.functions[fid]
            lengths, keys = self.keys.walk(self._function_bytes(fn), fn.start)
            got = (lengths, array("I", map(self.key_number.__getitem__, keys)))
        if len(self.key_table) != len(self.key_number):
            self.key_table = list(self.key_number)  # a dict keeps insertion order: the numbers'
        return got

    def _walk_rows(self, fid: int, batch: _Batch, numbered: tuple[bytes, array] | None = None,
                   here: list | None | object = _UNSET, fkey: bytes | None | object = _UNSET) -> None:
        """``function_rows`` as one walk in address order, every instruction by the per-instruction path:
        what serves when ``engine.row_pack`` is not built, and the reference ``tests/test_row_pack.py``
        holds the packed path to."""
        fn = self.job.functions[fid]
        start = fn.start
        data = self._function_bytes(fn)
        keys = self._keys(fid, numbered)
        skip = self.job.skip.get(fid)
        here, fkey = self._sites_and_key(fid, fn, here, fkey)
        sweep = _SiteSweep(here) if here is not None else None
        next_site = sweep.next_start() if sweep else None
        learned = self.learned
        plain = array("I")  # this function's packed rows (store.packed_rows)
        at_sites = array("I")  # (offset, site kinds mask) of those at kernel sites
        variants = array("I")  # (offset, j, k) of its live variants without a reason of their own
        kmap: dict[int, int] = {}  # outcome id -> the function's own index k of it
        count: list[int] = []  # by k: the instructions with that outcome (0 for a variant's only)
        names: dict[int, int] = {}  # variant name id -> the function's own index j of it
        n0, f0, v0 = batch.n, len(batch.full), len(batch.variants)
        made = unkept = False  # a packed row marked fresh (kept unmarked); a finding the cache does not keep
        extend = plain.extend
        for off, n, key in keys:
            address = start + off
            if skip is not None and address in skip:
                continue  # an overlapping function owns this instruction
            site = next_site is not None and next_site < address + n
            hit = learned.get(key) or self.lookup(key)
            if not site and hit is not None:
                p = hit.plain
                if p is not None and hit.address != address:
                    # the common case: a shared finding (never fresh), no site, a plain row
                    k = kmap.get(p[0])
                    if k is None:
                        k = kmap[p[0]] = len(count)
                        count.append(1)
                    else:
                        count[k] += 1
                    extend((off, n | k << 5, p[1]))
                    continue
            finding, ids, _ = self._instance(hit, key, data, off, n, address)
            unkept = unkept or finding.method in NOT_KEPT
            live = ()
            mask = None
            if site:
                here = sweep.at(address, n)
                next_site = sweep.next_start()
                if here:
                    finding, ids, live, mask = self._at_sites(finding, ids, here, address, data, off, n)
            # a site's finding may be fresh though the instruction's was not
            made = _walked_row(finding, ids, mask, kmap, count, plain, at_sites, batch, fid, off, n) or made
            if live:
                unkept = self._walked_variants(live, fid, off, kmap, count, names, variants, batch) or unkept
        batch.end_function(fid, count, kmap, plain, at_sites, names, variants)
        if fkey is not None and not unkept:
            self.kept.keep(fkey, batch, batch.n - n0, f0, v0, kmap, names, made, self.ids)

    def crashed(self, fid: int, why: str) -> int:
        """Every instruction of a function whose verification killed its worker: unknown, with why,
        written to this worker's shard; returns how many."""
        fn = self.job.functions[fid]
        batch = _Batch()
        skip = self.job.skip.get(fid, ())
        f = Finding(Verdict.UNKNOWN, why, "crash", "", "", "")
        oid, reason = self.ids.outcome(f)
        count = [0]
        for off, n, key in self.keys.keys(self._function_bytes(fn), fn.start):
            if fn.start + off in skip:
                continue
            batch.add_full(fid, off, n, oid, reason, f, None)
            count[0] += 1
        batch.end_function(fid, count, {oid: 0})
        written = batch.n
        self.write(batch.done(self.ids))
        return written


class ProbeTasks:
    """The tasks after the rows: jump-probe answers (``engine.jumps``), the alternatives' replacements,
    and the run's passes (``engine.passes``).  A part of ``Worker``."""

    def _jump_memory(self):
        """The jump answers this worker has learned, first loaded from the persistent cache under the
        jump tag, kept for the session (``engine.jumps.JumpMemory``); a new policy table starts anew."""
        from .jumps import JumpMemory, jump_tag

        tag = jump_tag(self.job.tag)
        memory = self.__dict__.get("_jump_answers")
        if memory is not None and memory[0] == tag:
            return memory[1]
        entries = {}
        if self.job.cache_dir is not None:
            cache = ProofCache(self.job.cache_dir)
            try:
                entries = cache.jump_entries(tag)
            finally:
                cache.close()
        self._jump_answers = (tag, JumpMemory(entries))
        return self._jump_answers[1]

    def _int3_finding(self, key: bytes) -> CachedFinding | None:
        """What the cache or this run holds for an instance key (``JumpProver._derived`` reads it)."""
        hit = self.lookup(key)
        return None if hit is None else hit.cached

    # -- jump probes -----------------------------------------------------------------
    def jump_probes(self, fids: list[int], news: dict[tuple, object] | None = None
                    ) -> tuple[list[JumpRow], dict[str, str], int, dict[tuple, object]]:
        """Whether a jump probe can sit at each instruction of the functions (``engine.jumps``):
        each function's answers packed (``store.jump_rows``), an example reason per bucket, the proofs made (whole
        blocks by ``prove_block``, pieces by ``piece_proved``), and the answers learned since the last
        task, for the other workers; ``news``, what the other workers learned (``JumpMemory.absorb``)."""
        from .jumps import JumpProver

        prover = self.__dict__.get("_jumps")
        if prover is None or prover.ranges is not self.job.ranges:
            prover = self._jumps = JumpProver(self.job.ranges, self.job.tramp, self.job.timeout_s, self.job.rules,
                                              memory=self._jump_memory(), finding=self._int3_finding)
        if news:
            prover.conflicts += prover.memory.absorb(news)
        before = prover.proofs + prover.piece_proofs
        rows: list[JumpRow] = []
        examples: dict[str, str] = {}
        for i, fid in enumerate(fids):
            if self.current is not None:
                self.current(i)
            fn = self.job.functions[fid]
            data = self._function_bytes(fn)
            found = self.keys.keys(data, fn.start)
            rows.append(prover.packed(fid, fn, data, found, self.job.skip.get(fid, ()), examples))
            self._tell(len(found))
        return rows, examples, prover.proofs + prover.piece_proofs - before, prover.memory.take_outgoing()

    # -- passes ----------------------------------------------------------------------
    def pass_rows(self, index: int, fids: list[int]) -> list[tuple[int, list[tuple]]]:
        """(function id, its rows) of the job's pass ``index`` (``engine.passes``) over these functions."""
        p = self.job.passes[index]
        memo = self.__dict__.get("_pass_memo")
        if memo is None:
            memo = self._pass_memo = PassMemo()
        out = []
        for i, fid in enumerate(fids):
            if self.current is not None:
                self.current(i)
            fn = self.job.functions[fid]
            out.append((fid, memo.function_rows(p, self.job.image, fn, self._function_bytes(fn))))
            self._tell(1)
        return out

    def stored_rows(self, index: int, image_id: int, lo: int, hi: int) -> object:
        """The value of the job's stored pass ``index`` (``engine.passes.StoredPass``) over the image's functions
        at positions ``lo`` to ``hi`` of its stored rows, read from the store here; the pass's state is made the
        first time this worker runs it and kept for the session (its images)."""
        p = self.job.stored[index]
        states = self._stored_states
        if p.name not in states:
            states[p.name] = p.start()
        reader = self._stored_reader
        if reader is None:
            reader = self._stored_reader = StoredReader()
        return p.chunk(states[p.name], self.job.image, self._handed(reader.functions(self.job.store_path,
                                                                                     image_id, lo, hi)))

    def _handed(self, functions: list):
        """``functions`` one by one, each told as the item in hand (``current``) while the pass is on it, and as
        done (``progress``) once it is past it."""
        for i, f in enumerate(functions):
            if self.current is not None:
                self.current(i)
            yield f
            self._tell(1)

    def stored_rows_done(self) -> None:
        """The end of a stored pass's phase: the store this worker read is closed (the run's own close is last)."""
        if self._stored_reader is not None:
            self._stored_reader.close()

    # -- alternative replacements ----------------------------------------------------
    def replacements(self, indexes: list[int]) -> list[tuple]:
        """(alternative index, site, address, bytes, finding) for every instruction of the replacements
        of these alternatives (indexes into the image's alternatives, in table order)."""
        out = []
        alternatives = self._alternatives()
        for k in indexes:
            site = alternatives[k]
            insns = self.variants.replacement_instructions(site)
            if isinstance(insns, NoVariants):
                out.append((k, site.address, site.address, b"",
                            Finding(Verdict.UNKNOWN, insns.reason, "site", "", "site:alternative", "")))
                continue
            for address, raw in insns:
                f = self.finding(raw, address, self.keys.key(raw, address))
                out.append((k, site.address, address, raw, f))
        return out

    def _alternatives(self) -> list:
        if not hasattr(self, "_alts"):
            self._alts = list(self.job.sites.iter_sites("alternative"))
        return self._alts


class Worker(SurveyTasks, RowTasks, ProbeTasks):
    """One worker of a run's pool, kept for the whole run (a session: from image to image): the instance keys,
    findings and proofs it learns serve its later tasks.  Each task is a call of one of its public methods
    (``schedule.local_pool``); its parts by phase are ``SurveyTasks``, ``RowTasks`` and ``ProbeTasks``."""

    def __init__(self, job: Job, smt: Callable | None = None):
        """``smt``: what runs this worker's SMT checks (``Prover``'s; the session's helper, or None: here)."""
        self.job = job
        self.smt = smt
        self.keys = KeyMaker(job.tramp)
        self.prover = Prover(job.tramp, job.timeout_s, self._load_proofs, job.rules, smt)
        self.learned: dict[bytes, Learned] = {}
        self.new_findings: dict[bytes, CachedFinding] = {}
        self.derivations: dict[bytes, bytes | None] = {}
        self.kept = RowKeeper()  # functions' rows copied from the proof cache, and kept for it (``row_memo``)
        self._forget_survey()
        self.variants = VariantFinder(job.image) if job.sites is not None else None
        self.ids = OutcomeIds(job.outcomes)
        self._rejected: dict[tuple[int, tuple[str, ...]], tuple[Finding, Finding]] = {}  # (finding, kinds) at reject sites
        self._variant_made: dict = {}  # findings made from variants' (``site_verdicts.site_finding``'s ``made``)
        self._forget_plain()
        self.shard: ShardWriter | None = None
        self._shards = 0
        self.progress = None  # a callable(n) told of instructions done, if any
        self.current = None  # a callable(i) told of the item in hand, if any
        self._stored_states: dict[str, object] = {}  # stored pass name -> its state here (``stored_rows``)
        self._stored_reader: StoredReader | None = None  # the stored rows this worker reads, once it reads some

    def reset(self, job: Job) -> None:
        """Take the next image of a session.  What this worker learned stays (instance keys are
        image-independent, as the persistent cache's are, and the store's outcome ids stay valid
        in the same store); what belongs to the last image goes.  ``job.cached`` None and
        ``job.rules`` KEEP: keep ours (a session's images share both; the policy table holds
        predicates, which do not pickle)."""
        if job.cached is None:
            job = replace(job, cached=self.job.cached)
        if job.rules == KEEP:
            job = replace(job, rules=self.job.rules)
        self.close_shard()
        old, self.job = self.job, job
        if (job.timeout_s, job.rules, job.tag) != (old.timeout_s, old.rules, old.tag):
            self.keys = KeyMaker(job.tramp)
            self.prover = Prover(job.tramp, job.timeout_s, self._load_proofs, job.rules, self.smt)
            self.learned = {}
        else:
            if job.tramp != old.tramp:
                # Another trampoline (user-space images each have their own): instance keys and full
                # keys both say how an instruction relates to its trampoline, as the persistent
                # cache's do, so what is learned stays, and so do the cache's proofs once read.
                self.keys = KeyMaker(job.tramp)
                self.prover.tramp = job.tramp
            moved = job.store_path != old.store_path
            for learned in self.learned.values():
                if learned.ids is not None and (moved or learned.ids[0] < 0):
                    learned.ids = learned.plain = None
        self._forget_survey()
        self.variants = VariantFinder(job.image) if job.sites is not None else None
        self.ids = OutcomeIds(job.outcomes)
        self._rejected = {}
        self._variant_made = {}
        self._forget_plain()
        self.__dict__.pop("_alts", None)
        self.__dict__.pop("_jumps", None)  # the answers it learned stay (``_jump_memory``)
        self.stored_rows_done()  # a stored pass's state stays (``stored_rows``); its reading of the last image goes
        self.kept.next_image()

    # -- helpers -------------------------------------------------------------------
    def _load_proofs(self) -> dict[bytes, CachedProof]:
        if self.job.cache_dir is None:
            return {}
        cache = ProofCache(self.job.cache_dir)
        try:
            return cache.proofs(self.job.tag)
        finally:
            cache.close()

    def _function_bytes(self, fn: Function) -> bytes:
        return stored_bytes(self.job.image, fn)

    def _forget_plain(self) -> None:
        """Forget the tables ``function_rows`` writes plain rows from, by key number: each key's plain shared
        finding (outcome id, proof µs; 0: none known) and the address its representative was proved at.
        Forgotten whenever an outcome's id or a key's finding may change (new findings, the store's ids, the
        next image); the per-instruction path fills them again, one instance per key."""
        self._oid, self._us, self._rep = array("q"), array("I"), array("Q")

    def lookup(self, key: bytes) -> Learned | None:
        hit = self.learned.get(key)
        if hit is None:
            c = self.job.cached.get(key)
            if c is not None:
                hit = self.learned[key] = Learned(c)
        return hit

    def _tell(self, n: int) -> None:
        if self.progress is not None:
            self.progress(n)

    # -- phase 2 -------------------------------------------------------------------
    def prove(self, items: list[tuple[bytes, bytes, int]]) -> dict[bytes, Learned]:
        """Verify each (key, bytes, address) representative; its finding stands for its key.

        Every item is decoded first, one after the other (``decode`` keeps the last 8,192): the decoders'
        code and tables stay in the CPU's caches, where each proof's decode between two lifts found them
        cold.  The proofs then find their decodes made; same calls, same values, a cold kernel's
        proofs about 7% faster."""
        self.keys.forget()
        for _, raw, address in items[:DECODE_AHEAD]:
            decode(raw, address)
        out = {}
        for i, (key, raw, address) in enumerate(items):
            if self.current is not None:
                self.current(i)
            out[key] = self._learn(key, raw, address)
            self._tell(1)
        return out

    def _learn(self, key: bytes, raw: bytes, address: int, shareable: bool | None = None) -> Learned:
        v = self.prover.verify(raw, address)
        if shareable is None:
            shareable = (v.full_key is not None or v.finding.method == "policy") and not per_instance(key)
        c = to_cached(v.finding, shareable)
        learned = Learned(c, address, v.finding)
        self.learned[key] = learned
        self.new_findings[key] = c
        self.derivations[key] = v.full_key
        if not shareable:  # the representative is also its own exact instance (see ``finding``)
            exact = self._exact(key, address)
            if exact not in self.learned:
                self.learned[exact] = Learned(to_cached(v.finding, True), address, v.finding)
                self.new_findings[exact] = self.learned[exact].cached
        return learned

    def accept(self, learned: dict[bytes, Learned]) -> None:
        """Findings other workers made for keys of this worker's functions."""
        self.learned.update(learned)
        self._forget_plain()

    def harvest(self) -> tuple[dict[bytes, CachedFinding], dict[bytes, CachedProof], dict[bytes, bytes | None],
                               dict[bytes, dict[tuple, object]]]:
        """The findings, proofs and derivations made here since the last harvest, for the persistent
        cache, and the jump answers learned (``engine.jumps.JumpMemory``) by their jump tag.  (Kept rows
        are written by the worker itself, ``write``.)"""
        findings, proofs, derivations = self.new_findings, self.prover.new_proofs, self.derivations
        self.new_findings, self.prover.new_proofs, self.derivations = {}, {}, {}
        kept = {k: f for k, f in findings.items() if f.method not in NOT_KEPT}
        memory = self.__dict__.get("_jump_answers")
        jumps = {memory[0]: memory[1].take_new()} if memory is not None and memory[1].new else {}
        return kept, proofs, {k: v for k, v in derivations.items() if k in kept}, jumps

    # -- findings ------------------------------------------------------------------
    def finding(self, raw: bytes, address: int, key: bytes) -> Finding:
        """The finding of one instruction instance."""
        hit = self.lookup(key)
        if hit is None:
            hit = self._learn(key, raw, address)
        if hit.address == address and hit.finding is not None:
            return hit.finding
        if hit.cached.per_instance:
            # No finding stands for the key: this instance is proved on its own, and its
            # finding kept under the key plus the exact addresses (A and T).
            exact = self._exact(key, address)
            hit = self.lookup(exact)
            if hit is None:
                hit = self._learn(exact, raw, address, shareable=True)
            return hit.finding if hit.address == address and hit.finding is not None else _own(hit.shared, raw, address)
        return _own(hit.shared, raw, address)

    def _exact(self, key: bytes, address: int) -> bytes:
        """The key of one instance (its key plus the exact A and T), for keys no finding stands for."""
        return key + b"@" + address.to_bytes(8, "little") + self.job.tramp.to_bytes(8, "little")

    def learn_ids(self, final: dict[int, int]) -> None:
        """The store's ids for this worker's provisional outcome ids (see ``OutcomeIds``)."""
        self.ids.learn(final)
        self.kept.forget_ids()
        self._forget_plain()
        for learned in self.learned.values():
            if learned.ids is not None and learned.ids[0] in final:
                learned.ids = None
                learned.plain = None

    def close(self) -> None:
        self.close_shard()
        self.stored_rows_done()
        self.kept.flush(self.job.cache_dir)
        self.kept.close()


def replace_reason(f: Finding, reason: str) -> Finding:
    return replace(f, reason=reason)


class OutcomeIds:
    """Outcome and variant name ids as a worker knows them, without ever writing to the store.

    An outcome the store already had when the run began (``Job.outcomes``), or an outcome or a
    variant name the run's parent has since numbered (``learn``), has its store id.  A new one gets
    a provisional negative id, unique across processes; every shard the worker writes defines all
    its provisional ids still in use, the merge numbers them in the store and maps the rows
    (``store.shard``), and the worker learns the store ids between phases.  So workers take no lock
    on the store, and never wait for one another.  (Variant names start provisional: the store's
    are not sent with the job, since a package's store holds tens of thousands, which every image's
    job would carry, and the merge finds a name's id by its text as cheaply.)"""

    def __init__(self, known: dict[tuple, tuple[int, str]]):
        self.known = dict(known)  # outcome tuple -> (id, reason of the outcome)
        self.provisional: dict[int, tuple[tuple, str]] = {}  # provisional id -> (outcome tuple, reason)
        self.by_id: dict[int, tuple[tuple, str]] = {oid: (t, reason) for t, (oid, reason) in known.items()}
        self.names: dict[str, int] = {}  # variant name -> id
        self.name_of: dict[int, str] = {}
        self.new_names: dict[int, str] = {}  # provisional id -> variant name
        self.counter = 0
        self._new: list[tuple[int, tuple, str]] = []  # provisional outcomes defined since ``take_new``
        self._new_names: list[tuple[int, str]] = []  # provisional variant names defined since ``take_new``

    def outcome(self, f: Finding) -> tuple[int, str]:
        hit = self.known.get(f.outcome)
        return self.define(f.outcome, f.reason) if hit is None else hit

    def _pid(self) -> int:
        self.counter += 1
        return -((os.getpid() << 24) | self.counter)

    def define(self, outcome: tuple, reason: str) -> tuple[int, str]:
        """The id of an outcome (its fields, ``Finding.outcome``), numbered provisionally with ``reason``
        when new."""
        hit = self.known.get(outcome)
        if hit is None:
            pid = self._pid()
            hit = self.known[outcome] = (pid, reason)
            self.provisional[pid] = self.by_id[pid] = (outcome, reason)
            self._new.append((pid, outcome, reason))
        return hit

    def name(self, text: str) -> int:
        """The id of a variant name, numbered provisionally when new."""
        i = self.names.get(text)
        if i is None:
            i = self.names[text] = self._pid()
            self.name_of[i] = self.new_names[i] = text
            self._new_names.append((i, text))
        return i

    def name_text(self, i: int) -> str:
        return self.name_of[i]

    def described(self, oid: int) -> tuple[tuple, str]:
        """(outcome tuple, reason) of an id."""
        return self.by_id[oid]

    def definitions(self) -> list[tuple[int, tuple, str]]:
        """(provisional id, outcome tuple, reason) of every provisional outcome id not yet learned."""
        return [(pid, outcome, reason) for pid, (outcome, reason) in self.provisional.items()]

    def name_definitions(self) -> list[tuple[int, str]]:
        """(provisional id, variant name) of every provisional name id not yet learned."""
        return list(self.new_names.items())

    def take_new(self) -> tuple[list[tuple[int, tuple, str]], list[tuple[int, str]]]:
        """The provisional outcomes and variant names defined since the last call (``definitions``,
        ``name_definitions`` for those defined before and not yet learned)."""
        new, names = self._new, self._new_names
        self._new, self._new_names = [], []
        return new, names

    def learn(self, final: dict[int, int]) -> None:
        for outcome, (oid, reason) in list(self.known.items()):
            if oid in final:
                self.known[outcome] = (final[oid], reason)
                self.by_id[final[oid]] = (outcome, reason)
                self.provisional.pop(oid, None)
        for pid in [p for p in self.new_names if p in final]:
            text = self.new_names.pop(pid)
            self.names[text] = final[pid]
            self.name_of[final[pid]] = text
        self._new = [d for d in self._new if d[0] not in final]
        self._new_names = [d for d in self._new_names if d[0] not in final]


_U32 = 1 << 32  # a packed row's proof time saturates below it (71 minutes)


class _Batch:
    """A ``RowBatch`` being filled."""

    def __init__(self):
        self.functions: list[int] = []
        self.packed: list[tuple] = []
        self.n_packed = 0
        self.full: list[tuple] = []
        self.variants: list[tuple] = []
        self.seals: list[tuple[int, bytes]] = []  # (function, its seal) of the functions copied (``RowKeeper.reuse``)
        self.seal_outcomes: dict[int, str] = {}  # outcome id -> the reason those seals give it

    @property
    def n(self) -> int:
        return self.n_packed + len(self.full)

    def add_full(self, fid: int, off: int, n: int, oid: int, outcome_reason: str, f: Finding,
                 mask: int | None) -> None:
        self.full.append((fid, off, n, oid, None if f.reason == outcome_reason else f.reason, f.proof_us,
                          1 if f.fresh else 0, mask, f.answers, f.counterexample))

    def end_function(self, fid: int, count: list[int], kmap: dict[int, int], plain: array | None = None,
                     at_sites: array | None = None, names: dict[int, int] | None = None,
                     variants: array | None = None) -> None:
        """The function is done: its packed row (``store.packed_rows``) from its outcomes by its own index
        ``k`` (``kmap``) and how many instructions have each (``count``, by ``k``), its plain rows, their site
        masks, and its variants with the names by its own index ``j``."""
        self.functions.append(fid)
        if not kmap:
            return
        order = sorted(kmap, key=kmap.__getitem__)
        self.packed.append((fid, pack_wide_ids(order), pack_u32(count), pack_wide_ids(names) if names else None,
                            pack_u32(variants) if variants else None, pack_u32(at_sites) if at_sites else None,
                            pack_u32(plain) if plain else b""))
        if plain:
            self.n_packed += len(plain) // 3

    def end_packed(self, fid: int, order: list[int], counts: bytes, plain: bytes, at_sites: bytes,
                   names: dict[int, int], variants: bytes) -> None:
        """``end_function`` for a row ``row_pack.pack`` wrote: outcome ids by ``k``, and the columns packed."""
        self.functions.append(fid)
        if not order:
            return
        self.packed.append((fid, pack_wide_ids(order), counts, pack_wide_ids(names) if names else None,
                            variants or None, at_sites or None, plain))
        self.n_packed += len(plain) // 12

    def done(self, ids: OutcomeIds) -> RowBatch:
        """The batch to write (``Worker.write`` adds the definitions of the provisional ids its shard lacks)."""
        return RowBatch(self.functions, self.packed, self.full, self.variants, self.n, seals=self.seals,
                        seal_outcomes=self.seal_outcomes)


_DROPPED, _FULL, _FRESH = 1, 2, 4  # a special position's flags for ``row_pack.pack``


def _special_row(finding: Finding, ids: tuple[int, str], mask: int | None, into: tuple, batch, fid: int, off: int,
                 n: int) -> bool:
    """A special position's row for ``row_pack.pack`` (``into``: its outcome, proof µs, flags and site mask
    arrays): plain, or a full row of ``batch``; whether it is a plain row of a fresh finding."""
    s_oid, s_us, s_flags, s_mask = into
    oid = ids[0]
    s_oid.append(oid)
    s_mask.append(mask or 0)
    if finding.answers is None and finding.counterexample is None and finding.reason == ids[1]:
        us = finding.proof_us
        s_us.append(us if us < _U32 else _U32 - 1)
        s_flags.append(_FRESH if finding.fresh else 0)
        return finding.fresh
    s_us.append(0)
    s_flags.append(_FULL)
    batch.add_full(fid, off, n, oid, ids[1], finding, mask)
    return False


def _walked_row(finding: Finding, ids: tuple[int, str], mask: int | None, kmap: dict[int, int], count: list[int],
                plain: array, at_sites: array, batch, fid: int, off: int, n: int) -> bool:
    """An instruction's row in the walk: its outcome numbered (``kmap``, ``count``), then a plain row (with its
    site mask in ``at_sites``) or a full row of ``batch``; whether it is a plain row of a fresh finding."""
    oid = ids[0]
    k = kmap.get(oid)
    if k is None:
        k = kmap[oid] = len(count)
        count.append(1)
    else:
        count[k] += 1
    if finding.answers is None and finding.counterexample is None and finding.reason == ids[1]:
        us = finding.proof_us
        plain.extend((off, n | (16 if finding.fresh else 0) | k << 5, us if us < _U32 else _U32 - 1))
        if mask is not None:
            at_sites.extend((off, mask))
        return finding.fresh
    batch.add_full(fid, off, n, oid, ids[1], finding, mask)
    return False


def _site_positions(here, offs: list[int], lengths: bytes, start: int) -> dict[int, list]:
    """position -> the sites overlapping that instruction (``offs``: the running offsets, one more than
    ``lengths``), in the order a walk in address order meets them: by address, then by kind when several
    overlap (as ``_SiteSweep`` gives them); positions without a site are absent."""
    out: dict[int, list] = {}
    last = len(lengths)
    for site in sorted(here, key=lambda s: s.address):
        lo, hi = site.address - start, site.address + site.length - start
        i = max(bisect_right(offs, lo) - 1, 0)  # the instruction that holds lo, or the first after it
        if i < last and offs[i] + lengths[i] <= lo:
            i += 1
        while i < last and offs[i] < hi:
            out.setdefault(i, []).append(site)
            i += 1
    for found in out.values():
        if len(found) > 1:
            found.sort(key=lambda s: kind_key(s.kind))
    return out


def _site_split(at_site: dict[int, list]) -> tuple[set[int], array]:
    """The positions at sites split: those whose sites do more than mark them (the per-instruction path takes
    them), and (position, mask) of those the sites only mark, ascending (``row_pack.pack`` gives them their
    key's row with the mask, unless the per-instruction path takes them for another reason)."""
    forced: set[int] = set()
    marked: list[tuple[int, int]] = []
    for i, sites in at_site.items():
        how, mask = _site_effect(tuple([site.kind for site in sites]))
        if how == _MARK:
            marked.append((i, mask or 0))
        else:
            forced.add(i)
    marks = array("I")
    for pair in sorted(marked):
        marks.extend(pair)
    return forced, marks


_MARK, _REJECT, _VARIANTS = 0, 1, 2


@lru_cache(maxsize=None)
def _site_effect(kinds: tuple[str, ...]) -> tuple[int, int | None]:
    """What a set of sites over an instruction does to its finding (``site_verdicts.site_finding``): nothing
    (every kind marks: ``.init.text``, entry points), a rejection that depends on the finding and the kinds
    alone, or variants to verify; and the mask the store keeps of them.  Remembered by kinds (a kernel has a
    few dozen combinations)."""
    consequences = {POLICY_BY_KIND[k].consequence if k in POLICY_BY_KIND else "mark" for k in kinds}
    how = _VARIANTS if consequences - {"mark", "reject"} else _REJECT if "reject" in consequences else _MARK
    return how, site_mask(kinds)


class _Numbering(dict):
    """Keys numbered in the order first asked for."""

    def __missing__(self, key: bytes) -> int:
        n = self[key] = len(self)
        return n




class _SiteSweep:
    """The sites overlapping each instruction of a function, for instructions
    visited in address order: one pass over the function's sites."""

    def __init__(self, found):
        self.pending = sorted(found, key=lambda s: s.address)
        self.next = 0
        self.active: list = []

    def __bool__(self) -> bool:
        return bool(self.pending)

    def next_start(self) -> int | None:
        """Where the next call of ``at`` may find a site (None: no site left at all)."""
        if self.active:
            return -1
        return self.pending[self.next].address if self.next < len(self.pending) else None

    def at(self, address: int, length: int) -> list:
        end = address + length
        pending = self.pending
        while self.next < len(pending) and pending[self.next].address < end:
            self.active.append(pending[self.next])
            self.next += 1
        if not self.active:
            return []
        self.active = [s for s in self.active if s.address + s.length > address]
        return sorted(self.active, key=lambda s: kind_key(s.kind)) if len(self.active) > 1 else list(self.active)
