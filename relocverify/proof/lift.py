"""The lifter: bytes to VEX IR (pyvex), and the architecture's guest state, without angr.

Everything here is pyvex and archinfo (a fraction of a second to import); the
semantics that evaluates IR (``proof.semantics``) needs angr's operations and
flag helpers and is imported only when a proof cannot be made by IR identity
(``proof.fast_path``).

``lift(code, addr)`` refuses, as a ``Gap`` value, bytes VEX cannot decode
and any instruction boundary VEX draws where the CPU does not
(``forms.cpu_length``: iced-x86 follows the hardware).
"""

from __future__ import annotations

from functools import lru_cache

import archinfo
import pyvex

from ..x86.registers import MASK64
from .forms import cpu_length

ARCH = archinfo.ArchAMD64()


REG_BY_NAME = {r.name: (r.vex_offset, r.size) for r in ARCH.register_list}
#: State the CPU has and VEX does not, kept beside VEX's guest state at offsets past its end: bits
#: 511:256 of zmm0-15 (``zmmhi0``..``zmmhi15``), which a VEX-encoded write of that register zeroes on
#: a CPU with AVX-512 (SDM Vol. 1 §15.5) and a legacy-SSE write leaves alone.
SYNTHETIC_BASE = 0x10000
ZMM_HI = tuple(f"zmmhi{i}" for i in range(16))
for _i, _name in enumerate(ZMM_HI):
    REG_BY_NAME[_name] = (SYNTHETIC_BASE + 32 * _i, 32)
#: VEX guest-state byte offset -> (register name, its offset, its size): which register a Put/Get touches.
REG_OF_BYTE: dict[int, tuple[str, int, int]] = {}
for _name, (_off, _size) in REG_BY_NAME.items():
    for _k in range(_size):
        REG_OF_BYTE[_off + _k] = (_name, _off, _size)

FLAG_THUNK = ("cc_op", "cc_dep1", "cc_dep2", "cc_ndep")
# VEX bookkeeping, not architectural state: emulation notes, the clflush
# range hint, the redirection address, and the rip a syscall was made at.
VEX_BOOKKEEPING = frozenset({"emnote", "cmstart", "cmlen", "nraddr", "ip_at_syscall"})
OSZACP = 0x8D5  # OF SF ZF AF PF CF
G_CC_OP_COPY = 0
NORMAL_JUMPKINDS = frozenset({"Ijk_Boring", "Ijk_Call", "Ijk_Ret"})

#: Exception vectors, plus one (0 is "no fault"): what an outcome's ``fault`` holds.
FAULT_CODES = {"#DE": 1, "#BP": 4, "#UD": 7, "#GP": 14, "#PF": 15, "#AC": 18, "#XM": 20}
FAULT_NAMES = {v: k for k, v in FAULT_CODES.items()}
#: VEX's jumpkinds for the faults it models itself.
FAULT_JUMPKINDS = {"Ijk_SigFPE_IntDiv": "#DE", "Ijk_SigFPE_IntOvf": "#DE", "Ijk_SigSEGV": "#GP",
                   "Ijk_SigILL": "#UD", "Ijk_SigTRAP": "#BP", "Ijk_SigBUS": "#AC"}


class Gap(Exception):
    """Semantics missing: raised inside the interpreter, returned as a value by ``execute``."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@lru_cache(maxsize=8)
def lift_one(raw: bytes, addr: int):
    """``lift(raw, addr, max_inst=1)``, the last few remembered: an original instruction is lifted at
    its address by the lifter checks and then by the fast path, one after the other.  The IRSB is
    shared: no caller may change it (none does: they read it into canonical forms or reasons)."""
    return lift(raw, addr, max_inst=1)


def lift(code: bytes, addr: int, max_inst: int | None = None):
    try:
        irsb = pyvex.lift(code, addr, ARCH, max_inst=max_inst, opt_level=1)
    except Exception as exc:  # pyvex raises PyVEXError and others for bytes it cannot lift
        raise Gap(f"pyvex could not lift the bytes at {addr:#x}: {exc}") from None
    if irsb.jumpkind == "Ijk_NoDecode":
        raise Gap(f"VEX cannot decode the instruction at {addr:#x} (Ijk_NoDecode)")
    if irsb.size == 0:
        raise Gap(f"VEX lifted nothing at {addr:#x}")
    for st in irsb.statements:
        if type(st) is pyvex.stmt.IMark:
            off = (st.addr - addr) & MASK64
            if off + st.len > len(code) or cpu_length(bytes(code[off:off + 15])) != st.len:
                raise Gap(f"VEX lifts {st.len} bytes at {st.addr:#x} as one instruction; the CPU does not "
                          f"(another length, or not an instruction)")
    return irsb
