"""A worker's functions' rows kept in the proof cache (``row_memo``): those a survey copies, those it keeps.

A function whose key (``row_memo.function_key``) the cache holds rows under is copied into the store with
this store's outcome and variant-name ids (``reuse``), and sealed here with the store's key from the rows
copied (``store.row_seals.function_mac``: the merge keeps the seal when it holds, else seals them itself); a
function verified now is kept for the cache as a run on a warm cache would write it (``keep``), and written to
the cache a few megabytes at a time (``flush``)."""

from __future__ import annotations

from ..errors import StoreError
from ..store.cache import ProofCache
from ..store.packed_rows import pack_wide_ids
from ..store.row_seals import function_head, function_mac, outcome_fields, seal_of
from ..store.sqlite_errors import DatabaseError
from ..store.store import read_only
from ..versions import source_digest
from .row_memo import canonical, context_digest, kept_rows, outcome_digest, unpack_kept

_UNSET = object()


class RowKeeper:
    """What one worker copies from, and keeps for, the proof cache's function rows, from image to image."""

    def __init__(self):
        self.new_rows: dict[bytes, tuple[bytes, bytes]] = {}  # function key -> (context, kept rows), for the cache
        self.new_row_outcomes: dict[bytes, bytes] = {}  # outcome digest -> what it stands for, for the cache
        self.new_bytes = 0  # the size of ``new_rows``
        self.reused = 0  # functions whose rows were copied from the cache
        self._digests: dict[int, bytes] = {}  # outcome id -> its digest (``row_memo.outcome_digest``)
        self._joined: dict[tuple[int, ...], bytes] = {}  # a list of outcome ids -> their digests joined
        self._row_outcomes: dict[bytes, tuple[tuple, str]] | None = None  # the cache's digests, once read
        # A copied function's outcome digests -> their ids in ``_ids`` and those packed (None: they do not fit
        # the store), and its variant names -> their packed ids: a kernel's 46 thousand functions have about 15
        # thousand distinct outcome lists, 616 thousand digests in all.  Forgotten when the ids change.
        self._ids = None
        self._outcome_ids: dict[bytes, tuple | None] = {}
        self._name_ids: dict[tuple, tuple[bytes, bytes]] = {}
        self._fields: dict[bytes, bytes] = {}  # an outcome digest -> what it stands for as a seal names it
        self._rows_cache: ProofCache | None = None
        self._context = _UNSET
        self._store = None  # the store's read-only connection (``store.read_only``), for seals (``heads``)
        self._store_path = None
        self._seal = None  # the store's seal (``row_seals.seal_of``); None: a store without seals

    def next_image(self) -> None:
        """The next image of a session: its context is made anew, outcome ids are the new store's (or numbered
        anew), and the cache may hold more outcome digests since."""
        self._context = _UNSET
        self._digests = {}
        self._joined = {}
        self._row_outcomes = None
        self._fields = {}
        self.forget_ids()

    def forget_ids(self) -> None:
        """The outcome and variant name ids of copied rows forgotten: the store numbered the provisional ones
        (``OutcomeIds.learn``), or the next image has ids of its own."""
        self._ids = None
        self._outcome_ids = {}
        self._name_ids = {}

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

    def heads(self, job, fids: list[int]) -> dict[int, tuple[tuple, bytes]]:
        """What the seals of these functions say first (``row_seals.function_head``), read from the store: {} when
        the store has no seal key, or cannot be read here (the merge seals those functions itself).  The
        connection stays open until ``close_store``."""
        if not fids:
            return {}
        if self._store is not None and self._store_path != job.store_path:
            self.close_store()
        try:
            if self._store is None:
                self._store = read_only(job.store_path)
                self._store_path = job.store_path
                self._seal = seal_of(self._store)
            return {} if self._seal is None else function_head(self._store, fids, job.config)
        except (DatabaseError, StoreError):
            self.close_store()
            return {}

    def close_store(self) -> None:
        """The store's connection closed (a phase's end: ``Worker.close_shard``), so that the run's own closes last
        (it checkpoints the store and removes its log)."""
        store, self._store, self._seal, self._store_path = self._store, None, None, None
        if store is not None:
            store.close()

    def close(self) -> None:
        self.close_store()
        if self._rows_cache is not None:
            self._rows_cache.close()
            self._rows_cache = None

    def reuse(self, fid: int, value: bytes, batch, ids, head: tuple[tuple, bytes] | None = None) -> int | None:
        """A function's kept rows (``row_memo.kept_rows``) added to ``batch`` with this store's outcome
        and variant name ids, and sealed when ``head`` is given (``heads``); how many instructions.  None, with
        nothing added, when they do not fit this store: an outcome it holds under another reason, or a damaged
        value."""
        got = unpack_kept(value)
        if got is None:
            return None
        n, digests, counts, names, variants, sites, data, full, reasoned = got
        if ids is not self._ids:
            self.forget_ids()
            self._ids = ids
        mapped = self._outcome_ids.get(digests, _UNSET)
        if mapped is _UNSET:
            mapped = self._outcome_ids[digests] = self._outcome_ids_of(digests, ids)
        if mapped is None:
            return None
        oids, packed_oids, fields, said, reasons = mapped
        batch.functions.append(fid)
        packed = None
        if oids:  # a function with no instruction of its own has no packed row (``_Batch.end_function``)
            packed_names, named = None, b""
            if names:
                got = self._name_ids.get(names)
                if got is None:
                    got = self._name_ids[names] = (pack_wide_ids(map(ids.name, names)),
                                                   b"\0".join([name.encode() for name in names]))
                packed_names, named = got
            batch.packed.append((fid, packed_oids, counts, packed_names, variants, sites, data))
            batch.n_packed += len(data) // 12
            packed = [said, counts, named, variants or b"", sites or b"", data]
        batch.full.extend((fid, off, length, oids[k], reason, us, 0, mask, answers, None)
                          for off, length, k, reason, us, mask, answers in full)
        batch.variants.extend((fid, off, vname, oids[k], reason) for off, vname, k, reason in reasoned)
        if head is not None and self._seal is not None:  # the rows as the merge stores them (``shard.merge``)
            batch.seal_outcomes.update(reasons)
            batch.seals.append((fid, function_mac(
                self._seal, head[0], head[1], packed,
                sorted((off, length, fields[k], reason, us, 0, mask, answers, None, None, None)
                       for off, length, k, reason, us, mask, answers in full) if full else (),
                sorted((off, vname, fields[k], reason) for off, vname, k, reason in reasoned) if reasoned else ())))
        self.reused += 1
        return n

    def _outcome_ids_of(self, digests: bytes, ids) -> tuple[list[int], bytes, list[bytes], bytes, dict] | None:
        """The ids of a copied function's outcomes (``row_memo.outcome_digest`` each, by ``k``), defined in ``ids``
        when new, those packed, the outcomes as its seal names them (``row_seals.outcome_fields``), each and
        joined by NUL, and each id's reason; None, with nothing defined, when one is unknown to the cache or
        the store holds it under another reason.  The same digests give the same answer until the ids change:
        the cache's table is read once per image, and an outcome the store holds keeps its reason."""
        known, table, named = ids.known, self._row_outcomes or {}, self._fields
        described, fields = [], []
        for i in range(0, len(digests), 8):
            digest = digests[i:i + 8]
            d = table.get(digest)
            if d is None:
                return None
            hit = known.get(d[0])
            if hit is not None and hit[1] != d[1]:
                return None
            described.append(d)
            f = named.get(digest)
            if f is None:
                f = named[digest] = outcome_fields(*d)
            fields.append(f)
        define = ids.define
        oids = [define(outcome, reason)[0] for outcome, reason in described]
        return oids, pack_wide_ids(oids), fields, b"\0".join(fields), {o: d[1] for o, d in zip(oids, described)}

    def keep(self, fkey: bytes, batch, n: int, f0: int, v0: int, kmap: dict[int, int],
             names: dict[int, int], fresh: bool, ids, order=None) -> None:
        """The function just added to ``batch`` (its packed row last, its full rows from ``f0``, variants
        with reasons from ``v0``), kept for the cache under ``fkey`` as a run on a warm cache would write
        it (``row_memo.kept_rows``).  ``order``: its outcome ids by ``kmap``'s index, when the caller has them."""
        if not kmap:  # no instruction of its own (another function owns them all): no packed row
            counts = variants = sites = None
            data = b""
        else:
            _, _, counts, _, variants, sites, data = batch.packed[-1]
        if order is None:
            order = sorted(kmap, key=kmap.__getitem__)
        full = [(r[1], r[2], kmap[r[3]], r[4], r[5], r[7], r[8], r[9] is not None) for r in batch.full[f0:]]
        text = ids.name_text
        value = kept_rows(n, self.digests(order, ids), counts, [text(i) for i in names], variants,
                          sites, data, fresh, full, [(r[1], r[2], kmap[r[3]], r[4]) for r in batch.variants[v0:]])
        self.new_rows[fkey] = (self._context, value)
        self.new_bytes += len(value)

    def digests(self, order, ids) -> bytes:
        """The ``digest`` of each outcome of ``order``, joined: remembered by the list, since functions repeat
        lists (a kernel's 46 thousand functions have about 15 thousand, 616 thousand outcomes in all)."""
        order = tuple(order)
        joined = self._joined.get(order)
        if joined is None:
            known = self._digests
            joined = self._joined[order] = b"".join([known.get(o) or self.digest(o, ids) for o in order])
        return joined

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
