"""A lifted block as the proofs read it: its size, its canonical IR (``canonical.canon_block``) and
the facts the lifter checks read (``canonical.ir_facts``).

``lifted(code, address)`` lifts as ``lift.lift`` does, with its refusals (``Gap``), and gives the
block's canonical form and facts.  Two implementations make them:

* **native** (``irsb_walk.c``, built with the package): pyvex's own ``vex_lift`` is called with the
  arguments ``pyvex.lift`` passes it, and the C block libVEX returns is read in place, without
  building pyvex's Python objects (turning VEX's C IR into those objects was about two thirds of
  a lift, and the canonical form about as much again).  It is used only when libVEX lifted the
  block whole (a block, of nonzero size, not ending in ``Ijk_NoDecode``, every tag and enum known
  to pyvex): exactly the cases in which ``pyvex.lift`` returns libVEX's block as it is, with no
  other lifter and no post-processor (none is registered for AMD64).
* **pyvex**: ``lift.lift`` and the reference functions of ``canonical``, for every other block,
  and for all of them when the extension is not built (``NATIVE`` False).

The native walk is a second implementation of ``canon_block`` and ``ir_facts``, not a new
semantics; ``tests/test_lifted.py`` compares the two on every distinct instruction shape of a
kernel (slow) and on random and corpus bytes.  What a proof relies on is unchanged: the same
libVEX block, the same canonical form, the same comparison.
"""

from __future__ import annotations

import logging
from functools import lru_cache

from pyvex.enums import ints_to_enums
from pyvex.lifting.libvex import _libvex_lock
from pyvex.native import ffi, pvc

from ..x86.registers import MASK64
from . import lift as L
from .canonical import NotApplicable, canon_block, ir_facts
from .forms import cpu_length
from .native_walk import MODULE as _walk

NATIVE = _walk is not None  # else the pyvex path serves every block (``native_walk.STATUS`` says why)

_VEX_MAX_INSTRUCTIONS = 99  # pyvex.lifting.libvex's limits, which pyvex.lift applies
_VEX_MAX_BYTES = 5000
_UNWIND_REGS_AT_MEM_ACCESS = 0x702  # VexRegUpdUnwindregsAtMemAccess: pyvex.lift's cross_insn_opt=True


class Lifted:
    """One lifted block: ``size`` (bytes lifted), its canonical form (``canonical``) and, when asked for
    at lift time, its lifter-check facts (``facts``: operation names, memory touched, (offset, type)
    of each Put)."""

    __slots__ = ("size", "facts", "_irsb", "_constant", "_native")

    def __init__(self, size: int, facts, irsb=None, constant=None, native=None):
        self.size = size
        self.facts = facts
        self._irsb = irsb
        self._constant = constant
        self._native = native  # (statements, exit positions, error or None) from irsb_walk.walk

    def canonical(self, resolve=None) -> tuple:
        """``canon_block(block, resolve, constant)``: the same value, or the same exception
        (``NotApplicable``, ``Gap``, ``KeyError``) raised at the same point.  ``resolve`` None is the
        identity (an original's exits are its own)."""
        if self._native is None:
            return canon_block(self._irsb, resolve or _same, self._constant)
        stmts, exits, error = self._native
        if resolve is None:
            if error is not None:
                raise error
            return tuple(stmts)
        out = list(stmts)
        for i in exits:  # in statement order, as canon_block resolves them, before any later error
            st = out[i]
            out[i] = (st[0], st[1], resolve(st[2]), st[3]) if len(st) == 4 else (st[0], resolve(st[1]), st[2])
        if error is not None:
            raise error
        return tuple(out)


def _same(v):
    return v


def lifted(code: bytes, address: int, max_inst: int | None = None, constant=None, facts: bool = False) -> Lifted:
    """``code`` lifted at ``address`` (at most ``max_inst`` instructions), as ``lift.lift`` lifts it:
    ``Gap`` for bytes VEX cannot lift or an instruction boundary the CPU does not draw.  ``constant``
    folds the trampoline's own jump qwords (``canon_block``); ``facts``: also the lifter-check facts."""
    code = bytes(code)
    if NATIVE:
        got = _native(code, address, max_inst, constant, facts)
        if got is not None:
            return got
    irsb = L.lift(code, address, max_inst=max_inst)
    return Lifted(irsb.size, ir_facts(irsb) if facts else None, irsb, constant)


@lru_cache(maxsize=8)
def lifted_one(raw: bytes, address: int) -> Lifted:
    """An original instruction, lifted alone at its address with its facts, the last few remembered:
    the lifter checks read it and then the fast path.  Shared: no caller may change it."""
    return lifted(raw, address, max_inst=1, facts=True)


def _native(code: bytes, address: int, max_inst, constant, facts: bool) -> Lifted | None:
    """The block read natively, or None when ``pyvex.lift`` would do more than return libVEX's block."""
    data = ffi.from_buffer(ffi.BVoidP, code + b"\0" * 8)
    max_bytes = min(len(code), _VEX_MAX_BYTES)
    insns = _VEX_MAX_INSTRUCTIONS if max_inst is None or max_inst > _VEX_MAX_INSTRUCTIONS else max_inst
    with _libvex_lock:
        r = pvc.vex_lift(_VEX_ARCH, _ARCHINFO[0], data, address & MASK64, insns, max_bytes, 1, 0, True, True, 0, 0, 0,
                         _UNWIND_REGS_AT_MEM_ACCESS, 0)
        if r == ffi.NULL or r.size == 0:
            return None
        size = r.size
        walked = _walk.walk(int(ffi.cast(_UINTPTR, r.irsb)), constant, facts)
    if walked is None:
        return None
    stmts, exits, error, block_facts, imarks = walked
    for at, n in imarks:  # lift.lift's refusal of a boundary the CPU does not draw
        off = (at - address) & MASK64
        if off + n > len(code) or cpu_length(code[off:off + 15]) != n:
            raise L.Gap(f"VEX lifts {n} bytes at {at:#x} as one instruction; the CPU does not "
                        f"(another length, or not an instruction)")
    return Lifted(size, block_facts, constant=constant, native=(stmts, exits, error))


def _setup() -> None:
    """The walk's tables, and what every lift passes libVEX as ``pyvex.lift`` does: the architecture's
    ``VexArchInfo`` (pyvex converts ``ARCH.vex_archinfo``, with no cache description, on every lift; it
    is converted once here) and VEX's log level (pyvex sets it from its logger before every lift; it
    only decides what libVEX prints)."""
    global _VEX_ARCH, _ARCHINFO, _UINTPTR
    _VEX_ARCH = getattr(pvc, L.ARCH.vex_arch)
    archinfo = L.ARCH.vex_archinfo
    archinfo["hwcache_info"]["caches"] = ffi.NULL
    try:
        _ARCHINFO = ffi.new("VexArchInfo *", archinfo)
    finally:
        archinfo["hwcache_info"]["caches"] = None
    _UINTPTR = ffi.typeof("uintptr_t")
    pvc.log_level = logging.getLogger("pyvex.lifting.libvex").getEffectiveLevel()
    _walk.setup(dict(ints_to_enums), L.REG_BY_NAME["rip"][0], NotApplicable, L.Gap)


_VEX_ARCH = _ARCHINFO = _UINTPTR = None
if NATIVE:
    _setup()
