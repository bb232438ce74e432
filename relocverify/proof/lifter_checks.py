"""Where VEX's model of an instruction is looser than the hardware, found by
checking the lift against the decoders and the architecture manuals.

``loose_reasons(decoded)`` lists, for one original instruction, every reason
VEX's semantics of it may differ from what the CPU does:

* floating point: claripy's FP theory equates all NaNs (sign and payload
  lost), and angr evaluates the rounding-mode argument VEX reads from MXCSR
  with its own default; MXCSR's status flags and masks are not modelled;
* memory VEX accesses that the decoders say the instruction does not access
  (VEX's helpers spill to a scratch area below rsp: ``bt reg, reg``);
* registers VEX writes beyond the ones the decoders say are written (a REX
  prefix before a legacy prefix, which the hardware ignores and VEX applies);
* flags or results the SDM and the AMD APM leave undefined or vendor-defined
  (``UNDEFINED_RESULTS``, and iced-x86's ``rflags_undefined``): a value VEX
  picks for them is not one the CPU promises;
* flags VEX writes that the decoders say the instruction leaves alone
  (checked by the SMT path, ``vex_clobbers_flags``).

What follows (``proof.admission``): an original with a loose reason is proved
only by a relocation that *re-executes* it (``admission.reexecution``): the
same operation on the same operands, followed by nothing that writes a flag
or one of its outputs.  Then the hardware computes the same loose outputs on both sides,
whatever they are, and VEX is trusted only for where the operands come from.
Any other relocation gets ``unknown`` at best, never ``proved``.
"""

from __future__ import annotations

import re

import iced_x86
from pyvex.const import get_type_size

from ..x86.instruction import Instruction
from . import lift as L
from .lifted import lifted_one

#: VEX operations on floating point: scalar ``AddF64``, lane-wise ``Add64Fx2`` and lowest-lane
#: ``Add64F0x2`` forms, conversions (``I64StoF64``, ``F32toF64``), and the transcendental helpers.
_FP_OP = re.compile(r"F(16|32|64|128)|\dF0?x\d|D(32|64|128)|Round|Sqrt|Recip|Est|Scale|Yl2x|PRem|Atan|Sin|Cos|Tan|2xm1")

#: Results (beyond flags) the manuals leave undefined or vendor-defined, one row per operation.
UNDEFINED_RESULTS: dict[str, str] = {
    "bsf": "leaves its destination undefined for a zero source (Intel SDM); AMD keeps the whole register",
    "bsr": "leaves its destination undefined for a zero source (Intel SDM); AMD keeps the whole register",
    "shld": "leaves the result undefined for a count above the operand size (SDM)",
    "shrd": "leaves the result undefined for a count above the operand size (SDM)",
}

#: iced-x86 RflagsBits, as names.
_FLAG_BITS = (("OF", 1), ("SF", 2), ("ZF", 4), ("AF", 8), ("CF", 16), ("PF", 32))
ARITH = 1 | 2 | 4 | 8 | 16 | 32

_GPR_BYTES = {}  # iced register name -> (vex offset of its 64-bit register, first byte, bytes written)
for _fam, names in {"rax": ("al", "ah", "ax", "eax", "rax"), "rcx": ("cl", "ch", "cx", "ecx", "rcx"),
                    "rdx": ("dl", "dh", "dx", "edx", "rdx"), "rbx": ("bl", "bh", "bx", "ebx", "rbx"),
                    "rsp": ("spl", None, "sp", "esp", "rsp"), "rbp": ("bpl", None, "bp", "ebp", "rbp"),
                    "rsi": ("sil", None, "si", "esi", "rsi"), "rdi": ("dil", None, "di", "edi", "rdi")}.items():
    off = L.REG_BY_NAME[_fam][0]
    lo, hi, word, dword, qword = names
    _GPR_BYTES[lo] = (off, 0, 1)
    if hi:
        _GPR_BYTES[hi] = (off, 1, 1)
    _GPR_BYTES[word] = (off, 0, 2)
    _GPR_BYTES[dword] = (off, 0, 8)  # a 32-bit write zero-extends
    _GPR_BYTES[qword] = (off, 0, 8)
for _k in range(8, 16):
    _off = L.REG_BY_NAME[f"r{_k}"][0]
    _GPR_BYTES[f"r{_k}l"] = (_off, 0, 1)
    _GPR_BYTES[f"r{_k}w"] = (_off, 0, 2)
    _GPR_BYTES[f"r{_k}d"] = (_off, 0, 8)
    _GPR_BYTES[f"r{_k}"] = (_off, 0, 8)
_GPR_OFFSETS = {v[0] for v in _GPR_BYTES.values()}
_REG_NAME = {v: k.lower() for k, v in vars(iced_x86.Register).items() if k.isupper() and isinstance(v, int)}
_WRITES = {3, 4, 5, 6}
_INFO = iced_x86.InstructionInfoFactory()


def flag_names(bits: int) -> str:
    return " ".join(name for name, bit in _FLAG_BITS if bits & bit)


def _iced(raw: bytes, address: int):
    dec = iced_x86.Decoder(64, raw, ip=address)
    return dec.decode()


#: ``loose_reasons`` remembered by (bytes, operation name), up to this many.
LOOSE_LIMIT = 65536
_LOOSE: dict[tuple[bytes, str], tuple[str, ...]] = {}


def loose_reasons(decoded: Instruction) -> tuple[str, ...]:
    """Every reason VEX's model of ``decoded`` may differ from the CPU (empty: none known).

    The reasons are remembered by the instruction's bytes alone: none depends on where it is.  They
    read iced-x86's undefined flags, used registers and used memory (facts of the encoding), the
    operation name, and of VEX's lift the kinds of statements, the offsets and sizes of register
    writes, loads and the names of operations.  Lifted at another address, one instruction's IR
    differs only in constants the address makes (the IMark, the next rip, a branch target, a
    RIP-relative address): 64-bit integers, which no reason reads and which fold only into other
    integer constants, so no statement, write, load or floating-point operation comes or goes.
    ``tests/test_lifter_checks.py`` compares the reasons at random addresses on the kernel's
    instructions.  The lift is made at the instruction's own address (``lifted.lifted_one``), so the fast
    path that lifts it next gets the same IRSB without lifting again."""
    key = (decoded.raw, decoded.opname)
    reasons = _LOOSE.get(key)
    if reasons is None:
        reasons = _loose(decoded.raw, decoded.address, decoded.opname)
        if len(_LOOSE) >= LOOSE_LIMIT:
            _LOOSE.clear()
        _LOOSE[key] = reasons
    return reasons


def _loose(raw: bytes, address: int, opname: str) -> tuple[str, ...]:
    reasons: list[str] = []
    ins = _iced(raw, address)
    undefined = ins.rflags_undefined & ARITH
    if undefined:
        reasons.append(f"leaves {flag_names(undefined)} undefined (vendor-defined)")
    if opname in UNDEFINED_RESULTS:
        reasons.append(f"{opname} {UNDEFINED_RESULTS[opname]}")
    try:
        ops, stores, puts = lifted_one(raw, address).facts
    except L.Gap:
        return tuple(reasons)
    written: dict[int, set[int]] = {}
    for offset, ty in puts:
        if offset in _GPR_OFFSETS:
            written.setdefault(offset, set()).update(range(get_type_size(ty) // 8))
    fp = sorted(o for o in ops if _FP_OP.search(o))
    if fp:
        reasons.append(f"computes floating point ({fp[0]}): claripy's FP theory equates every NaN and ignores "
                       f"MXCSR (rounding control, masks, status flags), so it is not bit-exact")
    info = _INFO.info(ins)
    if stores and not list(info.used_memory()):
        reasons.append("is lifted with a memory access the decoders say it does not make (a VEX helper's "
                       "scratch store)")
    allowed: dict[int, set[int]] = {}
    for r in info.used_registers():
        name = _REG_NAME.get(r.register, "")
        if r.access in _WRITES and name in _GPR_BYTES:
            off, first, n = _GPR_BYTES[name]
            allowed.setdefault(off, set()).update(range(first, first + n))
    for off, nbytes in written.items():
        extra = nbytes - allowed.get(off, set())
        if extra and off != L.REG_BY_NAME["rsp"][0] and off != L.REG_BY_NAME["rip"][0]:
            name = next(n for n, v in L.REG_BY_NAME.items() if v[0] == off and v[1] == 8)
            reasons.append(f"is lifted writing {name}[{min(extra)}:{max(extra) + 1}], which the decoders say it "
                           f"leaves alone (a prefix VEX applies and the CPU ignores?)")
    return tuple(reasons)


def unaffected_flags(decoded: Instruction) -> int:
    """The arithmetic flags (iced RflagsBits) ``decoded`` leaves alone."""
    return ARITH & ~_iced(decoded.raw, decoded.address).rflags_modified
