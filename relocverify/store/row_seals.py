"""Seals on a store's findings: one keyed BLAKE2b MAC (``store.seal``) per function over everything the
store says about it, and one per image over its alternatives' replacement rows.

What a function's seal covers: the image's SHA-256, the function's start, size, name, section and bytes,
the configuration its rows were verified under (which holds the cache tag: the tools' versions, the
policy's digest, the CPU-validated form table's and relocverify's own source), its packed row (each outcome
by its fields, not its id, and each variant name by its text), its full instruction rows (outcome by its
fields, instance reason, answers, counterexample) and its variants.  So an ``UPDATE`` of a verdict, of a
row's outcome id, of the outcomes table, a packed blob, a configuration, or a row copied from another
function or another store, leaves a seal that no longer matches.

Seals are stored in the transaction that stores the rows (``shard.merge``, ``Store.write_replacements``), and
checked by the readers that turn verdicts into claims (``show``, ``export``, ``report``, ``run``): a store with
a broken or missing seal is refused in one line, whichever row it is (``StoreError``, exit 2).  The merge
seals a function from its rows as stored, except a function a worker copied from the proof cache
(``engine.row_keeper``): the worker seals it from the rows it writes to its shard (``function_mac``, the one
layout both use), and the merge keeps that seal when every outcome it names is stored with the reason the
worker gave it (``shard_seals_hold``), else seals the shard's functions itself.

The key is 32 random bytes in the store's ``meta`` (``seal_key``), made with the store.  What the seals stop:
a store edited by any program but relocverify's own writer (``sqlite3``, a script, a copied row).  What they
cannot stop: someone who reads the key from the file and runs this module on purpose; ``export`` re-derives
the policy's answer for every row it emits besides (``report.probe_points.PolicyCheck``).  Rows deleted
together with their seal and their function's configuration read as a function not yet verified, never as
a safe one.  Jump-probe answers (``--jump-probes``) are not sealed."""

from __future__ import annotations

import os
import sqlite3
from typing import Iterable, Iterator

from ..errors import StoreError
from .packed_rows import unpack_ids
from .seal import Seal

META_KEY = "seal_key"
TABLE = """CREATE TABLE IF NOT EXISTS seals (owner INTEGER PRIMARY KEY, mac BLOB NOT NULL)"""
#: ``seals.owner``: a function's id; minus an image's id for that image's replacement rows; ``RUN_OWNER``
#: minus a run's id for that run's record.
RUN_OWNER = -(1 << 40)


def new_key(db: sqlite3.Connection) -> None:
    """A new store's seal key and table (in the store's creating transaction)."""
    db.execute(TABLE)
    db.execute("INSERT INTO meta VALUES (?, ?)", (META_KEY, os.urandom(32).hex()))


def seal_of(db: sqlite3.Connection, schema: str = "main") -> Seal | None:
    """The store's seal, or None for a store written before seals."""
    try:
        row = db.execute(f"SELECT value FROM {schema}.meta WHERE key=?", (META_KEY,)).fetchone()
    except sqlite3.OperationalError:
        return None
    if row is None:
        return None
    try:
        key = bytes.fromhex(row[0])
    except (TypeError, ValueError):
        return None
    return Seal.of_key(key) if len(key) == 32 else None


def seal_functions(db: sqlite3.Connection, where: str, args: tuple = ()) -> int:
    """Seal the functions ``SELECT ... FROM functions f WHERE <where>`` picks, as they are now (inside the
    caller's transaction).  Returns how many."""
    seal = seal_of(db)
    if seal is None:
        return 0
    db.execute(TABLE)
    rows = [(fid, mac) for fid, _, mac, _ in _function_macs(db, seal, where, args)]
    db.executemany("INSERT OR REPLACE INTO main.seals VALUES (?, ?)", rows)
    return len(rows)


def seal_replacements(db: sqlite3.Connection, image: int) -> None:
    seal = seal_of(db)
    if seal is not None:
        db.execute(TABLE)
        db.execute("INSERT OR REPLACE INTO main.seals VALUES (?, ?)", (-image, _replacements_mac(db, seal, image)))


def broken(db: sqlite3.Connection, where: str = "1", args: tuple = ()) -> dict[int, str]:
    """id -> name of every function ``where`` picks whose findings do not match its seal (none for a store
    written before seals: it has nothing to match)."""
    seal = seal_of(db)
    if seal is None:
        return {}
    return {fid: name for fid, name, mac, stored in _function_macs(db, seal, where, args) if mac != stored}


def check(db: sqlite3.Connection, path: str, where: str = "1", args: tuple = ()) -> None:
    """Raise ``StoreError`` (one line) unless every function ``where`` picks that has rows, or was verified,
    has its seal, and the replacement rows of its images theirs."""
    seal = seal_of(db)
    if seal is None:
        raise StoreError(f"{path}: its findings carry no seals (written by a relocverify from before them), so "
                         f"their verdicts cannot be trusted; verify again into a new --db")
    altered = list(broken(db, where, args).values())
    images = [i for (i,) in db.execute(f"SELECT DISTINCT f.image FROM functions f WHERE {where}", args)]
    stored = dict(db.execute("SELECT owner, mac FROM seals WHERE owner < 0 AND owner > ?", (RUN_OWNER,))) if _has_table(db) else {}
    altered += [f"image {i}'s alternative replacements" for i in images
                if (stored.get(-i) is not None or _has_replacements(db, i)) and
                stored.get(-i) != _replacements_mac(db, seal, i)]
    if altered:
        raise StoreError(f"{path}: the findings of {len(altered):,} function(s) were altered after relocverify "
                         f"wrote them (first: {altered[0]}); none of its verdicts is trusted: verify again into a "
                         f"new --db")


def seal_run(db: sqlite3.Connection, run: int) -> None:
    """Seal a run's record (its status and summary: what a repeated command prints and exits by)."""
    seal = seal_of(db)
    if seal is not None:
        db.execute(TABLE)
        db.execute("INSERT OR REPLACE INTO main.seals VALUES (?, ?)", (RUN_OWNER - run, _run_mac(db, seal, run)))


def run_sealed(db: sqlite3.Connection, run: int) -> bool:
    """Whether a run's record is as relocverify sealed it."""
    seal = seal_of(db)
    if seal is None or not _has_table(db):
        return False
    row = db.execute("SELECT mac FROM seals WHERE owner=?", (RUN_OWNER - run,)).fetchone()
    return row is not None and bytes(row[0]) == _run_mac(db, seal, run)


def _run_mac(db: sqlite3.Connection, seal: Seal, run: int) -> bytes:
    row = db.execute("SELECT r.id, g.sha256, r.status, r.config, r.versions, r.summary, r.scope FROM main.runs r "
                     "JOIN main.images g ON g.id = r.image WHERE r.id=?", (run,)).fetchone()
    return seal.mac(repr(row).encode())


def _has_table(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='seals'").fetchone() is not None


def _has_replacements(db: sqlite3.Connection, image: int) -> bool:
    return db.execute("SELECT 1 FROM replacements WHERE image=? LIMIT 1", (image,)).fetchone() is not None


def _outcomes(db: sqlite3.Connection) -> dict[int, bytes]:
    return {r[0]: repr(r[1:]).encode() for r in db.execute(
        "SELECT id, verdict, method, plan_kind, rule, klass, reason_key, reason FROM main.outcomes")}


def outcome_fields(outcome: tuple, reason: str) -> bytes:
    """An outcome as a seal names it: its fields (verdict, method, plan kind, rule, class, reason key) and the
    reason the store holds for it, as ``_outcomes`` reads them."""
    return repr((*outcome, reason)).encode()


def function_head(db: sqlite3.Connection, fids: list[int], config: int) -> dict[int, tuple[tuple, bytes]]:
    """function id -> (what its seal says first: the image's SHA-256, the function's start as stored, size, name,
    section, and the text of configuration ``config``; its bytes), as the store holds them."""
    out = {}
    for i in range(0, len(fids), 500):
        part = fids[i:i + 500]
        for fid, sha, start, size, name, section, code, text in db.execute(
                "SELECT f.id, g.sha256, f.start, f.size, f.name, f.section, f.bytes, c.text FROM functions f "
                "JOIN images g ON g.id = f.image LEFT JOIN configs c ON c.id = ? "
                f"WHERE f.id IN ({','.join('?' * len(part))})", (config, *part)):
            out[fid] = ((sha, start, size, name, section, text), code)
    return out


def function_mac(seal: Seal, head: tuple, code: bytes, packed: list[bytes] | None, full: Iterable[tuple],
                 variants: Iterable[tuple]) -> bytes:
    """A function's seal: ``head`` and its bytes (``function_head``); its packed row as (its outcomes'
    ``outcome_fields`` by ``k`` joined by NUL, counts, its variant names by ``j`` joined by NUL, variants, sites,
    data: None or empty blobs as b""), or None without one; its full rows as (offset, length, outcome's
    fields, instance reason, proof µs, fresh, sites, answers, and its counterexample's state, differences and
    replay, or None), by offset; its variants with a reason of their own as (offset, name, outcome's fields,
    reason), by offset and name.  Each value as SQLite gives it back."""
    parts = [repr(head).encode(), bytes(code)]
    if packed is not None:
        parts += packed
    parts += [repr(r).encode() for r in full]
    parts += [repr(r).encode() for r in variants]
    return seal.mac(*parts)


def shard_seals_hold(db: sqlite3.Connection, schema: str, ids: str) -> bool:
    """Whether the seals in the attached shard ``schema`` (made by its worker, ``function_mac``) are the store's:
    the shard has them, and every outcome they name is stored with the reason its worker gave it
    (``seal_outcomes``: an outcome two shards define is stored with the first one's reason, and a worker's
    reason for an outcome the store numbered is its own).  ``ids``: the table of the merge's provisional ids
    (``pid``) and their store ids (``final``).  The merge stores every other value the seals cover as the
    shard holds it, and the functions' head as the worker read it from the store."""
    if db.execute(f"SELECT count(*) FROM {schema}.sqlite_schema WHERE name IN ('seals', 'seal_outcomes')"
                  ).fetchone()[0] < 2:
        return False  # a shard from before worker seals
    return db.execute(f"SELECT 1 FROM {schema}.seal_outcomes s LEFT JOIN {ids} m ON m.pid = s.outcome "
                      "LEFT JOIN main.outcomes o ON o.id = coalesce(m.final, s.outcome) "
                      "WHERE o.reason IS NOT s.reason LIMIT 1").fetchone() is None


def _function_macs(db: sqlite3.Connection, seal: Seal, where: str,
                   args: tuple) -> Iterator[tuple[int, str, bytes, bytes | None]]:
    """(function id, name, its MAC now, its stored seal or None) of every picked function that has rows or
    a configuration."""
    outcomes = _outcomes(db)
    names = {i: n.encode() for i, n in db.execute("SELECT id, name FROM main.variant_names")}
    full = _grouped(db.execute(
        "SELECT i.function, i.offset, i.length, i.outcome, i.reason, i.proof_us, i.fresh, i.sites, i.answers, "
        "x.state, x.differences, x.replay FROM main.instructions i JOIN main.functions f ON f.id = i.function "
        f"LEFT JOIN main.counterexamples x ON x.id = i.cex WHERE {where} ORDER BY i.function, i.offset", args))
    variants = _grouped(db.execute(
        "SELECT v.function, v.offset, n.name, v.outcome, v.reason FROM main.variants v "
        "JOIN main.functions f ON f.id = v.function JOIN main.variant_names n ON n.id = v.name "
        f"WHERE {where} ORDER BY v.function, v.offset, n.name", args))
    seals = "LEFT JOIN main.seals s ON s.owner = f.id" if _has_table(db) else "LEFT JOIN (SELECT NULL AS mac) s"
    # a packed row's outcome and name id arrays repeat (a kernel's 46 thousand functions have about 15 thousand
    # distinct outcome lists): each is named once
    outcome_lists: dict[bytes, bytes] = {}
    name_lists: dict[bytes | None, bytes] = {}
    for (fid, name, sha, start, size, section, code, config, p_out, p_counts, p_names, p_variants, p_sites,
         p_data, stored) in db.execute(
            "SELECT f.id, f.name, g.sha256, f.start, f.size, f.section, f.bytes, c.text, p.outcomes, p.counts, "
            "p.names, p.variants, p.sites, p.data, s.mac FROM main.functions f JOIN main.images g ON g.id = f.image "
            "LEFT JOIN main.configs c ON c.id = f.config LEFT JOIN main.packed p ON p.function = f.id "
            f"{seals} WHERE {where}", args):
        mine, theirs = full.get(fid, ()), variants.get(fid, ())
        if config is None and p_data is None and not mine and not theirs:
            continue  # listed, never verified: it claims nothing
        packed = None
        if p_data is not None:
            said = outcome_lists.get(p_out)
            if said is None:
                said = outcome_lists[p_out] = b"\0".join([outcomes.get(o, b"?") for o in unpack_ids(p_out)])
            named = name_lists.get(p_names)
            if named is None:
                named = name_lists[p_names] = b"\0".join([names.get(n, b"?") for n in unpack_ids(p_names)])
            packed = [said, p_counts, named, p_variants or b"", p_sites or b"", p_data]
        mac = function_mac(seal, (sha, start, size, name, section, config), code, packed,
                           [(r[1], r[2], outcomes.get(r[3]), *r[4:]) for r in mine],
                           [(r[1], r[2], outcomes.get(r[3]), r[4]) for r in theirs])
        yield fid, name, mac, None if stored is None else bytes(stored)


def _grouped(rows: Iterable[tuple]) -> dict[int, list[tuple]]:
    out: dict[int, list[tuple]] = {}
    for r in rows:
        out.setdefault(r[0], []).append(r)
    return out


def _replacements_mac(db: sqlite3.Connection, seal: Seal, image: int) -> bytes:
    outcomes = _outcomes(db)
    sha = db.execute("SELECT sha256 FROM main.images WHERE id=?", (image,)).fetchone()
    parts = [repr(sha).encode()]
    for r in db.execute("SELECT alt, site, address, bytes, outcome, reason, proof_us, fresh FROM main.replacements "
                        "WHERE image=? ORDER BY alt, address", (image,)):
        parts.append(repr((r[0], r[1], r[2], bytes(r[3]), outcomes.get(r[4]), *r[5:])).encode())
    return seal.mac(*parts)

