"""VEX (pyvex) behind ``protocol.Decoder``: the length of the lifted
instruction and its branch target.

VEX IR keeps no encoding positions, so VEX reports no displacement or
immediate fields; ``registers_read`` gives the guest registers the lifted
instruction reads (its ``GET`` statements), the operands it reads.
A block VEX cannot lift (``Ijk_NoDecode``) is an error answer.
"""

from __future__ import annotations

import pyvex
import archinfo

from .protocol import Facts, delta, error

_ARCH = archinfo.ArchAMD64()


def _lift(raw: bytes, address: int):
    try:
        return pyvex.lift(raw, address, _ARCH, max_inst=1, opt_level=1)
    except (pyvex.PyVEXError, Exception) as e:  # pyvex raises plain errors too; converted here only
        return e


def gate_facts(raw: bytes, address: int) -> Facts:
    irsb = _lift(raw, address)
    if isinstance(irsb, Exception):
        return error(f"vex: {type(irsb).__name__}: {irsb}")
    if irsb.jumpkind == "Ijk_NoDecode" or irsb.size == 0:
        return error("vex: no decode (Ijk_NoDecode)")
    return Facts(irsb.size, None, None, 0, None, 0, delta(_branch_target(irsb, address), address))


def _branch_target(irsb, address: int) -> int | None:
    """A constant successor other than the next instruction and the instruction itself (rep loops)."""
    fallthrough = address + irsb.size
    candidates = [s.dst.value for s in irsb.statements
                  if isinstance(s, pyvex.stmt.Exit) and s.jumpkind == "Ijk_Boring"]
    if isinstance(irsb.next, pyvex.expr.Const) and irsb.jumpkind in ("Ijk_Boring", "Ijk_Call"):
        candidates.append(irsb.next.con.value)
    targets = [c for c in candidates if c not in (fallthrough, address)]
    return targets[0] if targets else None


def registers_read(raw: bytes, address: int) -> frozenset[str]:
    """Names of the guest registers the lifted instruction reads."""
    irsb = _lift(raw, address)
    if isinstance(irsb, Exception):
        return frozenset()
    names = set()
    for s in irsb.statements:
        for e in s.expressions:
            if isinstance(e, pyvex.expr.Get):
                names.add(_ARCH.translate_register_name(e.offset, e.result_size(irsb.tyenv) // 8))
    return frozenset(names)


class VexAdapter:
    """pyvex behind ``protocol.Decoder``: length and branch target only."""

    name = "vex"
    fields = frozenset({"length", "target"})

    def version(self) -> str:
        return pyvex.__version__

    def decode_many(self, items):
        return [gate_facts(raw, address) for address, raw in items]
