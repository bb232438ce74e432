"""A worker's functions' rows kept in the proof cache (``row_memo``): those a survey copies, those it keeps.

A function whose key (``row_memo.function_key``) the cache holds rows under is copied into the store with
this store's outcome and variant-name ids (``reuse``); a function verified now is kept for the cache as a run
on a warm cache would write it (``keep``), and written to the cache a few megabytes at a time (``flush``)."""

from __future__ import annotations

from ..store.cache import ProofCache
from ..store.packed_rows import pack_wide_ids
from ..versions import source_digest
from .row_memo import canonical, context_digest, kept_rows, outcome_digest, unpack_rows

_UNSET = object()


class RowKeeper:
    """What one worker copies from, and keeps for, the proof cache's function rows, from image to image."""

    def __init__(self):
        self.new_rows: dict[bytes, tuple[bytes, bytes]] = {}  # function key -> (context, kept rows), for the cache
        self.new_row_outcomes: dict[bytes, bytes] = {}  # outcome digest -> what it stands for, for the cache
        self.new_bytes = 0  # the size of ``new_rows``
        self.reused = 0  # functions whose rows were copied from the cache
        self._digests: dict[int, bytes] = {}  # outcome id -> its digest (``row_memo.outcome_digest``)
        self._row_outcomes: dict[bytes, tuple[tuple, str]] | None = None  # the cache's digests, once read
        self._rows_cache: ProofCache | None = None
        self._context = _UNSET

    def next_image(self) -> None:
        """The next image of a session: its context is made anew, outcome ids are the new store's (or numbered
        anew), and the cache may hold more outcome digests since."""
        self._context = _UNSET
        self._digests = {}
        self._row_outcomes = None

    def context(self, job, variants) -> bytes | None:
        """What every function key of this image shares (``row_memo.context_digest``); None when rows
        are neither reused nor kept (no proof cache, or ``Job.reuse_rows`` off)."""
        if self._context is _UNSET:
            self._context = None
            if job.reuse_rows and job.cache_dir is not None:
                thunks = variants.thunk_reg if variants is not None else {}
                self._context = context_digest(job.tag, source_digest(), job.tramp, job.timeout_s,
                                               job.sites is not None, thunks)
        return self._context

    def cache(self, directory: str) -> ProofCache:
        """This worker's own connection to the proof cache, for kept rows: opened once, kept from image to
        image (a package's thousand modules)."""
        if self._rows_cache is not None and self._rows_cache.directory != directory:
            self.close()
        if self._rows_cache is None:
            self._rows_cache = ProofCache(directory)
        return self._rows_cache

    def rows_of(self, directory: str, keys: list[bytes]) -> dict[bytes, bytes]:
        """The rows the proof cache keeps under these function keys."""
        if not keys:
            return {}
        found = self.cache(directory).function_rows(keys)
        if found and self._row_outcomes is None:
            self._row_outcomes = self._rows_cache.row_outcomes()
        return found

    def close(self) -> None:
        if self._rows_cache is not None:
            self._rows_cache.close()
            self._rows_cache = None

    def reuse(self, fid: int, value: bytes, batch, ids) -> int | None:
        """A function's kept rows (``row_memo.kept_rows``) added to ``batch`` with this store's outcome
        and variant name ids; how many instructions.  None, with nothing added, when they do not fit this
        store: an outcome it holds under another reason, or a damaged value."""
        got = unpack_rows(value)
        if got is None:
            return None
        n, digests, counts, names, variants, sites, data, full, reasoned = got
        known, table = ids.known, self._row_outcomes or {}
        described = []
        for digest in digests:
            d = table.get(digest)
            if d is None:
                return None
            hit = known.get(d[0])
            if hit is not None and hit[1] != d[1]:
                return None
            described.append(d)
        define = ids.define
        oids = [define(outcome, reason)[0] for outcome, reason in described]
        name = ids.name
        batch.functions.append(fid)
        if oids:  # a function with no instruction of its own has no packed row (``_Batch.end_function``)
            batch.packed.append((fid, pack_wide_ids(oids), counts, pack_wide_ids(map(name, names)) if names else None,
                                 variants, sites, data))
            batch.n_packed += len(data) // 12
        batch.full.extend((fid, off, length, oids[k], reason, us, 0, mask, answers, None)
                          for off, length, k, reason, us, mask, answers in full)
        batch.variants.extend((fid, off, vname, oids[k], reason) for off, vname, k, reason in reasoned)
        self.reused += 1
        return n

    def keep(self, fkey: bytes, batch, n: int, f0: int, v0: int, kmap: dict[int, int],
             names: dict[int, int], fresh: bool, ids) -> None:
        """The function just added to ``batch`` (its packed row last, its full rows from ``f0``, variants
        with reasons from ``v0``), kept for the cache under ``fkey`` as a run on a warm cache would write
        it (``row_memo.kept_rows``)."""
        if not kmap:  # no instruction of its own (another function owns them all): no packed row
            counts = variants = sites = None
            data = b""
        else:
            _, _, counts, _, variants, sites, data = batch.packed[-1]
        order = sorted(kmap, key=kmap.__getitem__)
        full = [(r[1], r[2], kmap[r[3]], r[4], r[5], r[7], r[8], r[9] is not None) for r in batch.full[f0:]]
        text = ids.name_text
        value = kept_rows(n, b"".join(self.digest(o, ids) for o in order), counts, [text(i) for i in names], variants,
                          sites, data, fresh, full, [(r[1], r[2], kmap[r[3]], r[4]) for r in batch.variants[v0:]])
        self.new_rows[fkey] = (self._context, value)
        self.new_bytes += len(value)

    def digest(self, oid: int, ids) -> bytes:
        """An outcome's ``row_memo.outcome_digest``, what it stands for noted for the cache."""
        digest = self._digests.get(oid)
        if digest is None:
            described = canonical(ids.described(oid))
            digest = self._digests[oid] = outcome_digest(described)
            self.new_row_outcomes[digest] = described
        return digest

    def flush(self, directory: str) -> None:
        """The rows kept since the last flush, one transaction, into the proof cache.  The worker writes them
        itself, a few megabytes at a time: held for the parent's harvest they took 20 MB per worker and the
        parent's time, and written per task a package's modules waited on each other's locks (17 ms a module)."""
        if self.new_rows:
            self.cache(directory).add_function_rows(self.new_rows, self.new_row_outcomes)
        self.new_rows, self.new_row_outcomes, self.new_bytes = {}, {}, 0
