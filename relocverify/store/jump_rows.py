"""Jump-probe answers packed per function: what a worker sends its parent and the store keeps.

A whole-kernel ``--jump-probes`` phase answers 2.65 million instructions.  As one row each they
were 2.65 million inserts into ``jump_probes``, made by the run's parent while both workers were
busy (about 3.5 s of the parent's time on a 2-core machine, taken from the workers).  Packed, they
are one row per function of ``jump_packed``: the function's own bucket names (index ``k``, mapped
to ``jump_buckets`` ids by the store), every instruction's offset as a little-endian uint32, and
every instruction's ``k`` as one byte.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Iterable

from ..errors import StoreError
from .packed_rows import pack_u32, unpack_u32

#: Distinct buckets one function may have (``k`` is one byte); a kernel has about 30 in all.
MAX_BUCKETS = 255


@dataclass(frozen=True)
class JumpRow:
    """One function's jump-probe answers: ``buckets[k]`` is a bucket name, ``offsets`` (uint32 LE)
    and ``indexes`` (one ``k`` per byte) are parallel, in the instructions' order."""

    function: int
    buckets: tuple[str, ...]
    offsets: bytes
    indexes: bytes

    def __len__(self) -> int:
        return len(self.indexes)

    def answers(self) -> list[tuple[int, str]]:
        """(offset, bucket name) of every instruction."""
        return [(off, self.buckets[k]) for off, k in zip(unpack_u32(self.offsets), self.indexes)]


def pack_jump_row(function: int, answers: Iterable[tuple[int, str]]) -> JumpRow:
    """A function's (offset, bucket name) answers as one ``JumpRow``."""
    names: dict[str, int] = {}
    offsets = array("I")
    indexes = bytearray()
    for off, bucket in answers:
        k = names.get(bucket)
        if k is None:
            if len(names) == MAX_BUCKETS:
                raise StoreError(f"function {function}: more than {MAX_BUCKETS} jump-probe buckets")
            k = names[bucket] = len(names)
        offsets.append(off)
        indexes.append(k)
    return JumpRow(function, tuple(names), pack_u32(offsets), bytes(indexes))


def pack_ids(ids: Iterable[int]) -> bytes:
    """Bucket ids (``jump_buckets.id``) as the store keeps a function's list of them."""
    return pack_u32(ids)


__all__ = ["JumpRow", "MAX_BUCKETS", "pack_jump_row", "pack_ids", "unpack_u32"]
