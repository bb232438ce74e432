"""A function's rows as one row of the store's ``packed`` table (schema 4).

Nearly every instruction's row is plain: its finding is its outcome's, with
no instance reason, no decoders' answers and no counterexample.  Such rows
are packed, one blob per function, and so is everything else a function
has per instruction or per outcome, so that a whole kernel is about 46
thousand SQLite rows to write, merge and read rather than 3.6 million:

  outcomes   the function's outcomes by its own index ``k``: store ids, int32 (a shard
             holds them as int64, with the provisional ids negative: the merge maps them)
  counts     instructions per ``k``, uint32 (0 for an outcome only a variant has)
  names      the variant names the function uses by its own index ``j``: ids in
             ``variant_names``, int32 (int64 and provisional in a shard), or NULL
  variants   (offset, j, k) uint32 triples: each live variant of an instruction at a
             boot-patched site whose finding has its outcome's reason, or NULL
  sites      (offset, site kinds mask) uint32 pairs of the packed rows at kernel
             sites, in offset order, or NULL
  data       ``PACKED_ROW`` records, in offset order

Every value is little-endian.  The rows that are not plain stay rows of
``instructions`` (with store ids), and a variant with a reason of its own a
row of ``variants``: the readers put the two together.  Only ``outcomes`` and
``names`` name anything outside the function, so a merge rewrites those two
small arrays and copies the rest as it is.
"""

from __future__ import annotations

import sys
from array import array

from ..errors import StoreError

#: A packed row (``packed.data``), three little-endian u32: the offset in the function;
#: length | fresh << 4 | k << 5; the proof time in µs (saturating).  12 bytes an instruction.
PACKED_ROW = "<III"
FRESH_BIT = 16
K_SHIFT = 5
LENGTH_MASK = 15


def pack_ids(values) -> bytes:
    """Store ids (outcomes, variant names) as the store keeps them: int32 little-endian."""
    return _little(array("i", values))


def pack_wide_ids(values) -> bytes:
    """Ids as a shard keeps them, provisional ones included (``worker.OutcomeIds``): int64 little-endian."""
    return _little(array("q", values))


def pack_u32(values) -> bytes:
    return _little(array("I", values))


def unpack_ids(blob: bytes | None) -> array:
    """The store ids of a ``pack_ids`` blob."""
    return _unpack("i", blob)


def unpack_u32(blob: bytes | None) -> array:
    return _unpack("I", blob)


def _unpack(typecode: str, blob: bytes | None) -> array:
    """The little-endian values of ``blob`` (None or empty: none) as an array of ``typecode``."""
    out = array(typecode)
    if blob:
        out.frombytes(blob)
        if sys.byteorder == "big":
            out.byteswap()
    return out


def remap_ids(blob: bytes | None, final: dict[int, int]) -> bytes | None:
    """A shard's ids (``pack_wide_ids``) as the store keeps them (``pack_ids``), each provisional id
    replaced by its store id in ``final``."""
    if blob is None:
        return None
    ids = _unpack("q", blob)
    try:
        if ids and max(ids) < 0:  # a new store: every id provisional
            return pack_ids(map(final.__getitem__, ids))
        return pack_ids(final[i] if i < 0 else i for i in ids)
    except (KeyError, OverflowError) as exc:
        raise StoreError(f"a shard names an id its store cannot hold ({exc!r}): verify into a new --db") from None


class Remapper:
    """``remap_ids`` as an SQL function of a merge: a function's id arrays repeat (a kernel's 46 thousand
    functions have about 15 thousand distinct outcome lists, fewer name lists), so each is mapped once; an
    error is kept for the merge to raise (SQLite would only say that the function failed)."""

    def __init__(self, final: dict[int, int]):
        self.final = final
        self.memo: dict[bytes, bytes | None] = {}
        self.error: Exception | None = None

    def __call__(self, blob: bytes | None) -> bytes | None:
        if blob is None:
            return None
        got = self.memo.get(blob)
        if got is None:
            try:
                got = self.memo[blob] = remap_ids(blob, self.final)
            except StoreError as exc:
                self.error = exc
                raise
        return got


def site_masks(blob: bytes | None) -> dict[int, int]:
    """offset -> site kinds mask of a function's packed rows at kernel sites."""
    pairs = unpack_u32(blob)
    return dict(zip(pairs[::2], pairs[1::2]))


def variant_triples(blob: bytes | None) -> list[tuple[int, int, int]]:
    """(offset, j, k) of a function's packed variants."""
    v = unpack_u32(blob)
    return list(zip(v[::3], v[1::3], v[2::3]))


def _little(values: array) -> bytes:
    if sys.byteorder == "big":
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()
