"""The result store: one SQLite file, schema 4.

Tables (integer keys throughout; ``schema.sql`` is the exact text):

  meta             ``application = relocverify`` and ``schema = 4``: what makes a file a store
  images           one row per image: sha256, path, format, symbol source
  runs             one row per run: configuration, versions, status, summary, pid and host
  functions        one row per function: start, size, name, section, its bytes, and the
                   configuration its rows were verified under (NULL: not yet verified)
  outcomes         (verdict, method, plan kind, rule, class, reason key) shared by all rows,
                   with the reason text of the first instruction that had it
  packed           one row per function (``store.packed_rows``): its outcomes by its own index
                   ``k`` with their instruction counts, its plain instructions (no instance
                   reason, no answers, no counterexample: nearly all of them) as one blob of
                   ``PACKED_ROW`` records (offset, length, fresh, k, proof µs), the kernel site
                   kinds of those at sites, and its instructions' live variants; 3.6 million
                   rows, instructions and variants, are 46 thousand to write, merge and read
  instructions     the other instructions, one row each, keyed by (function, offset): length,
                   outcome, the instance reason only where it differs from its outcome's, the
                   proof time in µs, fresh (proved for it in its run) or cached, the kernel site
                   kinds (a bitmask over ``SITE_KINDS``), the decoders' answers where they
                   disagree (JSON), and a counterexample id
  variants         a live variant whose finding has a reason of its own (the others are packed);
                   names of variants in ``variant_names``
  replacements     every instruction of every alternative's replacement, at its live address
  counterexamples  concrete inputs, the differences, and the replay command line
  jump_packed      (written by ``--jump-probes``) per function, whether a jump-optimized
                   probe can sit at each of its instructions: a bucket in ``jump_buckets``
                   (``eligible``, or the refusal's key, with the first reason seen as its
                   example), packed (``store.jump_rows``: the function's bucket ids, and per
                   instruction its offset and the index of its bucket among them)
  jump_probes      the same, one row per instruction, as stores before ``jump_packed`` kept
                   it: still read, no longer written

An instruction's address is its function's start plus its offset; its
bytes are the function's bytes at that offset.

Nothing is half-written: a function's instruction rows, its packed row and its
verified marker are written in one transaction, so after any interruption
(Ctrl-C, kill -9, power loss) a function is either wholly stored or not at
all, and a rerun verifies exactly the functions missing.  SQLite's WAL
journal makes each commit durable and atomic.  Several processes may write
at once (each worker commits its own functions); SQLite serialises them.

A file that is not a store, or a store of another schema, is refused
untouched: ``Store`` reads ``meta`` before it writes anything.

Two faces: ``Results`` is the read model (``ImageReads``, ``RowReads``, ``JumpReads``, ``SealChecks``: what
report, show, export, gate and the audit read); ``Store`` adds the narrow writer the engine uses (images,
runs, functions, shard merges, replacements, jump probes, passes' rows).  ``Results(path)`` opens a store
for reading alone (no lock, no write, no writer's method); ``Store(path)`` opens or makes one to write.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import queue
import socket
import sqlite3
import struct
import threading
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from ..errors import InputError, StoreError
from ..inputs import input_file
from ..processes import alive
from ..proof.verdict import Verdict
from . import row_seals, shard
from .forking import sqlite_work
from .jump_rows import JumpRow, pack_ids
from .native_tally import TALLY
from .schema import schema_sql
from .packed_rows import (
    FRESH_BIT,
    K_SHIFT,
    LENGTH_MASK,
    PACKED_ROW,
    site_masks,
    unpack_ids,
    unpack_u32,
    variant_triples,
)

SCHEMA_VERSION = 4

#: Tables added to schema 2 without changing it (``CREATE ... IF NOT EXISTS``): a store written
#: before them is still read, and gains them when first opened for writing.
JUMP_TABLES = """
CREATE TABLE IF NOT EXISTS jump_buckets (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, example TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jump_probes (
    function INTEGER NOT NULL, offset INTEGER NOT NULL, bucket INTEGER NOT NULL,
    PRIMARY KEY (function, offset)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS jump_packed (
    function INTEGER PRIMARY KEY, buckets BLOB NOT NULL, offsets BLOB NOT NULL, indexes BLOB NOT NULL);
"""
CACHE_KIB = 32 * 1024
APPLICATION = "relocverify"
APPLICATION_ID = 0x52565354  # SQLite's application_id of a result store ('RVST'); meta says it too
MASK64 = (1 << 64) - 1

#: The kernel site kinds, in bit order of ``instructions.sites``.  Append only.
SITE_KINDS = ("extable", "bug", "kcfi", "kprobe_blacklist", "noinstr", "entry", "kprobes_text",
              "alt_replacement", "static_call_tramp", "alternative", "paravirt", "retpoline", "return_thunk",
              "fentry", "static_call", "jump_label", "smp_lock", "irqentry", "softirqentry", "cpuidle",
              "indirect_thunk", "init_text", "call_site", "cfi", "endbr_seal", "call_depth")
SITE_BIT = {kind: 1 << i for i, kind in enumerate(SITE_KINDS)}


def site_mask(kinds: Iterable[str]) -> int | None:
    mask = 0
    for k in kinds:
        mask |= SITE_BIT.get(k, 0)
    return mask or None


def site_kinds(mask: int | None) -> tuple[str, ...]:
    if not mask:
        return ()
    return tuple(k for k, bit in SITE_BIT.items() if mask & bit)


def signed(v: int) -> int:
    """SQLite integers are signed 64-bit: kernel addresses are stored two's-complement."""
    v &= MASK64
    return v - (1 << 64) if v >= 1 << 63 else v


def unsigned(v: int) -> int:
    return v + (1 << 64) if v < 0 else v


#: The rows of passes (``engine.passes``): one JSON list of a function's rows per (function, pass); made when a
#: pass first writes, so the stores of runs without passes are as they were.
PASS_TABLES = """
CREATE TABLE IF NOT EXISTS pass_rows (
    function INTEGER NOT NULL, pass TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (function, pass)) WITHOUT ROWID;
"""


@dataclass(frozen=True)
class FunctionRecord:
    id: int
    start: int
    size: int
    name: str
    section: str


@dataclass(frozen=True)
class InstructionRow:
    """One stored instruction, joined with its function and outcome (its verdict a ``Verdict``)."""

    address: int
    length: int
    raw: bytes
    function: str
    function_start: int
    section: str
    verdict: Verdict
    method: str
    plan_kind: str
    rule: str
    klass: str
    reason_key: str
    reason: str
    proof_us: int
    fresh: bool
    sites: tuple[str, ...]
    answers: str | None
    counterexample: int | None


class ImageReads:
    """The store's images, runs and functions as readers see them: what was verified, under which configuration, with
    which summary.  A part of the read model (``Results``); needs ``self.db``."""

    def find_image(self, sha256: str | None = None) -> int | None:
        """The id of the image with ``sha256``, or of the newest image when None."""
        if sha256 is None:
            row = self.db.execute("SELECT id FROM images ORDER BY id DESC LIMIT 1").fetchone()
        else:
            row = self.db.execute("SELECT id FROM images WHERE sha256=?", (sha256,)).fetchone()
        return None if row is None else row[0]

    def image_info(self, image: int) -> dict:
        row = self.db.execute("SELECT sha256, path, format, symbol_source, info FROM images WHERE id=?",
                              (image,)).fetchone()
        if row is None:
            raise StoreError(f"{self.path}: no image {image}")
        return {"sha256": row[0], "path": row[1], "format": row[2], "symbols": row[3], **json.loads(row[4] or "{}")}

    def last_summary(self, image: int, config: str, limit: int | None = None) -> dict | None:
        """The summary of the newest complete run of this image under this configuration and scope."""
        row = self.db.execute("SELECT summary, id FROM runs WHERE image=? AND config=? AND status='complete' "
                              "AND summary IS NOT NULL AND scope IS ? ORDER BY id DESC LIMIT 1",
                              (image, config, limit)).fetchone()
        if row is None or not row_seals.run_sealed(self.db, row[1]):
            return None  # a summary altered since its run (or from before seals): the run is made again
        return json.loads(row[0])

    def all_verified(self, image: int, config: str) -> bool:
        """True if the image has functions and every one is stored under ``config``."""
        row = self.db.execute("SELECT count(*), sum(c.text IS ?) FROM functions f LEFT JOIN configs c "
                              "ON c.id = f.config WHERE f.image=?", (config, image)).fetchone()
        return bool(row[0]) and row[0] == row[1]

    def runs(self, image: int | None = None) -> list[dict]:
        sql = "SELECT id, image, started, finished, status, config, versions FROM runs"
        args: tuple = ()
        if image is not None:
            sql += " WHERE image=?"
            args = (image,)
        return [{"id": r[0], "image": r[1], "started": r[2], "finished": r[3], "status": r[4],
                 "config": r[5], "versions": json.loads(r[6] or "{}")}
                for r in self.db.execute(sql + " ORDER BY id", args)]

    def stale_functions(self, image: int, config: str) -> set[int]:
        """Ids of the functions stored under another configuration than ``config``."""
        return {r[0] for r in self.db.execute("SELECT f.id FROM functions f JOIN configs c ON c.id = f.config "
                                              "WHERE f.image=? AND c.text!=?", (image, config))}

    def verified_functions(self, image: int, config: str) -> set[int]:
        """Ids of the functions whose rows are stored under ``config``."""
        return {r[0] for r in self.db.execute("SELECT f.id FROM functions f JOIN configs c ON c.id = f.config "
                                              "WHERE f.image=? AND c.text=?", (image, config))}

    def verified_functions_among(self, fids: list[int], config: str) -> set[int]:
        """Which of ``fids`` are stored under ``config``."""
        out: set[int] = set()
        for i in range(0, len(fids), 500):
            part = fids[i:i + 500]
            out |= {r[0] for r in self.db.execute(
                f"SELECT f.id FROM functions f JOIN configs c ON c.id = f.config WHERE c.text=? AND f.id IN "
                f"({','.join('?' * len(part))})", (config, *part))}
        return out

    def iter_functions(self, image: int) -> Iterator[FunctionRecord]:
        for i, s, z, n, sec in self.db.execute("SELECT id, start, size, name, section FROM functions "
                                               "WHERE image=? ORDER BY start, name", (image,)):
            yield FunctionRecord(i, unsigned(s), z, n, sec)

    def function_counts(self, image: int) -> Iterator[tuple[FunctionRecord, dict[str, int]]]:
        """Every function with its instruction counts by verdict (its packed row's counts)."""
        verdict_of = {oid: o[0].value for oid, o in self._outcome_fields().items()}
        counts = {fid: _by_verdict(oids, ns, verdict_of) for fid, _, oids, ns in self._packed_counts(image)}
        for f in self.iter_functions(image):
            yield f, counts.get(f.id, {})

    def _packed_counts(self, image: int) -> Iterator[tuple[int, str, array, array]]:
        """(function id, section, outcome ids by k, instructions by k) of the image's packed functions."""
        for fid, section, outcomes, ns in self.db.execute(
                "SELECT p.function, f.section, p.outcomes, p.counts FROM packed p JOIN functions f "
                "ON f.id = p.function WHERE f.image=?", (image,)):
            yield fid, section, unpack_ids(outcomes), unpack_u32(ns)

    def last_run(self, image: int) -> dict:
        """The newest run of the image, preferring one with a summary, with its configuration, versions and
        host ({} if none)."""
        row = self.db.execute("SELECT id, started, finished, status, config, versions, summary, host FROM runs "
                              "WHERE image=? ORDER BY (summary IS NOT NULL) DESC, id DESC LIMIT 1",
                              (image,)).fetchone()
        if row is None:
            return {}
        return {"id": row[0], "started": row[1], "finished": row[2], "status": row[3],
                "config": json.loads(row[4] or "{}"), "versions": json.loads(row[5] or "{}"),
                "summary": json.loads(row[6] or "{}"), "host": row[7]}

    def verified_function_count(self, image: int) -> int:
        """How many functions of the image a run has verified (stored with a configuration)."""
        return self.db.execute("SELECT count(*) FROM functions WHERE image=? AND config IS NOT NULL",
                               (image,)).fetchone()[0]

    def counts(self, image: int) -> Iterator[tuple]:
        """(section, verdict, method, plan kind, rule, class, reason key, n), from the functions' packed counts."""
        yield from self.tallies(image)[0]

    def tallies(self, image: int, sites: bool = False) -> tuple[list[tuple], dict[int, dict[str, int]], dict[int, int]]:
        """One scan of the image's packed counts (added up by integer ids, named once per outcome): the rows
        of ``counts``, per function with an instruction that is not proved its counts by verdict, and (``sites``)
        the packed rows' instructions per site mask, for ``site_counts``.  The adding up is ``tally.c``'s when it
        is built (0.12 s of Python over a kernel's 616 thousand pairs, 0.005 s in C), else ``add_counts``."""
        fields = self._outcome_fields()
        verdict_of = {oid: o[0].value for oid, o in fields.items()}
        weak = frozenset(oid for oid, v in verdict_of.items() if v != Verdict.PROVED.value)
        packed = self.db.execute(f"SELECT p.function, f.section, p.outcomes, p.counts{', p.sites' if sites else ''} "
                                 "FROM packed p JOIN functions f ON f.id = p.function WHERE f.image=?",
                                 (image,)).fetchall()
        by_section, weak_rows, masks = (TALLY.add if TALLY is not None else add_counts)(packed, weak)
        weak_functions = {fid: _by_verdict(unpack_ids(oids), unpack_u32(cs), verdict_of)
                          for fid, _, oids, cs, *_ in weak_rows}
        rows = [(section, fields[oid][0].value) + fields[oid][1:6] + (n,)
                for section, per in sorted(by_section.items()) for oid, n in sorted(per.items()) if n]
        return rows, weak_functions, masks

    def function_names(self, image: int) -> dict[int, str]:
        return dict(self.db.execute("SELECT id, name FROM functions WHERE image=?", (image,)))

    def site_counts(self, image: int, packed: dict[int, int] | None = None) -> Iterator[tuple[int, int]]:
        """(site kinds mask, instructions) over the instructions at kernel sites: the packed rows' masks (``packed``:
        as ``tallies(image, sites=True)`` counted them) and the full rows'."""
        totals = Counter(dict(self.db.execute(
            "SELECT i.sites, count(*) FROM instructions i JOIN functions f ON f.id = i.function "
            "WHERE i.sites IS NOT NULL AND f.image=? GROUP BY 1", (image,))))
        if packed is None:
            packed = Counter(unpack_u32(b"".join(blob for (blob,) in self.db.execute(
                "SELECT p.sites FROM packed p JOIN functions f ON f.id = p.function WHERE f.image=? "
                "AND p.sites IS NOT NULL", (image,))))[1::2])
        totals.update(packed)
        yield from sorted(totals.items())


class RowReads:
    """Every instruction's row, its outcome, variants and counterexample, as ``report``, ``show``, ``export``, ``gate``
    and the audit read them.  A part of the read model (``Results``); needs ``self.db``."""

    # A function's plain rows, its outcomes and counts, its sites and variants are its row of ``packed``
    # (``store.packed_rows``), its outcomes named by the function's own index ``k``; the other rows are rows
    # of ``instructions``, named by store id.  Readers put the two together by offset.
    _FULL_SQL = ("SELECT i.function, i.offset, i.length, i.outcome, i.reason, i.proof_us, i.fresh, i.sites, "
                 "i.answers, i.cex FROM instructions i ")

    def _outcome_fields(self, need: Iterable[int] = ()) -> dict[int, tuple]:
        """outcome id -> (verdict, method, plan kind, rule, class, reason key, reason), read once per Store
        and again when an id in ``need`` is new (a merge added outcomes)."""
        if self._outcomes is None or any(o not in self._outcomes for o in need):
            self._outcomes = {r[0]: (Verdict(r[1]),) + tuple(r[2:]) for r in self.db.execute(
                "SELECT id, verdict, method, plan_kind, rule, klass, reason_key, reason FROM outcomes")}
        return self._outcomes

    def outcome_ids(self) -> dict[tuple, int]:
        return {tuple(r[1:]): r[0] for r in self.db.execute(
            "SELECT id, verdict, method, plan_kind, rule, klass, reason_key FROM outcomes")}

    def outcome_reasons(self) -> dict[int, str]:
        return dict(self.db.execute("SELECT id, reason FROM outcomes"))

    def _outcome(self, memo: dict, f) -> tuple[int, str]:
        """The outcome id of a finding, and that outcome's reason text (its first instance's)."""
        return self._outcome_row(memo, f.outcome, f.reason)

    def outcome_ids_now(self) -> dict[tuple, tuple[int, str]]:
        """Every outcome already stored: (verdict, method, plan kind, rule, class, reason key) -> (id, reason)."""
        return {tuple(r[1:7]): (r[0], r[7]) for r in self.db.execute(
            "SELECT id, verdict, method, plan_kind, rule, klass, reason_key, reason FROM outcomes")}

    def _rows_of(self, start: int, name: str, section: str, code: bytes, packed: tuple | None,
                 full: list[tuple], only: frozenset[int] | None = None) -> list[InstructionRow]:
        """The rows of one function in offset order: its packed rows (``packed`` its (outcomes, sites, data)
        columns) and its full rows; with ``only``, the rows whose outcome id is in it."""
        kmap = unpack_ids(packed[0]) if packed else ()
        outcomes = self._outcome_fields(list(kmap) + [r[3] for r in full])
        rows: list[tuple[int, InstructionRow]] = []
        if packed and packed[2]:
            masks = site_masks(packed[1]) if packed[1] else None
            for off, word, us in struct.iter_unpack(PACKED_ROW, packed[2]):
                oid = kmap[word >> K_SHIFT]
                if only is not None and oid not in only:
                    continue
                n = word & LENGTH_MASK
                o = outcomes[oid]
                sites = site_kinds(masks.get(off)) if masks else ()
                rows.append((off, InstructionRow(start + off, n, code[off:off + n], name, start, section, o[0], o[1],
                                                 o[2], o[3], o[4], o[5], o[6], us, bool(word & FRESH_BIT), sites,
                                                 None, None)))
        for _, off, n, oid, reason, us, fresh, sites, answers, cex in full:
            if only is not None and oid not in only:
                continue
            o = outcomes[oid]
            rows.append((off, InstructionRow(start + off, n, bytes(code[off:off + n]), name, start, section, o[0],
                                             o[1], o[2], o[3], o[4], o[5], reason if reason is not None else o[6],
                                             us, bool(fresh), site_kinds(sites), answers, cex)))
        if packed and full:
            rows.sort(key=lambda r: r[0])
        return [r for _, r in rows]

    def _functions_rows(self, where: str, args: tuple, only: frozenset[int] | None = None) -> Iterator[InstructionRow]:
        """The rows of the functions ``SELECT ... FROM functions f WHERE <where>`` picks, in (start, name)
        order: two index-backed scans (functions with their packed rows, the full rows)."""
        full: dict[int, list[tuple]] = {}
        for r in self.db.execute(self._FULL_SQL + f"JOIN functions f ON f.id = i.function WHERE {where} "
                                 "ORDER BY i.function, i.offset", args):
            full.setdefault(r[0], []).append(r)
        for fid, start, name, section, code, outcomes, sites, data in self.db.execute(
                "SELECT f.id, f.start, f.name, f.section, f.bytes, p.outcomes, p.sites, p.data FROM functions f "
                f"LEFT JOIN packed p ON p.function = f.id WHERE {where} ORDER BY f.start, f.name", args):
            if outcomes is None and fid not in full:
                continue
            yield from self._rows_of(unsigned(start), name, section, bytes(code),
                                     None if outcomes is None else (outcomes, sites, data), full.get(fid, []), only)

    def function_verdicts(self, image: int) -> Iterator[tuple[int, int, str, bytes, list[tuple]]]:
        """Per function of the image with stored rows, in (start, name) order: (id, start, name, bytes,
        [(offset, length, verdict, site mask or None)] by offset): what a pass over a whole image needs,
        without an ``InstructionRow`` per instruction."""
        verdict_of = {oid: o[0] for oid, o in self._outcome_fields().items()}
        full: dict[int, list[tuple]] = {}
        for fid, off, n, oid, sites in self.db.execute(
                "SELECT i.function, i.offset, i.length, i.outcome, i.sites FROM instructions i "
                "JOIN functions f ON f.id = i.function WHERE f.image=?", (image,)):
            full.setdefault(fid, []).append((off, n, verdict_of[oid], sites))
        for fid, start, name, code, outcomes, sites, data in self.db.execute(
                "SELECT f.id, f.start, f.name, f.bytes, p.outcomes, p.sites, p.data FROM functions f "
                "LEFT JOIN packed p ON p.function = f.id WHERE f.image=? ORDER BY f.start, f.name", (image,)):
            if outcomes is None and fid not in full:
                continue
            verdicts = [verdict_of[oid] for oid in unpack_ids(outcomes)]
            masks = site_masks(sites)
            rows = [(off, word & LENGTH_MASK, verdicts[word >> K_SHIFT], masks.get(off))
                    for off, word, _ in struct.iter_unpack(PACKED_ROW, data or b"")] + full.get(fid, [])
            rows.sort(key=lambda r: r[0])
            yield fid, unsigned(start), name, bytes(code), rows

    def instruction_at(self, image: int, address: int) -> InstructionRow | None:
        """The instruction starting at ``address``: the functions that may hold it (the functions table's
        index), the earliest-starting one with a row at that offset."""
        maxsize = self.db.execute("SELECT max(size) FROM functions WHERE image=?", (image,)).fetchone()[0] or 0
        lo, a = signed(address - maxsize), signed(address)
        if lo > a:  # wrapped below the signed range: the lower bound is meaningless
            lo = -(1 << 63)
        for fid, start in list(self.db.execute("SELECT id, start FROM functions WHERE image=? AND start BETWEEN ? AND ? "
                                               "AND start + size > ? ORDER BY start, name", (image, lo, a, a))):
            offset = a - start
            for row in self.function_rows(fid):
                if row.address - row.function_start == offset:
                    return row
        return None

    def results_digest(self, image: int) -> str:
        """SHA-256 over what a run decided for every instruction of the image, in address order: address,
        length, bytes, function, section, verdict, method, plan kind, rule, class, reason and its key, sites,
        the decoders' answers and whether a counterexample is kept; then every live variant's name, verdict
        and reason, and every alternative replacement's rows.  Proof times and fresh marks are left out (they
        say when and where a proof was made, not what it decided).  Two stores agree on it exactly when every
        reader of results gives the same answers (``corpora/expected``: the recorded kernel's)."""
        digest = hashlib.sha256()
        for r in self.iter_rows(image):
            digest.update(repr((r.address, r.length, r.raw, r.function, r.section, r.verdict.value, r.method,
                                r.plan_kind, r.rule, r.klass, r.reason_key, r.reason, r.sites, r.answers,
                                r.counterexample is not None)).encode())
        starts = {fid: unsigned(start) for fid, start in
                  self.db.execute("SELECT id, start FROM functions WHERE image=?", (image,))}
        variants = {starts[fid] + off: found for (fid, off), found in self.image_variants(image).items()}
        for address in sorted(variants):
            digest.update(repr((address, variants[address])).encode())
        digest.update(repr(sorted(map(repr, self.replacement_rows(image)))).encode())
        return digest.hexdigest()

    def iter_rows(self, image: int) -> Iterator[InstructionRow]:
        """Every instruction of the image, in address order (functions by start, then name)."""
        yield from self._functions_rows("f.image=?", (image,))

    def function_rows(self, function: int) -> list[InstructionRow]:
        return list(self._functions_rows("f.id=?", (function,)))

    def rows_with(self, image: int, verdict: str, reason_key: str | None = None) -> Iterator[InstructionRow]:
        """The instructions with a verdict (and reason key): outcome ids, then the functions whose
        packed row names one of them (its small ``outcomes`` column), then their rows."""
        sql = "SELECT id FROM outcomes WHERE verdict=?"
        args: tuple = (verdict,)
        if reason_key is not None:
            sql += " AND reason_key=?"
            args += (reason_key,)
        ids = frozenset(r[0] for r in self.db.execute(sql, args))
        if not ids:
            return
        fids = [fid for fid, outcomes in self.db.execute(
            "SELECT p.function, p.outcomes FROM packed p JOIN functions f ON f.id = p.function WHERE f.image=?",
            (image,)) if not ids.isdisjoint(unpack_ids(outcomes))]
        for i in range(0, len(fids), 500):
            part = fids[i:i + 500]
            yield from self._functions_rows(f"f.id IN ({','.join('?' * len(part))})", tuple(part), ids)

    def variants_at(self, function: int, offset: int) -> list[tuple[str, str, str]]:
        """(variant name, verdict, reason) of each live variant of an instruction at a boot-patched site."""
        return self._variants(self.db.execute("SELECT function, outcomes, names, variants FROM packed WHERE function=?",
                                              (function,)),
                              self.db.execute("SELECT function, offset, name, outcome, reason FROM variants "
                                              "WHERE function=? AND offset=?", (function, offset))).get(
            (function, offset), [])

    def image_variants(self, image: int) -> dict[tuple[int, int], list[tuple[str, str, str]]]:
        """(function id, offset) -> [(variant name, verdict, reason)] for every boot-patched site of the image."""
        return self._variants(
            self.db.execute("SELECT p.function, p.outcomes, p.names, p.variants FROM packed p "
                            "JOIN functions f ON f.id = p.function WHERE f.image=? AND p.variants IS NOT NULL",
                            (image,)),
            self.db.execute("SELECT v.function, v.offset, v.name, v.outcome, v.reason FROM variants v "
                            "JOIN functions f ON f.id = v.function WHERE f.image=?", (image,)))

    def _variants(self, packed, rows) -> dict[tuple[int, int], list[tuple[str, str, str]]]:
        """(function id, offset) -> [(name, verdict, reason)] by name, from packed rows' (function, outcomes,
        names, variants) and rows of ``variants``."""
        outcomes = self._outcome_fields()
        names = dict(self.db.execute("SELECT id, name FROM variant_names"))
        out: dict[tuple[int, int], list[tuple[str, str, str]]] = {}
        for fid, kmap, nmap, triples in packed:
            kmap, nmap = unpack_ids(kmap), unpack_ids(nmap)
            for off, j, k in variant_triples(triples):
                o = outcomes[kmap[k]]
                out.setdefault((fid, off), []).append((names[nmap[j]], o[0].value, o[6]))
        for fid, off, name, oid, reason in rows:
            o = self._outcome_fields([oid])[oid]
            out.setdefault((fid, off), []).append((names[name], o[0].value, o[6] if reason is None else reason))
        for found in out.values():
            found.sort()
        return out

    def disagreement_answers(self, image: int) -> dict[tuple[str, int], str]:
        """(function name, offset) -> the decoders' answers (JSON), for every row where the decoders disagree."""
        return {(name, off): answers for name, off, answers in self.db.execute(
            "SELECT f.name, i.offset, i.answers FROM instructions i JOIN functions f ON f.id = i.function "
            "WHERE i.answers IS NOT NULL AND f.image=?", (image,))}

    def counterexample(self, cex: int) -> dict | None:
        r = self.db.execute("SELECT state, differences, replay FROM counterexamples WHERE id=?", (cex,)).fetchone()
        if r is None:
            return None
        return {"state": json.loads(r[0]), "differences": json.loads(r[1]), "replay": r[2]}

    def replacement_rows(self, image: int) -> list[tuple]:
        """(alternative index, site, address, bytes, verdict, reason), in table order."""
        return [(k, unsigned(s), unsigned(a), bytes(b), v, reason) for k, s, a, b, v, reason in self.db.execute(
            "SELECT r.alt, r.site, r.address, r.bytes, o.verdict, r.reason FROM replacements r JOIN outcomes o "
            "ON o.id = r.outcome WHERE r.image=? ORDER BY r.alt, r.address", (image,))]


class JumpReads:
    """The jump-probe answers and the passes' rows (``engine.passes``).  A part of the read model (``Results``); needs
    ``self.db``."""

    def functions_without_pass(self, image: int, name: str) -> list[int]:
        """The image's functions that pass ``name`` has no rows for, by address."""
        if not self._has_table("pass_rows"):
            return [r[0] for r in self.db.execute("SELECT id FROM functions WHERE image=? ORDER BY start, name",
                                                  (image,))]
        return [r[0] for r in self.db.execute(
            "SELECT id FROM functions f WHERE image=? AND NOT EXISTS "
            "(SELECT 1 FROM pass_rows p WHERE p.function = f.id AND p.pass = ?) ORDER BY start, name", (image, name))]

    def iter_pass_rows(self, image: int, name: str):
        """Every row pass ``name`` stored for the image's functions, as lists, function by function."""
        if not self._has_table("pass_rows"):
            return
        for (data,) in self.db.execute("SELECT p.data FROM pass_rows p JOIN functions f ON f.id = p.function "
                                       "WHERE f.image=? AND p.pass=? ORDER BY f.start, f.name", (image, name)):
            yield from json.loads(data)

    def _has_table(self, name: str) -> bool:
        return self.db.execute("SELECT 1 FROM sqlite_schema WHERE type='table' AND name=?", (name,)).fetchone() is not None

    def functions_without_jump_probes(self, image: int) -> list[int]:
        return [r[0] for r in self.db.execute(
            "SELECT id FROM functions f WHERE image=? "
            "AND NOT EXISTS (SELECT 1 FROM jump_packed p WHERE p.function = f.id) "
            "AND NOT EXISTS (SELECT 1 FROM jump_probes j WHERE j.function = f.id) ORDER BY start, name", (image,))]

    def jump_probe_counts(self, image: int) -> dict[str, int]:
        """Bucket name -> instructions, over the image's instructions that have an answer, most first."""
        counts: dict[int, int] = dict(self.db.execute(
            "SELECT j.bucket, count(*) FROM jump_probes j JOIN functions f ON f.id = j.function WHERE f.image=? "
            "GROUP BY j.bucket", (image,)))
        if self._has_packed_jumps():
            for ids, indexes in self.db.execute("SELECT p.buckets, p.indexes FROM jump_packed p "
                                                "JOIN functions f ON f.id = p.function WHERE f.image=?", (image,)):
                for k, bucket in enumerate(unpack_u32(ids)):
                    counts[bucket] = counts.get(bucket, 0) + indexes.count(k)
        names = dict(self.db.execute("SELECT id, name FROM jump_buckets"))
        return {names[b]: n for b, n in sorted(counts.items(), key=lambda item: (-item[1], names[item[0]]))}

    def jump_probe_at(self, function: int, offset: int) -> tuple[str, str] | None:
        """(bucket, its example reason) of one instruction, or None when not analysed."""
        bucket = self.jump_answers(function).get(offset)
        return None if bucket is None else \
            self.db.execute("SELECT name, example FROM jump_buckets WHERE id=?", (bucket,)).fetchone()

    def jump_rows(self, image: int) -> list[tuple[int, str, int, str]]:
        """(function start, function name, offset, bucket name) of every answered instruction of the image."""
        names = dict(self.db.execute("SELECT id, name FROM jump_buckets"))
        out = [(unsigned(start), name, off, names[b]) for start, name, off, b in self.db.execute(
            "SELECT f.start, f.name, j.offset, j.bucket FROM jump_probes j JOIN functions f ON f.id = j.function "
            "WHERE f.image=?", (image,))]
        if self._has_packed_jumps():
            for start, name, ids, offsets, indexes in self.db.execute(
                    "SELECT f.start, f.name, p.buckets, p.offsets, p.indexes FROM jump_packed p "
                    "JOIN functions f ON f.id = p.function WHERE f.image=?", (image,)):
                buckets = [names[b] for b in unpack_u32(ids)]
                out.extend((unsigned(start), name, off, buckets[k]) for off, k in zip(unpack_u32(offsets), indexes))
        return sorted(out)

    def _has_packed_jumps(self) -> bool:
        """Whether the store has ``jump_packed`` (a store opened read-only may be older than it)."""
        known = self.__dict__.get("_packed_jumps")
        if known is None:
            known = self._packed_jumps = self.db.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='jump_packed'").fetchone() is not None
        return known

    def jump_probe_examples(self) -> dict[str, str]:
        return dict(self.db.execute("SELECT name, example FROM jump_buckets"))

    def jump_bucket_names(self) -> list[tuple[int, str, str]]:
        """(id, name, example reason) of every jump-probe bucket ([] for a run without ``--jump-probes``)."""
        try:
            return list(self.db.execute("SELECT id, name, example FROM jump_buckets ORDER BY id"))
        except sqlite3.OperationalError:  # a store opened read-only from before the jump tables
            return []

    def jump_answers(self, function: int) -> dict[int, int]:
        """offset -> jump-probe bucket id of one function's instructions."""
        if self._has_packed_jumps():
            row = self.db.execute("SELECT buckets, offsets, indexes FROM jump_packed WHERE function=?",
                                  (function,)).fetchone()
            if row is not None:
                ids = unpack_u32(row[0])
                return {off: ids[k] for off, k in zip(unpack_u32(row[1]), row[2])}
        try:
            return dict(self.db.execute("SELECT offset, bucket FROM jump_probes WHERE function=?", (function,)))
        except sqlite3.OperationalError:  # a store opened read-only from before the jump tables
            return {}


class SealChecks:
    """Whether the store is as relocverify left it: its seals (``row_seals``) and SQLite's own integrity check.  A part
    of the read model (``Results``); needs ``self.db``."""

    def check_integrity(self) -> None:
        """Raise StoreError unless SQLite's integrity check passes (a command that reads the whole store,
        such as ``report``, calls it first, so it never builds anything from a damaged one)."""
        try:
            rows = [r[0] for r in self.db.execute("PRAGMA integrity_check(4)")]
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: a damaged store ({exc})") from None
        if rows != ["ok"]:
            raise StoreError(f"{self.path}: a damaged store: SQLite's integrity check says {rows[0][:120]}")

    def altered_functions(self, image: int) -> set[int]:
        """Ids of the image's functions whose findings are not as relocverify sealed them, looked for only in a
        store changed since relocverify last closed it (``touched``; readers check every time): a run
        verifies them again."""
        altered = set(row_seals.broken(self.db, "f.image=?", (image,))) if self.touched else set()
        if altered and self._lock is not None:
            self._lock.checked = False  # still to be looked at by the next open, until a run verifies them again
        return altered

    def check_seals(self, image: int | None = None, function: int | None = None) -> None:
        """Raise StoreError (one line) unless the findings of the image's functions (or of one function, or of
        the whole store) are as relocverify sealed them (``store.row_seals``): every command that turns stored
        verdicts into claims calls it first."""
        if function is not None:
            row_seals.check(self.db, self.path, "f.id=?", (function,))
        elif image is not None:
            row_seals.check(self.db, self.path, "f.image=?", (image,))
        else:
            row_seals.check(self.db, self.path)


class Results(ImageReads, RowReads, JumpReads, SealChecks):
    """The read model: what report, show, export, gate and the audit read.  ``Results(path)`` opens a store to
    read it: no lock is taken and nothing is written (a store being written is read as its last commit left
    it); a file that is not a relocverify store of this schema is refused with ``StoreError``.  A ``Store``
    (the writer) is one too, as the scheduler reads what it wrote."""

    def __init__(self, path: str):
        self.path = path
        self._memo: dict = {}
        self._outcomes: dict[int, tuple] | None = None
        if not (os.path.exists(path) and os.path.getsize(path) > 0):
            raise StoreError(f"{path}: no such store")
        try:
            input_file(path, "store")  # a regular file: no FIFO, device or directory
        except InputError as exc:
            raise StoreError(str(exc)) from None
        check_foreign(path)
        try:
            self.db = read_only(path)
            self.db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            self._check_schema()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path}: cannot use as a relocverify store ({exc})") from None

    def _check_schema(self) -> None:
        meta = dict(self.db.execute("SELECT key, value FROM meta"))
        if meta.get("application") != APPLICATION or meta.get("schema") != str(SCHEMA_VERSION):
            raise StoreError(f"{self.path}: not a relocverify schema-{SCHEMA_VERSION} store")
        tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        missing = sorted(REQUIRED_TABLES - tables)
        if missing:
            raise StoreError(f"{self.path}: a damaged relocverify store: the table(s) {', '.join(missing)} are "
                             f"missing; verify into a new --db")

    def close(self) -> None:
        self.db.close()


def check_foreign(path: str) -> None:
    """Refuse, without writing, a file that is not a relocverify store of this schema."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError as exc:
        raise StoreError(f"{path}: cannot read: {exc.strerror}") from None
    if head != b"SQLite format 3\x00":
        raise StoreError(f"{path}: not a relocverify store (not an SQLite file); choose another --db")
    try:
        con = read_only(path)
        try:
            rows = dict(con.execute("SELECT key, value FROM meta"))
        finally:
            con.close()
    except sqlite3.DatabaseError:
        raise StoreError(f"{path}: an SQLite file of another program, not a relocverify store; "
                         f"choose another --db") from None
    if rows.get("application") != APPLICATION:
        if rows.get("schema") == "1":
            raise StoreError(f"{path}: a relocverify schema-1 store; this version writes schema "
                             f"{SCHEMA_VERSION}: rerun with a new --db (the old file is left as it is)")
        raise StoreError(f"{path}: an SQLite file of another program, not a relocverify store; "
                         f"choose another --db")
    if rows.get("schema") != str(SCHEMA_VERSION):
        raise StoreError(f"{path}: a relocverify schema-{rows.get('schema')} store; this version reads "
                         f"schema {SCHEMA_VERSION}: rerun with a new --db")


class Store(Results):
    """A relocverify store.  ``Store(path)`` creates a new one or opens an
    existing one; any other file is refused with ``StoreError``, untouched."""

    def __init__(self, path: str):
        self.path = path
        self._memo: dict = {}
        self._lock = None
        self._outcomes: dict[int, tuple] | None = None
        self._checkpoint: _Checkpoint | None = None  # a merge's log copied into the file behind (``merge_shards``)
        self._merger: _Merger | None = None  # shards merged behind (``merge_shards_behind``)
        self.touched = False
        if os.path.exists(path):
            try:
                input_file(path, "store")  # a regular file: no FIFO, device or directory
            except InputError as exc:
                raise StoreError(str(exc)) from None
        had_lock_file = os.path.exists(path + ".lock")
        # the lock first: another writer may be creating this very store, and until it is done the file looks
        # like nobody's SQLite file; the second writer is told the store is busy
        self._lock = _WriterLock.acquire(path)
        exists = os.path.exists(path) and os.path.getsize(path) > 0
        if exists:
            try:
                check_foreign(path)
            except StoreError:
                self._release()
                if not had_lock_file:
                    try:  # leave another program's file as we found it: no lock file beside it
                        os.remove(path + ".lock")
                    except OSError:
                        pass
                raise
        try:
            self.db = shard.connect(path)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            # A run inserts millions of rows into B-trees of ~100 MB, in key order (``shard.merge``):
            # appends, which need few pages in memory, but more than SQLite's default of 2 MB.  32 MB
            # costs a whole-kernel run no time against 256 MB, and its peak memory 40 MB less.
            self.db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            if not exists:
                self._create()
                self._lock.checked = True
            self._check_schema()
            #: changed since relocverify last closed it (killed, copied, edited): its seals are worth a look
            self.touched = exists and not self._lock.checked
            if exists and not self._lock.checked:
                # not closed cleanly by us since it last changed (killed, copied, edited): a writer never
                # adds rows to a damaged store; a store we closed ourselves is not read again
                self.check_integrity()
                self._lock.checked = True
            self.db.executescript(JUMP_TABLES)  # added within schema 2: older stores gain them
        except sqlite3.DatabaseError as exc:
            self._release()
            raise StoreError(f"{path}: cannot use as a relocverify store ({exc})") from None
        except BaseException:
            self._release()
            raise

    # -- identity --------------------------------------------------------------
    def _create(self) -> None:
        self.db.execute(f"PRAGMA application_id={APPLICATION_ID}")
        self.db.executescript("BEGIN;" + schema_sql() + "COMMIT;")
        self.db.executemany("INSERT INTO meta VALUES (?, ?)",
                            [("application", APPLICATION), ("schema", str(SCHEMA_VERSION))])
        row_seals.new_key(self.db)

    def close(self) -> None:
        try:
            try:
                self._finish_merger()
            except (sqlite3.Error, StoreError):
                pass  # a run that failed before its last merge: its shards stay, for the next run to merge
            finally:
                self._join_checkpoint()
        finally:
            self.db.close()
            self._release()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # -- transactions ------------------------------------------------------------
    def _transaction(self):
        return _Transaction(self.db)

    # -- images and runs ---------------------------------------------------------
    def image_id(self, sha256: str, path: str, fmt: str, symbol_source: str, info: dict) -> int:
        """The id of the image with this sha256, adding it if new.  ``path`` is kept as text: a name that is no
        UTF-8 (a Latin-1 file name, carried as surrogates) keeps its odd bytes as ``\\xNN``."""
        path = os.fsencode(path).decode("utf-8", "backslashreplace")
        with self._transaction():
            row = self.db.execute("SELECT id FROM images WHERE sha256=?", (sha256,)).fetchone()
            if row is not None:
                self.db.execute("UPDATE images SET path=?, info=? WHERE id=?", (path, json.dumps(info), row[0]))
                return row[0]
            return self.db.execute("INSERT INTO images (sha256, path, format, symbol_source, info) VALUES (?,?,?,?,?)",
                                   (sha256, path, fmt, symbol_source, json.dumps(info))).lastrowid

    def mark_abandoned_runs(self) -> int:
        """Runs left 'running' by a process that no longer exists (killed or crashed)
        become 'killed'.  Returns how many."""
        host = socket.gethostname()
        n = 0
        for run, pid, run_host in self.db.execute("SELECT id, pid, host FROM runs WHERE status='running'").fetchall():
            if run_host == host and pid is not None and alive(pid):
                continue
            if run_host != host:
                continue  # another machine's run: it may still be going
            self.db.execute("UPDATE runs SET status='killed', finished=? WHERE id=?", (time.time(), run))
            n += 1
        return n

    def start_run(self, image: int, config: str, versions: dict, limit: int | None = None) -> int:
        """A new run, 'running' until ``finish_run``; ``limit`` is its scope (first N functions, or all)."""
        return self.db.execute(
            "INSERT INTO runs (image, started, status, config, versions, pid, host, scope) VALUES (?,?,?,?,?,?,?,?)",
            (image, time.time(), "running", config, json.dumps(versions, sort_keys=True), os.getpid(),
             socket.gethostname(), limit)).lastrowid

    def finish_run(self, run: int, status: str, summary: dict | None) -> None:
        with self._transaction():
            self.db.execute("UPDATE runs SET finished=?, status=?, summary=? WHERE id=?",
                            (time.time(), status, None if summary is None else json.dumps(summary), run))
            row_seals.seal_run(self.db, run)

    # -- functions -----------------------------------------------------------------
    def add_functions(self, image: int, functions: Iterable[tuple[int, int, str, str, bytes]]) -> dict:
        """Record (start, size, name, section, bytes) of every function; returns
        {(start, name): id}, keeping the ids of functions already stored."""
        with self._transaction():
            known = {(unsigned(s), n): i for i, s, n in
                     self.db.execute("SELECT id, start, name FROM functions WHERE image=?", (image,))}
            new = [(image, signed(s), z, n, sec, b) for s, z, n, sec, b in functions if (s, n) not in known]
            self.db.executemany("INSERT INTO functions (image, start, size, name, section, bytes) "
                                "VALUES (?,?,?,?,?,?)", new)
            if new:
                known = {(unsigned(s), n): i for i, s, n in
                         self.db.execute("SELECT id, start, name FROM functions WHERE image=?", (image,))}
        return known

    def config_id(self, config: str) -> int:
        with self._transaction():
            row = self.db.execute("SELECT id FROM configs WHERE text=?", (config,)).fetchone()
            if row is not None:
                return row[0]
            return self.db.execute("INSERT INTO configs (text) VALUES (?)", (config,)).lastrowid

    # -- writing results ---------------------------------------------------------------
    def _outcome_row(self, memo: dict, outcome: tuple, reason: str) -> tuple[int, str]:
        ids = memo.setdefault("outcomes", {})
        hit = ids.get(outcome)
        if hit is None:
            db = self.db
            db.execute("INSERT OR IGNORE INTO outcomes (verdict, method, plan_kind, rule, klass, reason_key, reason) "
                       "VALUES (?,?,?,?,?,?,?)", outcome + (reason,))
            hit = ids[outcome] = db.execute(
                "SELECT id, reason FROM outcomes WHERE verdict=? AND method=? AND plan_kind=? AND rule=? "
                "AND klass=? AND reason_key=?", outcome).fetchone()
        return hit

    def _variant_name(self, memo: dict, name: str) -> int:
        names = memo.setdefault("names", {})
        hit = names.get(name)
        if hit is None:
            self.db.execute("INSERT OR IGNORE INTO variant_names (name) VALUES (?)", (name,))
            hit = names[name] = self.db.execute("SELECT id FROM variant_names WHERE name=?", (name,)).fetchone()[0]
        return hit

    def _counterexample(self, c) -> int:
        return self.db.execute("INSERT INTO counterexamples (state, differences, replay) VALUES (?,?,?)",
                               (c.state_json(), json.dumps([[d.what, d.original, d.relocated] for d in c.differences]),
                                c.replay_command)).lastrowid

    def write_replacements(self, image: int, rows: list[tuple]) -> None:
        """(alternative index, site address, address, bytes, finding) of every alternative replacement
        instruction; an alternative whose replacement cannot be known has one row with empty bytes."""
        memo: dict = {}
        with self._transaction():
            self.db.execute("DELETE FROM replacements WHERE image=?", (image,))
            self.db.executemany(
                "INSERT INTO replacements VALUES (?,?,?,?,?,?,?,?,?)",
                [(image, alt, signed(site), signed(address), raw, self._outcome(memo, f)[0],
                  f.reason, f.proof_us, 1 if f.fresh else 0) for alt, site, address, raw, f in rows])
            row_seals.seal_replacements(self.db, image)

    # -- passes (engine.passes) -----------------------------------------------------------
    def write_pass_rows(self, name: str, rows: list[tuple[int, list[tuple]]]) -> None:
        """A pass's rows of functions (function id, its rows), in one transaction (replacing); the table is
        made by the first pass a store is given (``PASS_TABLES``), so a store no pass ran in has none."""
        with self._transaction():
            self.db.execute(PASS_TABLES)
            self.db.executemany("INSERT OR REPLACE INTO pass_rows VALUES (?,?,?)",
                                [(fid, name, json.dumps(r)) for fid, r in rows])

    # -- jump probes ----------------------------------------------------------------------
    def write_jump_probes(self, rows: list[JumpRow], examples: dict[str, str]) -> None:
        """Functions' jump-probe answers (``store.jump_rows``), in one transaction (replacing); a new
        bucket gets its example reason from ``examples``."""
        with self._transaction():
            ids = dict(self.db.execute("SELECT name, id FROM jump_buckets"))
            for name in {b for row in rows for b in row.buckets} - set(ids):
                ids[name] = self.db.execute("INSERT INTO jump_buckets (name, example) VALUES (?, ?)",
                                            (name, examples.get(name, ""))).lastrowid
            self.db.executemany("INSERT OR REPLACE INTO jump_packed VALUES (?,?,?,?)",
                                [(row.function, pack_ids(ids[b] for b in row.buckets), row.offsets, row.indexes)
                                 for row in rows])

    def merge_shards(self, paths: list[str]) -> dict[int, int]:
        """Move each shard (``store.shard``) into the store, one transaction each, and delete it.
        Returns the store ids of the provisional outcome ids the shards used.

        A whole kernel's merge writes about 60 MB to the write-ahead log, and SQLite copied it into the
        database file (a checkpoint) inside the merge's commit, 0.2 s in which a run's workers wait.  The
        merge makes no checkpoint; a thread of its own (``_Checkpoint``) makes it while the run goes on
        (its summary), and ``close`` waits for it.  Until then the rows are in the log, as durable as in
        the file and read from there."""
        behind = self._finish_merger()
        if not paths:
            return behind
        self._join_checkpoint()
        every = self.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        self.db.execute("PRAGMA wal_autocheckpoint=0")
        try:
            merged, final = shard.merge(self.db, paths)
        finally:
            self.db.execute(f"PRAGMA wal_autocheckpoint={int(every)}")
        if merged:
            self._checkpoint = _Checkpoint(self.path)
        return behind | final

    def merge_shards_behind(self, paths: list[str]) -> None:
        """``merge_shards`` on a thread and a connection of their own (``_Merger``), in the order asked, while
        the caller goes on: a run merges its workers' closed shards while they write the next ones.  The next
        ``merge_shards`` (or ``close``) waits for these first, raises what they raised, and returns their ids
        with its own."""
        if self._merger is None:
            self._join_checkpoint()
            self._merger = _Merger(self.path)
        self._merger.put(paths)

    def _finish_merger(self) -> dict[int, int]:
        merger, self._merger = self._merger, None
        return {} if merger is None else merger.finish()

    def _join_checkpoint(self) -> None:
        if self._checkpoint is not None:
            self._checkpoint.join()
            self._checkpoint = None


def add_counts(packed: list[tuple], weak: frozenset[int]
               ) -> tuple[dict[str, dict[int, int]], list[tuple], dict[int, int]]:
    """(section -> {outcome id -> instructions}, the rows naming an outcome in ``weak``, site mask ->
    instructions) of the rows (function, section, outcomes, counts[, sites]) of ``packed``
    (``store.packed_rows``): what ``tally.c`` computes, in Python."""
    by_section: dict[str, dict[int, int]] = {}
    weak_rows = []
    masks: dict[int, int] = {}
    for row in packed:
        _, section, oids, cs, *sites = row
        for mask in unpack_u32(sites[0])[1::2] if sites else ():
            masks[mask] = masks.get(mask, 0) + 1
        oids = unpack_ids(oids)
        mine = by_section.get(section)
        if mine is None:
            mine = by_section[section] = {}
        for oid, n in zip(oids, unpack_u32(cs)):
            mine[oid] = mine.get(oid, 0) + n
        if not weak.isdisjoint(oids):
            weak_rows.append(row)
    return by_section, weak_rows, masks


def _by_verdict(oids, counts, verdict_of: dict[int, str]) -> dict[str, int]:
    """A function's instruction counts by verdict, from its packed outcome ids and counts."""
    out: dict[str, int] = {}
    for oid, n in zip(oids, counts):
        if n:
            out[verdict_of[oid]] = out.get(verdict_of[oid], 0) + n
    return out


@dataclass
class RowBatch:
    """Whole functions' results as a worker writes them (``shard.ShardWriter.write``).

    ``packed`` holds one row of the ``packed`` table per function (``store.packed_rows``: function,
    outcomes, counts, names, variants, sites, data); ``full`` holds the other rows with every column;
    ``variants`` the variants with a reason of their own."""

    functions: list[int] = field(default_factory=list)
    packed: list[tuple] = field(default_factory=list)
    full: list[tuple] = field(default_factory=list)  # ... the last column a Counterexample (or None)
    variants: list[tuple] = field(default_factory=list)  # (function, offset, variant name, outcome, reason)
    instructions: int = 0
    outcomes: list[tuple] = field(default_factory=list)  # (provisional id, outcome tuple, reason) new here
    names: list[tuple[int, str]] = field(default_factory=list)  # (provisional id, variant name) new here
    seals: list[tuple[int, bytes]] = field(default_factory=list)  # (function, its seal) made by the worker
    seal_outcomes: dict[int, str] = field(default_factory=dict)  # outcome id -> the reason ``seals`` give it


#: The tables every schema-4 store has (``schema.sql``).
REQUIRED_TABLES = frozenset({"meta", "images", "configs", "runs", "functions", "outcomes", "counterexamples",
                             "instructions", "packed", "variant_names", "variants", "replacements"})


class _WriterLock:
    """One writer per store: an exclusive lock (``lockf``) on ``<store>.lock``, held while a ``Store`` is open for
    writing.  A second run on the same store (another process) is refused at once ("store busy", exit 2),
    before it writes or merges anything, so the first run's shards stay its own; the lock goes with the
    process, so a killed run leaves nothing that blocks the next.  Opens in one process share it.  The file
    stays (removing it would let a third process lock a new file while a second holds the old one): while
    held it names the writer's pid, once closed the word ``closed`` and how the store was left."""

    _held: dict[str, list] = {}

    def __init__(self, key: str, fd: int) -> None:
        self.key, self.fd = key, fd

    @classmethod
    def acquire(cls, path: str) -> "_WriterLock":
        key = os.path.realpath(path)
        held = cls._held.get(key)
        if held is not None:
            held[1] += 1
            return held[0]
        lock_path = path + ".lock"
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"{path}: cannot create its lock file {lock_path}: {exc.strerror}") from None
        try:
            # a POSIX record lock, not flock: a worker process forked while the lock is held does not
            # inherit it, so it goes exactly with the process that took it
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                owner = os.pread(fd, 64, 0).decode(errors="replace").split("\n")[0].strip()
            finally:
                os.close(fd)
            raise StoreError(f"{path}: store busy: another relocverify run (pid {owner or '?'}) is writing it; "
                             f"wait for it to finish, or use another --db") from None
        previous = os.pread(fd, 256, 0).decode(errors="replace").split("\n")
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        lock = cls(key, fd)
        lock.path = path
        lock.checked = len(previous) == 2 and previous[1] == file_stamp(path)
        cls._held[key] = [lock, 1]
        return lock

    #: Whether the store was left, by the last writer that closed it cleanly, exactly as it is now.
    checked = False

    def release(self) -> None:
        held = self._held.get(self.key)
        if held is None:
            return
        held[1] -= 1
        if held[1] == 0:
            del self._held[self.key]
            try:  # a closed store's lock file names no process (none holds it), only how the store was left
                os.ftruncate(self.fd, 0)
                # the next writer skips the integrity check only if nothing touched the file since
                os.pwrite(self.fd, (f"closed\n{file_stamp(self.path)}" if self.checked else "closed").encode(), 0)
            except OSError:
                pass
            os.close(self.fd)


def read_only(path: str) -> sqlite3.Connection:
    """A connection that reads the store at ``path`` and never writes (its name percent-encoded in the URI:
    '?', '#' and '%' are a URI's own).  A store in WAL mode in a directory that cannot be written (a read-only
    mount, a chmod 0555 directory) cannot have its shared-memory file made there: it is opened immutable, which
    needs none, when no write-ahead log holds changes; with such a log it is refused in one line."""
    uri = shard.uri(path) + "?mode=ro"
    db = sqlite3.connect(uri, timeout=60, isolation_level=None, uri=True)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return db
    except sqlite3.OperationalError:
        db.close()
        if os.access(os.path.dirname(os.path.abspath(path)), os.W_OK) or os.path.exists(path + "-shm"):
            raise
    wal = path + "-wal"
    if os.path.exists(wal) and os.path.getsize(wal) > 0:
        raise StoreError(f"{path}: cannot read it in a read-only directory: its write-ahead log ({wal}) holds "
                         f"changes that SQLite reads only where it can write; copy the store with its -wal file to "
                         f"a writable directory")
    return sqlite3.connect(uri + "&immutable=1", timeout=60, isolation_level=None, uri=True)


def file_stamp(path: str) -> str:
    """Size, modification time and inode of a store and its WAL: what a clean close leaves behind."""
    parts = []
    for p in (path, path + "-wal"):
        try:
            st = os.stat(p)
        except OSError:
            st = None
        # an empty WAL holds nothing (a reader's open leaves one behind): the same as none
        parts.append("-" if st is None or (p != path and st.st_size == 0) else
                     f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}")
    return " ".join(parts)


class _Checkpoint(threading.Thread):
    """The write-ahead log copied into the database file (``PRAGMA wal_checkpoint(PASSIVE)``) on a
    connection and a thread of their own: SQLite runs it without Python's lock, beside the main thread's
    reads and writes, which it never blocks.  A checkpoint that fails loses nothing (the log keeps what
    it did not copy, and the store's closing connection checkpoints again), so its errors are dropped."""

    def __init__(self, path: str):
        super().__init__(name="relocverify-checkpoint", daemon=True)
        self.path = path
        self.start()

    def run(self) -> None:
        try:
            with sqlite_work():
                db = shard.connect(self.path)
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                finally:
                    db.close()
        except sqlite3.Error:
            pass


class _Merger(threading.Thread):
    """Shards merged into the store (``shard.merge``), one list after the other in the order given, on a
    connection and a thread of their own (SQLite runs the statements without Python's lock).  No checkpoint:
    the owner's last merge makes one behind (``_Checkpoint``), while its run makes the summary with a core to
    spare; here it would take CPU from the workers.  The store's writer lock is its owner's, held while this
    runs; ``finish`` waits, raises what a merge raised, and returns the provisional ids' store ids."""

    def __init__(self, path: str):
        super().__init__(name="relocverify-merge", daemon=True)
        self.path = path
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.final: dict[int, int] = {}
        self._error: BaseException | None = None
        self.start()

    def put(self, paths: list[str]) -> None:
        self._queue.put(list(paths))

    def finish(self) -> dict[int, int]:
        self._queue.put(None)
        self.join()
        if self._error is not None:
            raise self._error
        return self.final

    def run(self) -> None:
        db = None
        try:
            with sqlite_work():
                db = shard.connect(self.path)
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
                db.execute("PRAGMA wal_autocheckpoint=0")
            while True:
                paths = self._queue.get()
                if paths is None:
                    return
                with sqlite_work():
                    self.final.update(shard.merge(db, paths)[1])
        except BaseException as exc:  # noqa: BLE001 - raised in the owner's thread by ``finish``
            self._error = exc  # the shards not merged stay beside the store (``leftover_shards``)
            while self._queue.get() is not None:
                pass
        finally:
            if db is not None:
                with sqlite_work():
                    db.close()


class _Transaction:
    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind, exc, tb):
        if kind is None:
            self.db.execute("COMMIT")
        else:
            self.db.execute("ROLLBACK")
        return False

