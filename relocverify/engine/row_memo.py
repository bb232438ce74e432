"""A function's rows, kept in the proof cache and reused by a later run into any store.

A new store for an image whose proofs are all cached still walked every
instruction: an instance key each, the finding looked up, sites and
variants applied, the row encoded; about 5 µs an instruction in Python, a
whole kernel 2.5× ``objdump -d``.  Those rows are a function of inputs a
function's digest can name, so a run keeps each function's rows under that
digest (``function_key``), and a later run with the same digest copies them.

What a function's rows depend on, and so what its key holds:

* the run: the proof tag (tool versions, policy table, CPU-validated forms),
  relocverify's own source (``versions.source_digest``: the keys, the planner,
  the sites' policy and variants are code), the trampoline, the solver
  timeout, whether sites are applied, and the image's thunk symbols (a
  retpoline's variant is the thunk's register);
* the function: its start, size and bytes, the addresses of it another
  function owns (``Job.skip``), every field of every site overlapping it,
  and an alternative's replacement bytes;
* the findings of its instance keys: those are the proof cache's under the
  same tag, which a finding never leaves once made (a key's finding is the
  same wherever and whenever it is made, ``tests/test_cache.py``, but for its
  proof time: a key two workers both proved is cached with the later time,
  while a row kept by the other worker has its own).

What the rows are kept as is what a run on a warm cache writes: a finding
made by this run (``fresh``, with a representative's counterexample) is
kept as the cache gives it to every later run (not fresh, no
counterexample), and a function with a finding the cache does not keep (a
timeout, a crash, an error: ``worker.NOT_KEPT``) is not kept at all, since
a later run proves that instruction again.  So a reused function's rows are
the rows the later run would have made itself; ``tests/test_row_memo.py``
checks that on real kernel functions and on every input of the key.

Outcomes are store ids, so the rows name each outcome by the digest of its
fields and reason (``outcome_digest``; the cache keeps what a digest stands
for once), and the store that reuses them numbers it (``OutcomeIds``).  A row
names its outcome's reason or its own, so a store whose outcome holds
another reason than the one kept (a store written earlier, by another
order of functions) does not reuse the function: it is walked as before.
"""

from __future__ import annotations

import hashlib
import marshal
import struct

import zstandard

from ..errors import ImageError
from ..store.packed_rows import FRESH_BIT, K_SHIFT, pack_u32, site_masks, unpack_u32

#: zstd level -1: a kernel's 53 MB of marshalled rows in 33 MB, packed in 0.25 s of CPU and unpacked in 0.08 s
#: (level 1: 28 MB in 0.48 s and 0.21 s; zlib at level 1 took 2.76 s to pack, a sixth of a cold run's rows phase).
_PACK = zstandard.ZstdCompressor(level=-1)
_UNPACK = zstandard.ZstdDecompressor()


def canonical(value) -> bytes:
    """``value`` (tuples, lists, str, bytes, int, bool, None) as bytes that depend on the value alone, for a
    digest: marshal's format 0.  Later formats mark interned strings and objects referenced twice, so two
    equal values could marshal differently (an outcome made in one worker and unpickled in another did)."""
    return marshal.dumps(value, 0)


def context_digest(tag: bytes, source: bytes, tramp: int, timeout_s: float, with_sites: bool,
                   thunks: dict[int, str]) -> bytes:
    """What every function's key of one run shares (the module doc's first list)."""
    run = canonical((tramp, repr(timeout_s), with_sites, sorted(thunks.items())))
    return hashlib.sha256(b"rows|" + tag + source + run).digest()[:16]


def function_key(context: bytes, start: int, size: int, data: bytes, skip, sites, image) -> bytes:
    """The digest of everything a function's rows depend on (the module doc): ``skip`` the addresses of
    it another function owns, ``sites`` the sites overlapping it (``SiteIndex.sites_at``), or None."""
    h = hashlib.blake2b(context, digest_size=16)
    h.update(struct.pack("<QQQ", start & (1 << 64) - 1, size, len(data)))
    h.update(data)
    h.update(canonical(sorted(skip) if skip else ()))
    if sites is not None:
        described = []
        for s in sites:
            described.append(tuple(s))  # every field of the site (a Site is its values): a new one enters the key
            if s.kind == "alternative" and s.target is not None and s.target_length:
                try:
                    described.append(image.read(s.target, s.target_length))
                except ImageError:
                    described.append(None)
        h.update(canonical(described))
    else:
        h.update(b"no sites")
    return h.digest()


def outcome_digest(described: bytes) -> bytes:
    """The name kept rows give an outcome: 8 bytes of the digest of ``described``, the ``canonical``
    (outcome tuple, its reason in the store)."""
    return hashlib.blake2b(described, digest_size=8).digest()


_CLEAR_FRESH = bytes(b & ~FRESH_BIT for b in range(256))  # FRESH_BIT < 256: a byte's translation


def kept_rows(n: int, outcomes: bytes, counts: bytes, names: list[str], variants: bytes | None,
              sites: bytes | None, data: bytes, fresh: bool, full: list[tuple], reasoned: list[tuple]) -> bytes:
    """A function's rows as a later run on a warm cache would write them, compressed.

    ``outcomes`` the ``outcome_digest`` of each outcome, by the function's index ``k``; ``counts``,
    ``variants``, ``sites`` and ``data`` its packed row's columns (``store.packed_rows``: ``data``
    with the fresh bit in some rows when ``fresh``); ``names`` its variant names by its index ``j``;
    ``full`` the other rows as (offset, length, k, reason or None, proof µs, sites mask, answers, has a
    counterexample); ``reasoned`` the variants with a reason of their own as (offset, name, k, reason).
    Fresh bits are dropped (a copy writes 0), and so are counterexamples: a row held out of the packed
    rows only by its counterexample joins them."""
    extra, kept_full = [], []
    for off, length, k, reason, us, mask, answers, cex in full:
        if cex and answers is None and reason is None:
            extra.append(((off, length | k << K_SHIFT, us), mask))
        else:
            kept_full.append((off, length, k, reason, us, mask, answers))
    if fresh and not extra:
        # the fresh bit is bit 4 of each record's second little-endian u32: its fifth byte
        cleared = bytearray(data)
        cleared[4::12] = cleared[4::12].translate(_CLEAR_FRESH)
        data = bytes(cleared)
    elif extra:
        words = unpack_u32(data)
        for i in range(1, len(words), 3):
            words[i] &= ~FRESH_BIT
        rows = sorted([tuple(words[i:i + 3]) for i in range(0, len(words), 3)] + [row for row, _ in extra])
        words = [w for row in rows for w in row]
        marks = sorted(list(site_masks(sites).items()) + [(row[0], m) for row, m in extra if m is not None])
        sites = pack_u32([x for pair in marks for x in pair]) if marks else None
        data = pack_u32(words)
    return _PACK.compress(marshal.dumps((n, outcomes, counts, tuple(names), variants, sites, data, kept_full,
                                         reasoned)))


def unpack_kept(value: bytes) -> tuple | None:
    """What ``kept_rows`` made, its outcome digests as one string (8 bytes each, by ``k``), or None for a damaged
    value (the function is walked as before)."""
    try:
        got = marshal.loads(_UNPACK.decompress(value))
        n, outcomes, counts, names, variants, sites, data, full, reasoned = got
    except (ValueError, TypeError, EOFError, zstandard.ZstdError):
        return None
    return got


def unpack_rows(value: bytes) -> tuple | None:
    """``unpack_kept``, its outcome digests as a list."""
    got = unpack_kept(value)
    if got is None:
        return None
    n, outcomes, counts, names, variants, sites, data, full, reasoned = got
    digests = [outcomes[i:i + 8] for i in range(0, len(outcomes), 8)]
    return n, digests, counts, names, variants, sites, data, full, reasoned
