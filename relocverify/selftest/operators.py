"""Mutation operators: relocations that look equivalent to the original and may not be, one family per
class of false proof, and controls that are truly equivalent.

Every operator takes a real instruction *shape* (kernel or corpus bytes,
re-aimed for user space by ``shape_for``) and a random generator and returns
a ``Candidate`` (or None when it does not apply to that shape).  A candidate
runs the original at ``AT`` and the relocation at ``TRAMP``, both user-space
addresses within rel32 reach of each other and of the data arena, so the CPU
judge (``selftest.judgement``) can run both; tracer memory is the relocation's
bytes and, when a candidate needs save slots, ``SLOTS``.

``OPERATORS`` is the table: each row names its class (the number of the
soundness issue's class, 0 for controls), what it does and why it may not be
equivalent.  The classes:

 1 legacy prefix after REX       6 wrong VEX flag helpers        11 code that writes code
 2 NaN sign and payload          7 x87 state VEX lacks           12 the walker vs control flow
 3 MXCSR status flags            8 AVX-512 state                 13 store width and tearing
 4 memory ordering               9 faults                        14 constant/fixed-path models
 5 undefined flags (relocated)  10 vendor decoding               15 vacuous preconditions

and the machine the relocation runs in (issue 41), at a user (CPL 3) or kernel (CPL 0) site (``Site``):

16 which fault (#SS/#GP, W bit) 18 data below RSP at CPL 0       20 shadow stacks
17 traps and shadows late       19 IBT at CPL 0                  21 alignment checking at CPL 3
22 edge operands of flag helpers
"""

from __future__ import annotations

import random
import shlex
import struct
from dataclasses import dataclass, field
from typing import Callable

import iced_x86 as iced

from ..concrete import states as ST
from ..plan.plan import PlanKind, make_plan
from ..proof import form_table
from ..proof.forms import facts

AT = 0x30000100
TRAMP = 0x31000000
SLOT = 0x32000000
SLOTS = ((SLOT, 0x100),)
_C, _R, _I = iced.Code, iced.Register, iced.Instruction


@dataclass(frozen=True)
class Candidate:
    """One original/relocation pair for the checker and the judge."""

    operator: str
    klass: int
    orig: bytes
    reloc: bytes
    at: int = AT
    tramp: int = TRAMP
    tracer_memory: tuple[tuple[int, int], ...] = ()
    note: str = ""
    concurrency: bool = False  # judged by the memory-model table, not by sequential runs

    @property
    def replay(self) -> str:
        parts = ["relocverify", "prove", "--orig", self.orig.hex(), "--at", hex(self.at), "--reloc",
                 self.reloc.hex(), "--tramp", hex(self.tramp)]
        for lo, n in self.tracer_memory:
            parts += ["--tracer-memory", f"{lo:#x}:{n:#x}"]
        return " ".join(shlex.quote(p) for p in parts)


@dataclass(frozen=True)
class Operator:
    name: str
    klass: int
    what: str
    make: Callable[["Shape", random.Random], Candidate | None] = field(compare=False)
    control: bool = False
    wants: Callable[[bytes], bool] | None = field(default=None, compare=False)  # shapes worth trying first


def _wants_fence(raw: bytes) -> bool:
    f = facts(raw)
    return f is not None and f.hazards.fence is not None


def _wants_lock(raw: bytes) -> bool:
    f = facts(raw)
    return f is not None and f.hazards.locked and not f.position_dependent


def _wants_store(raw: bytes) -> bool:
    f = facts(raw)
    return f is not None and f.code in ("MOV_RM64_R64", "MOV_RM32_R32") and "m" in f.form.split(" ")[1][:2] \
        and not f.position_dependent and ":gs" not in f.form and ":fs" not in f.form


def _wants_validated(raw: bytes) -> bool:
    """A shape whose form the CPU validated (exact or loose): controls are drawn from these, since the checker
    rightly proves nothing about an unvalidated form."""
    f = facts(raw)
    return f is not None and form_table.load().status(f.form) in ("exact", "loose")


def _wants_exact(raw: bytes) -> bool:
    """A shape whose form the CPU validated exact: a control that moves the instruction's operands around
    (not a re-execution of the original) is provable only for these."""
    f = facts(raw)
    return f is not None and form_table.load().status(f.form) == "exact"


def _wants_prefixed(raw: bytes) -> bool:
    return len(raw) > 1 and (raw[0] in _LEGACY or 0x40 <= raw[0] <= 0x4F) and (raw[1] in _LEGACY or 0x40 <= raw[1] <= 0x4F)


# ---------------------------------------------------------------------------
# Shapes and encoding helpers
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    raw: bytes
    ins: iced.Instruction = field(compare=False)
    mnemonic: str
    prefixes: int  # count of legacy and REX prefix bytes

    @property
    def end(self) -> int:
        return AT + len(self.raw)


_MNEMONIC = {v: k.lower() for k, v in vars(iced.Mnemonic).items() if k.isupper()}


def _patch(raw: bytes, offset: int, size: int, value: int) -> bytes:
    return raw[:offset] + (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little") + raw[offset + size:]


def shape_for(raw: bytes) -> Shape | None:
    """``raw`` re-aimed for user space at ``AT`` (a RIP-relative or absolute operand into the arena, a
    branch to a pad), or None if it is not one valid instruction."""
    f = facts(raw)
    if f is None:
        return None
    dec = iced.Decoder(64, raw, ip=AT)
    ins = dec.decode()
    co = dec.get_constant_offsets(ins)
    if co.has_displacement and ins.is_ip_rel_memory_operand:
        raw = _patch(raw, co.displacement_offset, co.displacement_size,
                     ST.ARENA + ST.ARENA_SIZE // 2 - (AT + len(raw)))
    elif co.has_displacement and ins.memory_base == _R.NONE and ins.memory_index == _R.NONE \
            and ins.segment_prefix not in (_R.FS, _R.GS) and co.displacement_size >= 4:
        raw = _patch(raw, co.displacement_offset, co.displacement_size, ST.ARENA + ST.ARENA_SIZE // 2)
    if co.has_immediate and ins.op_count and ins.op0_kind in (iced.OpKind.NEAR_BRANCH16, iced.OpKind.NEAR_BRANCH32,
                                                               iced.OpKind.NEAR_BRANCH64):
        raw = _patch(raw, co.immediate_offset, co.immediate_size, 0x40 if co.immediate_size == 1 else 0x1000)
    ins = iced.Decoder(64, raw, ip=AT).decode()
    if ins.is_invalid:
        return None
    n = 0
    while n < len(raw) and (raw[n] in _LEGACY or 0x40 <= raw[n] <= 0x4F):
        n += 1
    return Shape(raw, ins, _MNEMONIC[ins.mnemonic], n)


_LEGACY = frozenset({0x66, 0x67, 0xF0, 0xF2, 0xF3, 0x2E, 0x36, 0x3E, 0x26, 0x64, 0x65})


def enc(*instructions: iced.Instruction, at: int = TRAMP) -> bytes:
    e = iced.Encoder(64)
    out = b""
    for ins in instructions:
        e.encode(ins, at + len(out))
        out += e.take_buffer()
    return out


def jmp(at: int, target: int) -> bytes:
    return b"\xe9" + struct.pack("<i", target - (at + 5))


def with_back(body: bytes, shape: Shape, tramp: int = TRAMP) -> bytes:
    """``body`` at ``tramp`` followed by the jump back to A+len."""
    return body + jmp(tramp + len(body), shape.end)


def own_plan(shape: Shape) -> bytes | None:
    from ..x86.decode import decode

    plan = make_plan(decode(shape.raw, AT), TRAMP)
    return plan.trampoline if plan.kind in (PlanKind.COPY, PlanKind.REWRITE) and plan.trampoline else None


def _position_independent(shape: Shape) -> bool:
    return not facts(shape.raw).position_dependent and shape.ins.flow_control == iced.FlowControl.NEXT


def _mem_of(ins: iced.Instruction, extra: int = 0) -> iced.MemoryOperand:
    """The instruction's memory operand (base, index, scale, displacement) as an encoder operand, ``extra``
    bytes further on."""
    disp = ins.memory_displacement
    disp = (disp - (1 << 64) if disp >> 63 else disp) + extra
    return iced.MemoryOperand(ins.memory_base, ins.memory_index, ins.memory_index_scale, disp, 8 if disp else 0)


def _reg_ops(shape: Shape) -> list[int]:
    return [shape.ins.op_register(k) for k in range(shape.ins.op_count) if shape.ins.op_kind(k) == iced.OpKind.REGISTER]


def _gpr64(shape: Shape, rng: random.Random) -> int:
    regs = [iced.RegisterExt.full_register(r) for r in _reg_ops(shape) if iced.RegisterExt.is_gpr(r)]
    regs = [r for r in regs if r not in (_R.RSP, _R.RIP)]
    return regs[0] if regs else rng.choice((_R.RAX, _R.RBX, _R.RCX, _R.RDX, _R.RSI, _R.RDI, _R.R8, _R.R11))


def _xmm(rng: random.Random) -> int:
    return _R.XMM0 + rng.randrange(16)


def _cand(name: str, klass: int, shape: Shape, reloc: bytes, note: str = "", **kw) -> Candidate:
    return Candidate(name, klass, shape.raw, reloc, note=note, **kw)


# ---------------------------------------------------------------------------
# Class 1: legacy prefixes after REX
# ---------------------------------------------------------------------------

_LEGACY_CHOICES = (0x66, 0x67, 0xF2, 0xF3, 0x2E, 0x36, 0x3E, 0x26, 0x64, 0x65, 0xF0)


def rex_before_legacy(shape: Shape, rng: random.Random) -> Candidate | None:
    """REX then a legacy prefix in front of the instruction: the CPU ignores that REX, VEX applies it."""
    if not _position_independent(shape) or shape.prefixes > 3 or facts(shape.raw).code.startswith(("VEX_", "EVEX_")):
        return None
    raw = shape.raw
    legacy = bytes(b for b in raw[:shape.prefixes] if b in _LEGACY)
    rex = bytes(b for b in raw[:shape.prefixes] if 0x40 <= b <= 0x4F) or bytes([0x40 | rng.getrandbits(4)])
    rex = bytes([0x40 | rng.getrandbits(4) if rng.random() < 0.3 else rex[0]])
    if rng.random() < 0.25:
        rex = bytes([0x48 | rng.getrandbits(3)]) + rex  # two REX in a row
    extra = bytes([rng.choice(_LEGACY_CHOICES)])
    mutated = legacy + rex + extra + raw[shape.prefixes:]
    if len(mutated) > 15:
        return None
    return _cand("rex-before-legacy", 1, shape, with_back(mutated, shape), f"REX {rex.hex()} before {extra.hex()}")


def prefix_reorder(shape: Shape, rng: random.Random) -> Candidate | None:
    """The original's prefixes in another order: a REX moved before a legacy prefix is ignored by the CPU."""
    if not _position_independent(shape) or shape.prefixes < 2:
        return None
    pre = list(shape.raw[:shape.prefixes])
    rng.shuffle(pre)
    if bytes(pre) == shape.raw[:shape.prefixes]:
        pre.reverse()
    mutated = bytes(pre) + shape.raw[shape.prefixes:]
    return _cand("prefix-reorder", 1, shape, with_back(mutated, shape), f"prefixes {bytes(pre).hex()}")


# ---------------------------------------------------------------------------
# Classes 2 and 3: NaNs through integer-looking arithmetic; MXCSR status flags
# ---------------------------------------------------------------------------

_ONE = struct.pack("<dd", 1.0, 1.0)
_SIGN = struct.pack("<QQ", 1 << 63, 1 << 63)


def _with_constant(body: bytes, shape: Shape, const: bytes) -> bytes:
    """``body`` (whose RIP-relative operand names ``TRAMP + CONST_AT``), the jump back, then ``const`` there."""
    code = with_back(body, shape)
    return code + bytes(CONST_AT - len(code)) + const


CONST_AT = 0x40  # offset of a relocation's constant in its trampoline (after the jump back): tracer memory


def nan_sign(shape: Shape, rng: random.Random) -> Candidate | None:
    """Bitwise xmm operations (exact on every bit, NaNs included) against arithmetic twins that agree on
    numbers only: a move vs x*1.0, x+(-0.0), min(x,x) or max(x,x) (quieted SNaNs, flushed denormals);
    xorpd/pxor with the sign mask vs 0-x or x*-1.0; a NaN's sign and payload are where they part."""
    d, s_ = _xmm(rng), _xmm(rng)
    kind = rng.randrange(6)
    mem = iced.MemoryOperand(_R.RIP, displ=TRAMP + CONST_AT)
    if kind == 0:
        orig = enc(_I.create_reg_reg(_C.MOVAPD_XMM_XMMM128, d, s_), at=AT)
        body, const = enc(_I.create_reg_reg(_C.MOVAPD_XMM_XMMM128, d, s_), _I.create_reg_mem(_C.MULPD_XMM_XMMM128, d, mem)), _ONE
        why = "movapd vs movapd; mulpd by 1.0"
    elif kind == 1:
        orig = enc(_I.create_reg_reg(_C.MOVAPD_XMM_XMMM128, d, s_), at=AT)
        body, const = enc(_I.create_reg_reg(_C.MOVAPD_XMM_XMMM128, d, s_), _I.create_reg_mem(_C.ADDPD_XMM_XMMM128, d, mem)), _SIGN
        why = "movapd vs movapd; addpd -0.0"
    elif kind == 2:
        orig = enc(_I.create_reg_reg(_C.MOVAPD_XMM_XMMM128, d, s_), at=AT)
        body, const = enc(_I.create_reg_reg(_C.MOVAPD_XMM_XMMM128, d, s_), _I.create_reg_reg(
            rng.choice((_C.MINPD_XMM_XMMM128, _C.MAXPD_XMM_XMMM128)), d, d)), b""
        why = "movapd vs movapd; minpd/maxpd d,d"
    elif kind == 3:
        orig = enc(_I.create_reg_mem(_C.XORPD_XMM_XMMM128, d, iced.MemoryOperand(_R.RIP, displ=AT + 0x40)), at=AT)
        body, const = enc(_I.create_reg_mem(_C.MULPD_XMM_XMMM128, d, mem)), struct.pack("<dd", -1.0, -1.0)
        why = "xorpd with a mask in memory vs mulpd by -1.0"
    elif kind == 4:
        orig = enc(_I.create_reg_reg(_C.PXOR_XMM_XMMM128, d, d), at=AT)
        body, const = enc(_I.create_reg_reg(_C.SUBPD_XMM_XMMM128, d, d)), b""
        why = "pxor d,d (zero) vs subpd d,d (NaN for NaN and infinity)"
    else:
        orig = enc(_I.create_reg_reg(_C.ANDPD_XMM_XMMM128, d, d), at=AT)
        body, const = enc(_I.create_reg_reg(_C.MAXPD_XMM_XMMM128, d, d)), b""
        why = "andpd d,d (identity) vs maxpd d,d (IE on NaN)"
    shape_o = _shape_of(orig)
    reloc = _with_constant(body, shape_o, const) if const else with_back(body, shape_o)
    return Candidate("nan-sign", 2, orig, reloc, note=why)


def _shape_of(raw: bytes) -> Shape:
    s = shape_for(raw)
    assert s is not None
    return s


_MXCSR_INSERTS = (
    (_C.MAXSD_XMM_XMMM64, "maxsd x,x: the result is x, but a NaN operand sets MXCSR.IE"),
    (_C.MINSD_XMM_XMMM64, "minsd x,x: the result is x, but a NaN operand sets MXCSR.IE"),
    (_C.MAXPS_XMM_XMMM128, "maxps x,x: the result is x, but a NaN sets IE and a denormal DE"),
    (_C.MINPD_XMM_XMMM128, "minpd x,x: the result is x, but a NaN sets IE"),
    (_C.MOVSD_XMM_XMMM64, "movsd x,x: no flag (a control twin inside a false-proof family)"),
)


def mxcsr_status(shape: Shape, rng: random.Random) -> Candidate | None:
    """The copy with an FP operation whose result is its own operand inserted before it (max(x,x),
    min(x,x)): VEX sees no change; the CPU sets MXCSR status flags (IE, DE) for NaN or denormal x."""
    if not _position_independent(shape):
        return None
    code, why = rng.choice(_MXCSR_INSERTS[:4])
    x = _xmm(rng)
    body = enc(_I.create_reg_reg(code, x, x)) + shape.raw
    return _cand("mxcsr-status", 3, shape, with_back(body, shape), why)


_PREDICATES = ((0, 8, "EQ_OQ vs EQ_UQ: unordered NaNs compare equal in one"), (0, 16, "EQ_OQ vs EQ_OS: IE on QNaN"),
               (1, 9, "LT_OS vs NGE_US"), (4, 12, "NEQ_UQ vs NEQ_OQ"), (7, 3, "ORD_Q vs UNORD_Q"),
               (0x11, 0x1, "LT_OQ vs LT_OS: IE on QNaN"))


def compare_predicate(shape: Shape, rng: random.Random) -> Candidate | None:
    """A compare whose predicate is swapped for one that agrees on numbers: ordered vs unordered
    (different results on NaNs), quiet vs signalling (different MXCSR.IE); comisd vs ucomisd."""
    a, b = _xmm(rng), _xmm(rng)
    p, q, why = rng.choice(_PREDICATES)
    if rng.random() < 0.25:
        orig = enc(_I.create_reg_reg(_C.UCOMISD_XMM_XMMM64, a, b), at=AT)
        reloc = enc(_I.create_reg_reg(_C.COMISD_XMM_XMMM64, a, b))
        why = "ucomisd vs comisd: IE on a QNaN operand"
    elif rng.random() < 0.5 or p > 7 or q > 7:
        orig = enc(_I.create_reg_reg_reg_u32(_C.VEX_VCMPSD_XMM_XMM_XMMM64_IMM8, a, a, b, p), at=AT)
        reloc = enc(_I.create_reg_reg_reg_u32(_C.VEX_VCMPSD_XMM_XMM_XMMM64_IMM8, a, a, b, q))
    else:
        orig = enc(_I.create_reg_reg_u32(_C.CMPSD_XMM_XMMM64_IMM8, a, b, p), at=AT)
        reloc = enc(_I.create_reg_reg_u32(_C.CMPSD_XMM_XMMM64_IMM8, a, b, q))
    s = _shape_of(orig)
    return Candidate("compare-predicate", 3, orig, with_back(reloc, s), note=why)


_CONVERSIONS = (
    (_C.CVTTSD2SI_R64_XMMM64, _C.CVTSD2SI_R64_XMMM64, "truncating vs current rounding: equal on integers only"),
    (_C.CVTSD2SS_XMM_XMMM64, _C.MOVSD_XMM_XMMM64, "a narrowing conversion vs a move"),
    (_C.CVTSI2SD_XMM_RM64, _C.CVTSI2SS_XMM_RM64, "int to double vs int to single (PE)"),
)


def conversion(shape: Shape, rng: random.Random) -> Candidate | None:
    """A conversion swapped for a twin that agrees on most inputs: the precision and invalid flags differ,
    and out-of-range values differ."""
    a, b = _xmm(rng), _xmm(rng)
    r = rng.choice((_R.RAX, _R.RBX, _R.RCX, _R.R9))
    o, n, why = rng.choice(_CONVERSIONS)
    if o == _C.CVTTSD2SI_R64_XMMM64:
        orig, reloc = enc(_I.create_reg_reg(o, r, a), at=AT), enc(_I.create_reg_reg(n, r, a))
    elif o == _C.CVTSI2SD_XMM_RM64:
        orig, reloc = enc(_I.create_reg_reg(o, a, r), at=AT), enc(_I.create_reg_reg(n, a, r))
    else:
        orig, reloc = enc(_I.create_reg_reg(o, a, b), at=AT), enc(_I.create_reg_reg(n, a, b))
    return Candidate("conversion", 3, orig, with_back(reloc, _shape_of(orig)), note=why)


# ---------------------------------------------------------------------------
# Class 4: memory ordering (judged by the memory-model table)
# ---------------------------------------------------------------------------

_FENCE_BYTES = {"mfence": b"\x0f\xae\xf0", "lfence": b"\x0f\xae\xe8", "sfence": b"\x0f\xae\xf8"}


def fence_swap(shape: Shape, rng: random.Random) -> Candidate | None:
    """A fence replaced by another kind, dropped, or replaced by a locked no-op on tracer memory."""
    f = facts(shape.raw)
    if f.hazards.fence not in _FENCE_BYTES:
        return None
    choice = rng.randrange(5)
    if choice < 2:
        other = [k for k in _FENCE_BYTES if k != f.hazards.fence][choice]
        body, why = _FENCE_BYTES[other], f"{f.hazards.fence} -> {other}"
    elif choice == 2:
        body, why = b"\x90", f"{f.hazards.fence} -> nop"
    else:  # lock or qword [slot], 0: a full barrier for WB memory, but not an mfence for WC and NT stores
        body = enc(_I.create_mem_i32(_C.OR_RM64_IMM8, iced.MemoryOperand(_R.RIP, displ=SLOT), 0))
        body = b"\xf0" + body
        why = f"{f.hazards.fence} -> lock or $0 on tracer memory"
    return _cand("fence-swap", 4, shape, with_back(body, shape), why, tracer_memory=SLOTS, concurrency=True)


def nontemporal_store(shape: Shape, rng: random.Random) -> Candidate | None:
    """A store of a GPR made non-temporal (movnti): weakly ordered with later stores."""
    ins = shape.ins
    if ins.code not in (_C.MOV_RM64_R64, _C.MOV_RM32_R32) or ins.op0_kind != iced.OpKind.MEMORY \
            or not _position_independent(shape) or ins.segment_prefix != _R.NONE:
        return None
    code = _C.MOVNTI_M64_R64 if ins.code == _C.MOV_RM64_R64 else _C.MOVNTI_M32_R32
    body = enc(_I.create_mem_reg(code, _mem_of(ins), ins.op1_register))
    return _cand("nontemporal-store", 4, shape, with_back(body, shape), "mov -> movnti", concurrency=True)


def locked_to_fenced(shape: Shape, rng: random.Random) -> Candidate | None:
    """A locked read-modify-write replaced by fences around the unlocked operation."""
    if not shape.ins.has_lock_prefix or not _position_independent(shape):
        return None
    raw = bytes(b for b in shape.raw[:shape.prefixes] if b != 0xF0) + shape.raw[shape.prefixes:]
    body = rng.choice((b"\x0f\xae\xf0" + raw + b"\x0f\xae\xf0", raw + b"\x0f\xae\xf0"))
    return _cand("locked-to-fenced", 4, shape, with_back(body, shape), "lock op -> mfence; op; mfence",
                 concurrency=True)


# ---------------------------------------------------------------------------
# Classes 5 and 6: undefined flags on the relocated side; VEX's flag helpers
# ---------------------------------------------------------------------------


def _same_width_reg(reg: int, bits: int) -> int:
    full = iced.RegisterExt.full_register(reg)
    n = full - _R.RAX
    return {64: _R.RAX, 32: _R.EAX, 16: _R.AX}[bits] + n


def flag_substitution(shape: Shape, rng: random.Random) -> Candidate | None:
    """An ALU instruction on registers replaced by a look-alike: inc -> add 1 / lea / sub -1, test -> and,
    add 0 -> imul 1, shl 1 -> add r,r, neg -> imul -1, or -> test ... (flags, or undefined flags, differ)."""
    m = shape.mnemonic
    regs = _reg_ops(shape)
    if not regs or not iced.RegisterExt.is_gpr(regs[0]) or shape.ins.op0_kind != iced.OpKind.REGISTER:
        return None
    r = regs[0]
    size = iced.RegisterExt.size(r) * 8
    if size not in (16, 32, 64) or iced.RegisterExt.full_register(r) == _R.RSP:
        return None
    w = {64: "64", 32: "32", 16: "16"}[size]
    c = lambda name: getattr(_C, name.replace("W", w))  # noqa: E731
    options = []
    if m in ("inc", "dec"):
        k = 1 if m == "inc" else -1
        options += [_I.create_reg_i32(c("ADD_RMW_IMM8"), r, k), _I.create_reg_i32(c("SUB_RMW_IMM8"), r, -k)]
        if size != 16:
            options.append(_I.create_reg_mem(c("LEA_RW_M"), r, iced.MemoryOperand(
                iced.RegisterExt.full_register(r), displ=k, displ_size=1)))
    if m in ("test", "and", "or", "xor", "add", "sub", "cmp", "neg", "shl", "sal", "sar", "shr", "imul", "mov"):
        options += [_I.create_reg_reg_i32(c("IMUL_RW_RMW_IMM8"), r, r, 1), _I.create_reg_reg(c("AND_RMW_RW"), r, r),
                    _I.create_reg_reg(c("OR_RMW_RW"), r, r), _I.create_reg_i32(c("SHL_RMW_IMM8"), r, 0),
                    _I.create_reg_reg(c("ADD_RMW_RW"), r, r), _I.create_reg_reg_i32(c("IMUL_RW_RMW_IMM8"), r, r, -1),
                    _I.create_reg_i32(c("ADD_RMW_IMM8"), r, 0), _I.create_reg_reg(c("TEST_RMW_RW"), r, r),
                    _I.create_reg_reg(c("BSF_RW_RMW"), r, r), _I.create_reg_i32(c("ROL_RMW_IMM8"), r, size)]
    if not options:
        return None
    body = enc(rng.choice(options))
    if body == shape.raw:
        return None
    return _cand("flag-substitution", 5, shape, with_back(body, shape), "a look-alike with other (or undefined) flags")


_MULS = (("MUL_RM8", "IMUL_RM8"), ("MUL_RM16", "IMUL_RM16"), ("MUL_RM32", "IMUL_RM32"), ("MUL_RM64", "IMUL_RM64"))


def multiply_helpers(shape: Shape, rng: random.Random) -> Candidate | None:
    """mul vs imul of every width, one-operand vs two-operand imul, adc/sbb/rcl/rcr by the carry: pairs
    whose CF/OF VEX computes through its flag helpers (CC_OP_UMUL*, SMUL*, ADC*, SBB*, RCL*, RCR*)."""
    reg = rng.choice((_R.RBX, _R.RCX, _R.RSI, _R.R9))
    bits = rng.choice((8, 16, 32, 64))
    sized = {8: _R.BL, 16: _R.BX, 32: _R.EBX, 64: _R.RBX}[bits] + (reg - _R.RBX) if reg != _R.RBX else \
        {8: _R.BL, 16: _R.BX, 32: _R.EBX, 64: _R.RBX}[bits]
    if bits == 8 and reg in (_R.RSI, _R.R9):
        sized = {_R.RSI: _R.SIL, _R.R9: _R.R9L}[reg]
    kind = rng.randrange(3)
    if kind == 0:
        a, b = getattr(_C, _MULS[[8, 16, 32, 64].index(bits)][0]), getattr(_C, _MULS[[8, 16, 32, 64].index(bits)][1])
        if rng.random() < 0.5:
            a, b = b, a
        orig, reloc = enc(_I.create_reg(a, sized), at=AT), enc(_I.create_reg(b, sized))
        why = "mul vs imul: CF/OF from the unsigned vs the signed high half"
    elif kind == 1:
        r64 = iced.RegisterExt.full_register(sized)
        orig = enc(_I.create_reg_reg(_C.IMUL_R64_RM64, _R.RAX, r64), at=AT)
        reloc = enc(_I.create_reg_reg_i32(_C.IMUL_R64_RM64_IMM8, _R.RAX, r64, 1), _I.create_reg_reg(_C.IMUL_R64_RM64,
                                                                                                   _R.RAX, r64))
        why = "imul rax, r vs imul rax, r, 1 then imul rax, r (two-operand forms, flags of the last)"
    else:
        ops = rng.choice((("ADC", "ADD"), ("SBB", "SUB"), ("RCL", "ROL"), ("RCR", "ROR")))
        w = {8: "8", 16: "16", 32: "32", 64: "64"}[bits]
        if ops[0] in ("RCL", "RCR"):
            orig = enc(_I.create_reg_i32(getattr(_C, f"{ops[0]}_RM{w}_1"), sized, 1), at=AT)
            reloc = enc(_I.create_reg_i32(getattr(_C, f"{ops[1]}_RM{w}_1"), sized, 1))
        else:
            orig = enc(_I.create_reg_reg(getattr(_C, f"{ops[0]}_RM{w}_R{w}"), sized, sized), at=AT)
            reloc = enc(_I.create_reg_reg(getattr(_C, f"{ops[1]}_RM{w}_R{w}"), sized, sized))
        why = f"{ops[0].lower()} vs {ops[1].lower()}: equal when CF is clear"
    return Candidate("multiply-helpers", 6, orig, with_back(reloc, _shape_of(orig)), note=why)


# ---------------------------------------------------------------------------
# Class 7: x87 state; class 8: AVX-512 state
# ---------------------------------------------------------------------------

_X87 = (("dbe2", "90", "fnclex vs nop: FSW's exception flags, ES and B"),
        ("dbe2", "9bdbe2", "fnclex vs fclex: the waiting form raises #MF on a pending exception"),
        ("dfe0", "31c0", "fnstsw ax vs xor eax,eax"), ("dfe0", "66b80000", "fnstsw ax vs mov ax, 0"),
        ("9b", "90", "fwait vs nop: #MF on a pending unmasked exception"),
        ("90", "dbe2", "nop vs fnclex"), ("0f77", "90", "emms vs nop: the x87 tag word"),
        ("d9e8", "90", "fld1 vs nop: TOP, C1, the tag word"), ("d9c9", "90", "fxch vs nop: C1"),
        ("dbe3", "90", "fninit vs nop"), ("d97c24f8", "66c74424f87f03", "fnstcw [rsp-8] vs a store of 0x37f"))


def x87_state(shape: Shape, rng: random.Random) -> Candidate | None:
    """x87 instructions against look-alikes: the state VEX lacks (FSW exception flags, ES, B, C0-C3, tags)."""
    o, r, why = rng.choice(_X87)
    orig = bytes.fromhex(o)
    return Candidate("x87-state", 7, orig, with_back(bytes.fromhex(r), _shape_of(orig)), note=why)


_AVX = (
    ("c5f9efc0", "660fefc0", "vpxor xmm (zeroes bits 511:128) vs pxor (keeps them)"),
    ("c5f877", "90", "vzeroupper vs nop"), ("c5fc77", "c5f877", "vzeroall vs vzeroupper"),
    ("c5fd6fc1", "c5f96fc1", "vmovdqa ymm vs xmm"), ("62f1fd48efc0", "c5f9efc0", "EVEX vpxorq zmm vs VEX vpxor xmm"),
    ("c5f9efc0", "62f17d08efc0", "VEX vpxor xmm vs EVEX vpxord xmm"), ("c5f892c8", "90", "kmovw %eax,%k1 (a mask register pyvex lacks) vs nop"),
    ("660f6fc1", "c5f96fc1", "movdqa (keeps upper) vs vmovdqa xmm (zeroes upper)"),
)


def avx512_state(shape: Shape, rng: random.Random) -> Candidate | None:
    """Vector instructions against twins that differ only in state pyvex lacks (zmm bits 511:256, zmm16-31,
    k0-7) or in the upper bits a VEX encoding zeroes."""
    o, r, why = rng.choice(_AVX)
    orig = bytes.fromhex(o)
    if facts(orig) is None:
        return None
    return Candidate("avx512-state", 8, orig, with_back(bytes.fromhex(r), _shape_of(orig)), note=why)


# ---------------------------------------------------------------------------
# Class 9: faults
# ---------------------------------------------------------------------------

_ALIGN_SWAPS = ((_C.MOVDQU_XMM_XMMM128, _C.MOVDQA_XMM_XMMM128), (_C.MOVUPS_XMM_XMMM128, _C.MOVAPS_XMM_XMMM128),
                (_C.VEX_VPADDD_XMM_XMM_XMMM128, _C.PADDD_XMM_XMMM128),
                (_C.VEX_VPXOR_XMM_XMM_XMMM128, _C.PXOR_XMM_XMMM128),
                (_C.MOVDQU_XMMM128_XMM, _C.MOVDQA_XMMM128_XMM), (_C.LDDQU_XMM_M128, _C.MOVDQA_XMM_XMMM128))


def alignment(shape: Shape, rng: random.Random) -> Candidate | None:
    """An unaligned 16-byte access swapped for an aligned one (#GP when misaligned), or a VEX form (no
    alignment check) for the legacy SSE one (which has it)."""
    x = _xmm(rng)
    base = rng.choice((_R.RAX, _R.RBX, _R.RDI, _R.R10))
    mem = iced.MemoryOperand(base, displ=rng.choice((0, 1, 8, 16, 0x21)), displ_size=1)
    a, b = rng.choice(_ALIGN_SWAPS)
    if rng.random() < 0.5:
        a, b = b, a

    def make(code):
        name = iced.OpCodeInfo(code).op_code_string
        if "VEX" in name:
            return _I.create_reg_reg_mem(code, x, x, mem)
        if code in (_C.MOVDQU_XMMM128_XMM, _C.MOVDQA_XMMM128_XMM):
            return _I.create_mem_reg(code, mem, x)
        return _I.create_reg_mem(code, x, mem)

    try:
        orig, reloc = enc(make(a), at=AT), enc(make(b))
    except ValueError:
        return None
    return Candidate("alignment", 9, orig, with_back(reloc, _shape_of(orig)), note="aligned vs unaligned access")


def too_long(shape: Shape, rng: random.Random) -> Candidate | None:
    """The copy padded with redundant prefixes (2e/3e/26/36, repeated 66) past 15 bytes: #GP on the CPU."""
    if not _position_independent(shape) or len(shape.raw) > 14:
        return None
    pad = bytes(rng.choice((0x2E, 0x3E, 0x26, 0x36)) for _ in range(16 - len(shape.raw) + rng.randrange(2)))
    mutated = pad + shape.raw
    return _cand("too-long", 9, shape, with_back(mutated, shape), f"{len(mutated)} bytes")


def dead_divide(shape: Shape, rng: random.Random) -> Candidate | None:
    """A division whose result is thrown away (rax, rdx saved to tracer memory and restored) before the
    copy: #DE when the divisor is 0 or the quotient overflows, though nothing it computes survives."""
    if not _position_independent(shape):
        return None
    div = rng.choice((_C.DIV_RM64, _C.IDIV_RM64, _C.DIV_RM32, _C.IDIV_RM32))
    src = {_C.DIV_RM64: _R.RCX, _C.IDIV_RM64: _R.RCX, _C.DIV_RM32: _R.ECX, _C.IDIV_RM32: _R.ECX}[div]
    slot = lambda k: iced.MemoryOperand(_R.RIP, displ=SLOT + 8 * k)  # noqa: E731
    body = enc(_I.create_mem_reg(_C.MOV_RM64_R64, slot(0), _R.RAX), _I.create_mem_reg(_C.MOV_RM64_R64, slot(1), _R.RDX),
               _I.create(_C.PUSHFQ), _I.create_reg(div, src), _I.create(_C.POPFQ),
               _I.create_reg_mem(_C.MOV_R64_RM64, _R.RAX, slot(0)), _I.create_reg_mem(_C.MOV_R64_RM64, _R.RDX, slot(1)))
    return _cand("dead-divide", 9, shape, with_back(body + shape.raw, shape), "a dead div before the copy",
                 tracer_memory=SLOTS)


_FOREIGN = (("0f01d6", "xtest: #UD without RTM (every AMD CPU)"), ("0f0b", "ud2"),
            ("c4e2f9f7c0", "shlx? (BMI2) a feature the original does not need"),
            ("f30fb8c0", "popcnt: a feature the original does not need"), ("0f01fc", "clzero: AMD only"),
            ("660f38f0c0", "movbe r,r: invalid form (#UD)"), ("0f01ca", "clac: #UD in user mode, SMAP"))


def undefined_opcode(shape: Shape, rng: random.Random) -> Candidate | None:
    """An instruction this CPU (or some CPU) does not run inserted before the copy: #UD where the
    original runs."""
    if not _position_independent(shape):
        return None
    extra, why = rng.choice(_FOREIGN)
    return _cand("undefined-opcode", 9, shape, with_back(bytes.fromhex(extra) + shape.raw, shape), why)


# ---------------------------------------------------------------------------
# Class 10: vendor differences in decoding
# ---------------------------------------------------------------------------


def operand_size_branch(shape: Shape, rng: random.Random) -> Candidate | None:
    """0x66 (or REX.W then 0x66) on the jump back or on a relocated branch: Intel ignores it in 64-bit
    mode, AMD makes it a 16-bit branch that truncates RIP (AMD APM Vol. 3, SDM Vol. 2 "JMP")."""
    plan = own_plan(shape) if rng.random() < 0.5 else None
    body = plan if plan is not None else shape.raw if _position_independent(shape) else None
    if body is None:
        return None
    if plan is None:
        body = with_back(body, shape)
    # put 0x66 in front of the last jmp rel32 (the jump back)
    k = body.rfind(b"\xe9")
    if k < 0 or len(body) - k != 5:
        return None
    prefix = rng.choice((b"\x66", b"\x48\x66", b"\x66\x48"))
    return _cand("operand-size-branch", 10, shape, body[:k] + prefix + body[k:], f"{prefix.hex()} on the jump back")


def ret_and_call_66(shape: Shape, rng: random.Random) -> Candidate | None:
    """ret/call/jmp through a register with 0x66: Intel 64-bit, AMD 16-bit (pops 2 bytes, truncates)."""
    forms = (("c3", "66c3"), ("ffe0", "66ffe0"), ("ffd0", "66ffd0"), ("eb40", "66eb40"), ("7440", "667440"))
    o, r = rng.choice(forms)
    orig = bytes.fromhex(o)
    s = _shape_of(orig)
    if s.ins.flow_control in (iced.FlowControl.RETURN, iced.FlowControl.INDIRECT_BRANCH,
                              iced.FlowControl.INDIRECT_CALL):
        return Candidate("ret-call-66", 10, orig, bytes.fromhex(r), note="0x66 on an indirect transfer")
    reloc = bytes.fromhex(r[:2]) + own_plan(s) if own_plan(s) else None
    if reloc is None:
        return None
    return Candidate("ret-call-66", 10, s.raw, reloc, note="0x66 on a relocated branch")


# ---------------------------------------------------------------------------
# Classes 11 and 12: code that writes code; the walker vs control flow
# ---------------------------------------------------------------------------


def self_write(shape: Shape, rng: random.Random) -> Candidate | None:
    """A store into the relocation's own bytes (the copied instruction, the jump back's offset), run or
    read after it: the checker lifts the bytes as they were, the CPU runs the ones written.  Sometimes the
    trampoline is also named as tracer memory (whose writes the obligation otherwise ignores)."""
    if not _position_independent(shape):
        return None
    store_len = 7  # mov byte [rip+d], imm8
    target_off = store_len + rng.choice((0, len(shape.raw) - 1, len(shape.raw) + 1, len(shape.raw) + 4))
    value = rng.choice((0x90, 0xC3, 0xCC, shape.raw[0] ^ 1))
    store = enc(_I.create_mem_u32(_C.MOV_RM8_IMM8, iced.MemoryOperand(_R.RIP, displ=TRAMP + target_off), value))
    assert len(store) == store_len
    body = with_back(store + shape.raw, shape)
    tracer = ((TRAMP, len(body)),) if rng.random() < 0.3 else ()
    return _cand("self-write", 11, shape, body, f"writes {value:#x} at T+{target_off}", tracer_memory=tracer)


_HIDDEN = ((0xF0, "a LOCK prefix the jump skips"), (0x66, "an operand-size prefix the jump skips"),
           (0x48, "a REX.W the jump skips"), (0xB8, "a mov eax, imm32 whose immediate is the code"))


def jump_into_instruction(shape: Shape, rng: random.Random) -> Candidate | None:
    """``jmp +1`` over a byte that a linear sweep decodes as part of the next instruction: the walker sees
    one instruction, the CPU runs another (a hidden LOCK, REX, 66, or code inside an immediate)."""
    if not _position_independent(shape):
        return None
    byte, why = rng.choice(_HIDDEN)
    if byte == 0xF0 and not shape.ins.has_lock_prefix:
        raw = shape.raw
    elif byte == 0xF0:
        raw = bytes(b for b in shape.raw[:shape.prefixes] if b != 0xF0) + shape.raw[shape.prefixes:]
    else:
        raw = shape.raw
    body = b"\xeb\x01" + bytes([byte]) + raw
    return _cand("jump-into-instruction", 12, shape, with_back(body, shape), why)


# ---------------------------------------------------------------------------
# Class 13: store width and tearing (judged by the memory-model table)
# ---------------------------------------------------------------------------


def store_split(shape: Shape, rng: random.Random) -> Candidate | None:
    """A 2/4/8-byte store of a register split into two narrower stores, stored in the other order, or
    stored and read back in between: the same final memory, but a concurrent reader sees it torn."""
    ins = shape.ins
    if ins.code not in (_C.MOV_RM64_R64, _C.MOV_RM32_R32) or ins.op0_kind != iced.OpKind.MEMORY \
            or not _position_independent(shape) or ins.segment_prefix != _R.NONE:
        return None
    src = ins.op1_register
    wide = ins.code == _C.MOV_RM64_R64
    base, index = ins.memory_base, ins.memory_index
    scratch = next(r for r in (_R.RCX, _R.RDX, _R.R11, _R.R10) if r not in (
        iced.RegisterExt.full_register(src), base, index))
    s32 = _R.EAX + (scratch - _R.RAX)

    def m(extra):
        return _mem_of(ins, extra)

    slot = lambda k: iced.MemoryOperand(_R.RIP, displ=SLOT + 8 * k)  # noqa: E731
    half = _R.EAX + (iced.RegisterExt.full_register(src) - _R.RAX) if wide else _R.AX + (src - _R.EAX)
    hcode, lcode = (_C.MOV_RM32_R32, _C.MOV_RM32_R32) if wide else (_C.MOV_RM16_R16, _C.MOV_RM16_R16)
    hs = s32 if wide else _R.AX + (scratch - _R.RAX)
    k = 4 if wide else 2
    load_high = (_C.MOV_R32_RM32 if wide else _C.MOV_R16_RM16, hs, slot(0) if wide else None)
    pre = [_I.create_mem_reg(_C.MOV_RM64_R64, slot(1), scratch),
           _I.create_mem_reg(_C.MOV_RM64_R64, slot(0), iced.RegisterExt.full_register(src))]
    high = _I.create_reg_mem(load_high[0], hs, iced.MemoryOperand(_R.RIP, displ=SLOT + k))
    post = [_I.create_reg_mem(_C.MOV_R64_RM64, scratch, slot(1))]
    order = rng.randrange(3)
    if order == 0:
        body_ins = pre + [_I.create_mem_reg(lcode, m(0), half), high, _I.create_mem_reg(hcode, m(k), hs)] + post
        why = "low half, then high half"
    elif order == 1:
        body_ins = pre + [high, _I.create_mem_reg(hcode, m(k), hs), _I.create_mem_reg(lcode, m(0), half)] + post
        why = "high half, then low half"
    else:
        body_ins = pre + [_I.create_mem_reg(ins.code, m(0), src),
                          _I.create_reg_mem(_C.MOV_R64_RM64 if wide else _C.MOV_R32_RM32,
                                            scratch if wide else s32, m(0)),
                          _I.create_mem_reg(ins.code, m(0), src)] + post
        why = "stored, read back, stored again"
    try:
        body = enc(*body_ins)
    except ValueError:
        return None
    return _cand("store-split", 13, shape, with_back(body, shape), why, tracer_memory=SLOTS, concurrency=True)


# ---------------------------------------------------------------------------
# Class 14: instructions VEX models by a constant or a fixed path
# ---------------------------------------------------------------------------

_CONSTANTS = (("0f01d0", "b807000000ba00000000", "xgetbv vs VEX's constant (eax=7, edx=0)"),
              ("c7f800000000", "b808000000", "xbegin vs VEX's model (eax=8, fall through)"),
              ("0f01d6", "90", "xtest vs nothing"), ("0f01d5", "90", "xend vs nothing"),
              ("c6f800", "90", "xabort vs nothing"), ("0f31", "31c031d2", "rdtsc vs zeros"),
              ("480fc7f0", "b801000000", "rdrand vs a constant"), ("0fa2", "31c0", "cpuid vs a constant"),
              ("f30fc7f8", "31c0", "rdpid vs 0"), ("8cd8", "31c0", "mov eax, ds vs 0"))


def constant_model(shape: Shape, rng: random.Random) -> Candidate | None:
    """An instruction VEX models by a constant or a fixed path, relocated as that constant."""
    o, r, why = rng.choice(_CONSTANTS)
    orig = bytes.fromhex(o)
    s = shape_for(orig)
    if s is None:
        return None
    return Candidate("constant-model", 14, s.raw, with_back(bytes.fromhex(r), s), note=why)


# ---------------------------------------------------------------------------
# Class 15: vacuous preconditions
# ---------------------------------------------------------------------------

_HALF = 1 << 63


def vacuous_precondition(shape: Shape, rng: random.Random) -> Candidate | None:
    """Tracer-memory ranges each acceptable alone whose union covers every address the original can
    access (two or three ranges), or all but a sliver, with a relocation that does something else."""
    if not any(shape.ins.op_kind(k) == iced.OpKind.MEMORY for k in range(shape.ins.op_count)) \
            and not shape.ins.is_stack_instruction:
        return None
    kind = rng.randrange(4)
    if kind == 0:
        ranges = ((0, _HALF), (_HALF, _HALF))
    elif kind == 1:
        ranges = ((0, 1 << 47), ((1 << 64) - (1 << 47), 1 << 47))
    elif kind == 2:
        ranges = ((0, 1 << 46), (1 << 46, 1 << 46), ((1 << 64) - (1 << 47), 1 << 47))
    else:
        ranges = ((0, (1 << 47) - 0x1000), ((1 << 64) - (1 << 47), 1 << 47))
    body = with_back(b"\x90", shape)
    return _cand("vacuous-precondition", 15, shape, body, "tracer memory covering the address space",
                 tracer_memory=ranges)



# ---------------------------------------------------------------------------
# Classes 16-22: the machine the relocation runs in (issue 41)
# ---------------------------------------------------------------------------
#
# A candidate of these classes runs where its dimension exists: at a user address (CPL 3: signals, #AC,
# shadow stacks) or at a kernel one (CPL 0: interrupt frames on the current stack, IBT).  The kernel site
# is the user site moved by ``KERNEL_SHIFT``, so a rel32 field means the same at both and the CPU judge
# can run a kernel candidate's twin at the user site (``selftest.kernel_twin``).

KERNEL_SHIFT = 0xFFFF_FFFF_8100_0100 - AT


@dataclass(frozen=True)
class Site:
    """Where a candidate runs: the original, the trampoline and the save slots."""

    at: int
    tramp: int
    slot: int

    @property
    def slots(self) -> tuple[tuple[int, int], ...]:
        return ((self.slot, 0x100),)

    def slot_at(self, k: int, offset: int = 0) -> iced.MemoryOperand:
        return iced.MemoryOperand(_R.RIP, displ=_signed64(self.slot + 8 * k + offset))


USER = Site(AT, TRAMP, SLOT)
KERNEL = Site(AT + KERNEL_SHIFT, TRAMP + KERNEL_SHIFT, SLOT + KERNEL_SHIFT)

_SCRATCH = (_R.R11, _R.R10, _R.R9, _R.R8, _R.RBX, _R.RSI, _R.RDI, _R.RCX)
_SIZED = {64: (_R.RAX, _R.RCX, _R.RDX, _R.RBX, _R.RSP, _R.RBP, _R.RSI, _R.RDI) + tuple(_R.R8 + k for k in range(8)),
          32: (_R.EAX, _R.ECX, _R.EDX, _R.EBX, _R.ESP, _R.EBP, _R.ESI, _R.EDI) + tuple(_R.R8D + k for k in range(8)),
          16: (_R.AX, _R.CX, _R.DX, _R.BX, _R.SP, _R.BP, _R.SI, _R.DI) + tuple(_R.R8W + k for k in range(8)),
          8: (_R.AL, _R.CL, _R.DL, _R.BL, _R.SPL, _R.BPL, _R.SIL, _R.DIL) + tuple(_R.R8L + k for k in range(8))}
_MOV_LOAD = {8: _C.MOV_R8_RM8, 16: _C.MOV_R16_RM16, 32: _C.MOV_R32_RM32, 64: _C.MOV_R64_RM64}
_MOV_STORE = {8: _C.MOV_RM8_R8, 16: _C.MOV_RM16_R16, 32: _C.MOV_RM32_R32, 64: _C.MOV_RM64_R64}
_INFO = iced.InstructionInfoFactory()
_NAMES = {v: k for k, v in vars(_C).items() if k.isupper()}


def _signed64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >> 63 else v


def _sized(reg64: int, bits: int) -> int:
    return _SIZED[bits][_SIZED[64].index(reg64)]


def _used(ins: iced.Instruction) -> set[int]:
    """The full registers ``ins`` reads or writes, implicit ones included."""
    return {iced.RegisterExt.full_register(u.register) for u in _INFO.info(ins).used_registers()}


def _free(ins: iced.Instruction, choices=_SCRATCH) -> int | None:
    used = _used(ins)
    return next((r for r in choices if r not in used), None)


def _code(site: Site, *parts) -> bytes:
    """Bytes at ``site.tramp``: each part is bytes (position-independent, copied) or a list of iced
    instructions, encoded where it lands."""
    out = b""
    for part in parts:
        out += part if isinstance(part, bytes) else enc(*part, at=site.tramp + len(out))
    return out


def _back(site: Site, body: bytes, length: int) -> bytes:
    return body + jmp(site.tramp + len(body), site.at + length)


def _abs_back(site: Site, body: bytes, target: int, misalign: int = 0) -> bytes:
    """``body``, NOPs, then ``jmp *0(%rip); .quad target``: the qword 8-aligned, or ``misalign`` bytes past."""
    pad = (-(site.tramp + len(body) + 6) + misalign) % 8
    return body + b"\x90" * pad + b"\xff\x25\x00\x00\x00\x00" + struct.pack("<Q", target & ((1 << 64) - 1))


def _at(site: Site, name: str, klass: int, orig: bytes, reloc: bytes, note: str, slots: bool = False) -> Candidate:
    return Candidate(name, klass, orig, reloc, site.at, site.tramp, site.slots if slots else (), note)


def _decode(raw: bytes, at: int = AT) -> iced.Instruction:
    return iced.Decoder(64, raw, ip=at).decode()


def _memory_index(ins: iced.Instruction) -> int | None:
    return next((k for k in range(ins.op_count) if ins.op_kind(k) == iced.OpKind.MEMORY), None)


def _based(ins: iced.Instruction) -> bool:
    """An explicit memory operand that is accessed, through a general-purpose base register, without fs/gs."""
    return _memory_index(ins) is not None and ins.memory_base not in (_R.NONE, _R.RIP) \
        and ins.memory_segment not in (_R.FS, _R.GS) and not ins.is_stack_instruction \
        and any(m.access != iced.OpAccess.NO_MEM_ACCESS for m in _INFO.info(ins).used_memory())


def _wants_based(raw: bytes) -> bool:
    f = facts(raw)
    return f is not None and not f.position_dependent and f.flow == "next" and _based(_decode(raw))


_NOT_SPLIT = frozenset("bt bts btr btc xchg xadd cmpxchg cmpxchg8b cmpxchg16b movs stos cmps scas lods".split())


def _rmw(ins: iced.Instruction) -> int | None:
    """The width in bits of ``ins``'s read-modify-write memory operand (op0), if it has one to split."""
    if ins.op_count == 0 or ins.op0_kind != iced.OpKind.MEMORY or ins.has_lock_prefix or ins.has_rep_prefix \
            or ins.has_repne_prefix or _MNEMONIC[ins.mnemonic] in _NOT_SPLIT or ins.memory_segment in (_R.FS, _R.GS):
        return None
    mems = [m for m in _INFO.info(ins).used_memory() if m.access != iced.OpAccess.NO_MEM_ACCESS]
    if len(mems) != 1 or mems[0].access not in (iced.OpAccess.READ_WRITE, iced.OpAccess.READ_COND_WRITE):
        return None
    bits = 8 * iced.MemorySizeExt.size(ins.memory_size)
    return bits if bits in _MOV_LOAD else None


def _wants_rmw(raw: bytes) -> bool:
    f = facts(raw)
    return f is not None and not f.position_dependent and f.flow == "next" and _rmw(_decode(raw)) is not None


def _wants_mnemonic(*names: str):
    wanted = frozenset(names)

    def wants(raw: bytes) -> bool:
        f = facts(raw)
        return f is not None and _MNEMONIC[_decode(raw).mnemonic] in wanted

    return wants


def _with_override(raw: bytes, prefixes: int, segment: int | None) -> bytes:
    """``raw`` without its ss:/ds: prefixes, and with ``segment`` (0x36, 0x3e) in front when given."""
    kept = bytes(b for b in raw[:prefixes] if b not in (0x36, 0x3E))
    return (bytes([segment]) if segment else b"") + kept + raw[prefixes:]


def _rebased(shape: Shape, site: Site, new_base: int, override: int | None = None) -> bytes | None:
    """The instruction with its memory operand's base moved to ``new_base`` (saved in a slot, loaded with
    the old base, restored after): the same address through another register."""
    ins = shape.ins.copy()
    old = ins.memory_base
    ins.memory_base = new_base
    try:
        moved = enc(ins, at=site.tramp)
    except ValueError:
        return None
    if override:
        s = shape_for(moved)
        if s is None:
            return None
        moved = _with_override(moved, s.prefixes, override)
    save = [_I.create_mem_reg(_C.MOV_RM64_R64, site.slot_at(0), new_base),
            _I.create_reg_reg(_C.MOV_RM64_R64, new_base, old)]
    return _code(site, save, moved, [_I.create_reg_mem(_C.MOV_R64_RM64, new_base, site.slot_at(0))])


def fault_segment(shape: Shape, rng: random.Random) -> Candidate | None:
    """An access through rsp/rbp (SS) moved onto another register holding the same address (DS), or the
    other way, or an ss:/ds: override added or removed: the same value, but a non-canonical address raises
    #SS (SIGBUS) through SS and #GP (SIGSEGV) otherwise."""
    ins = shape.ins
    if not _position_independent(shape) or not _based(ins):
        return None
    site = rng.choice((USER, USER, KERNEL))
    ss = ins.memory_base in (_R.RSP, _R.RBP)
    kind = rng.randrange(4)
    if kind < 2:
        new = _free(ins) if ss else _free(ins, (_R.RBP,))
        if new is None:
            return None
        override = (0x36 if ss else 0x3E) if kind == 1 else None
        body = _rebased(shape, site, new, override)
        why = f"{'SS' if ss else 'DS'} base rebased onto {'DS' if ss else 'SS'}" + (" with the old override" if
                                                                                      override else "")
    else:
        has = any(b in (0x36, 0x3E) for b in shape.raw[:shape.prefixes])
        seg = None if has and kind == 2 else (0x3E if ss else 0x36) if kind == 2 else (0x36 if ss else 0x3E)
        body = _with_override(shape.raw, shape.prefixes, seg)
        why = f"override {'removed' if seg is None else f'{seg:#x} put'} on {'an SS' if ss else 'a DS'} access"
        if len(body) > 15 or body == shape.raw:
            return None
    if body is None:
        return None
    return _at(site, "fault-segment", 16, shape.raw, _back(site, body, len(shape.raw)), why, slots=kind < 2)


def rmw_split(shape: Shape, rng: random.Random) -> Candidate | None:
    """A read-modify-write on memory split into load, operation on a scratch register, store: the same
    values, but a not-present page faults on the load with the error code's W bit clear (the original's
    read-modify-write faults as a write)."""
    ins = shape.ins
    bits = _rmw(ins) if _position_independent(shape) else None
    scratch = _free(ins) if bits else None
    if scratch is None:
        return None
    site = rng.choice((USER, USER, KERNEL))
    op = ins.copy()
    op.op0_kind = iced.OpKind.REGISTER
    op.op0_register = _sized(scratch, bits)
    try:
        body = _code(site, [_I.create_mem_reg(_C.MOV_RM64_R64, site.slot_at(0), scratch),
                            _I.create_reg_mem(_MOV_LOAD[bits], _sized(scratch, bits), _mem_of(ins)), op,
                            _I.create_mem_reg(_MOV_STORE[bits], _mem_of(ins), _sized(scratch, bits)),
                            _I.create_reg_mem(_C.MOV_R64_RM64, scratch, site.slot_at(0))])
    except ValueError:
        return None
    return _at(site, "rmw-split", 16, shape.raw, _back(site, body, len(shape.raw)),
               f"{shape.mnemonic} on memory as a load, {shape.mnemonic} on a scratch register, a store", slots=True)


_DEFERRING = (("9d", "popf: TF popped as 1 traps after the next instruction, here the jump back"),
              ("fb", "sti: the interrupt shadow covers the jump back, not A+len's instruction"),
              ("8ed0", "mov %eax,%ss: interrupts and #DB held off for the jump back, not A+len's instruction"),
              ("669d", "popfw: TF popped as 1 traps after the jump back"))


def trap_late(shape: Shape, rng: random.Random) -> Candidate | None:
    """An instruction whose effect lands on the next instruction (popf setting TF, sti, mov ss) copied
    before the jump back: the trap or the shadow acts on the relocation's next instruction, one early."""
    if shape.mnemonic in ("popf", "popfq", "sti"):
        orig, why = shape.raw, f"{shape.mnemonic}: its deferred effect lands on the jump back"
    else:
        o, why = rng.choice(_DEFERRING)
        orig = bytes.fromhex(o)
    site = KERNEL if orig[-1] != 0x9D or rng.random() < 0.7 else USER
    kind = rng.randrange(3)
    if kind == 0:
        reloc = _back(site, orig, len(orig))
    elif kind == 1:
        reloc = _back(site, orig + b"\x90", len(orig))
    else:
        reloc = _abs_back(site, orig, site.at + len(orig))
    return _at(site, "trap-late", 17, orig, reloc, why)


_STACK_FORMS = ("5b", "50", "c9", "c3", "5d", "55", "4157", "415c", "6a08", "68e8030000")


def below_rsp(shape: Shape, rng: random.Random) -> Candidate | None:
    """push, pop, leave and ret at CPL 0 as a move and an RSP adjustment in the wrong order: the data is
    below RSP at a boundary inside the trampoline, where an interrupt's frame overwrites it."""
    s = shape if _stack_form(shape) else _shape_of(bytes.fromhex(rng.choice(_STACK_FORMS)))
    ins, m = s.ins, s.mnemonic
    rsp = lambda d: iced.MemoryOperand(_R.RSP, displ=d, displ_size=1 if d else 0)  # noqa: E731
    lea = lambda d: _I.create_reg_mem(_C.LEA_R64_M, _R.RSP, rsp(d))  # noqa: E731
    if m == "pop":
        body = [lea(8), _I.create_reg_mem(_C.MOV_R64_RM64, ins.op0_register, rsp(-8))]
        why = "pop: rsp first, then the load"
    elif m == "push" and ins.op0_kind == iced.OpKind.REGISTER:
        body = [_I.create_mem_reg(_C.MOV_RM64_R64, rsp(-8), ins.op0_register), lea(-8)]
        why = "push: the store, then rsp"
    elif m == "push":
        body = [_I.create_mem_i32(_C.MOV_RM64_IMM32, rsp(-8), _signed64(ins.immediate(0))), lea(-8)]
        why = "push $imm: the store, then rsp"
    elif m == "leave":
        body = [_I.create_reg_reg(_C.MOV_R64_RM64, _R.RSP, _R.RBP), lea(8), _I.create_reg_mem(_C.MOV_R64_RM64, _R.RBP,
                                                                                             rsp(-8))]
        why = "leave: rsp past the saved rbp, then the load"
    else:
        body, why = [lea(8), _I.create_mem(_C.JMP_RM64, rsp(-8))], "ret: rsp first, then jmp *-8(%rsp)"
    code = _code(KERNEL, body)
    reloc = code if m == "ret" else _back(KERNEL, code, len(s.raw))
    return _at(KERNEL, "below-rsp", 18, s.raw, reloc, why)


def _stack_form(shape: Shape) -> bool:
    ins, m = shape.ins, shape.mnemonic
    if m in ("pop", "push") and ins.op_count == 1 and shape.raw[0] not in (0x66,):
        if ins.op0_kind == iced.OpKind.REGISTER:
            return iced.RegisterExt.is_gpr64(ins.op0_register) and ins.op0_register != _R.RSP
        return m == "push" and ins.op0_kind in (iced.OpKind.IMMEDIATE8TO64, iced.OpKind.IMMEDIATE32TO64)
    return (m == "leave" and len(shape.raw) == 1) or (m == "ret" and shape.raw == b"\xc3")


def _wants_stack_form(raw: bytes) -> bool:
    s = shape_for(raw) if facts(raw) is not None else None
    return s is not None and _stack_form(s)


def ibt_indirect(shape: Shape, rng: random.Random) -> Candidate | None:
    """At CPL 0 under IBT: the jump back, or a relocated direct jmp/jcc/call, made indirect (``jmp
    *0(%rip)`` and its qword): its target A+len or the branch target is not known to start with endbr64,
    so the CPU raises #CP where the original branched directly."""
    ins, site = shape.ins, KERNEL
    n = len(shape.raw)
    fc = ins.flow_control
    if fc == iced.FlowControl.NEXT and _position_independent(shape):
        return _at(site, "ibt-indirect", 19, shape.raw, _abs_back(site, shape.raw, site.at + n),
                   "the jump back as jmp *0(%rip)")
    if ins.op_count != 1 or ins.op0_kind not in (iced.OpKind.NEAR_BRANCH32, iced.OpKind.NEAR_BRANCH64,
                                                 iced.OpKind.NEAR_BRANCH16) or shape.prefixes:
        return None
    target = ins.near_branch_target + KERNEL_SHIFT
    if fc == iced.FlowControl.UNCONDITIONAL_BRANCH:
        return _at(site, "ibt-indirect", 19, shape.raw, _abs_back(site, b"", target), "jmp rel as jmp *0(%rip)")
    if fc == iced.FlowControl.CALL:
        push = enc(_I.create_i32(_C.PUSHQ_IMM32, _signed64(site.at + n)), at=site.tramp)
        return _at(site, "ibt-indirect", 19, shape.raw, _abs_back(site, push, target),
                   "call rel as push $A+len; jmp *0(%rip)")
    if fc == iced.FlowControl.CONDITIONAL_BRANCH and ins.code in _JCC32:
        taken = 16  # jcc rel32 (6), jmp back (5), then the aligned absolute jump
        jcc = enc(_I.create_branch(_JCC32[ins.code], site.tramp + taken), at=site.tramp)
        body = _back(site, jcc, n)
        body += b"\x90" * (taken - len(body))
        return _at(site, "ibt-indirect", 19, shape.raw, _abs_back(site, body, target),
                   "jcc's taken path as jmp *0(%rip)")
    return None


_JCC32 = {getattr(_C, n): getattr(_C, n.replace("REL8", "REL32")) for n in _NAMES.values()
          if n.startswith("J") and n.endswith("_REL8_64") and not n.startswith(("JMP", "JRCXZ", "JECXZ"))} | \
    {getattr(_C, n): getattr(_C, n) for n in _NAMES.values()
     if n.startswith("J") and n.endswith("_REL32_64") and not n.startswith("JMP")}


def shadow_stack(shape: Shape, rng: random.Random) -> Candidate | None:
    """Under a shadow stack: a call as ``push $A+len; jmp``, a ret as an RSP adjustment and ``jmp
    *-8(%rsp)``: the data stack is the same, the shadow stack one entry off, so the next ret raises #CP."""
    s = shape if shape.mnemonic in ("call", "ret") and not shape.prefixes else \
        _shape_of(bytes.fromhex(rng.choice(("e800100000", "c3", "ffd0", "ffd3", "c21000", "41ffd3"))))
    ins, n = s.ins, len(s.raw)
    site = USER if rng.random() < 0.75 else KERNEL
    shift = 0 if site is USER else KERNEL_SHIFT
    rsp = lambda d: iced.MemoryOperand(_R.RSP, displ=d, displ_size=1 if -128 <= d < 128 else 4)  # noqa: E731
    if s.mnemonic == "ret":
        k = 8 + (ins.immediate(0) if ins.op_count else 0)
        body = _code(site, [_I.create_reg_mem(_C.LEA_R64_M, _R.RSP, rsp(k)), _I.create_mem(_C.JMP_RM64, rsp(-k))])
        return _at(site, "shadow-stack", 20, s.raw, body, "ret as lea; jmp *-8(%rsp)")
    push = _I.create_i32(_C.PUSHQ_IMM32, _signed64(site.at + n))
    if ins.op0_kind in (iced.OpKind.NEAR_BRANCH32, iced.OpKind.NEAR_BRANCH64):
        go = _I.create_branch(_C.JMP_REL32_64, ins.near_branch_target + shift)
    elif ins.op0_kind == iced.OpKind.REGISTER and ins.op0_register != _R.RSP:
        go = _I.create_reg(_C.JMP_RM64, ins.op0_register)
    elif ins.op0_kind == iced.OpKind.MEMORY and ins.memory_base not in (_R.RSP, _R.RIP) \
            and ins.memory_index != _R.RSP:
        go = _I.create_mem(_C.JMP_RM64, _mem_of(ins))
    else:
        return None
    return _at(site, "shadow-stack", 20, s.raw, _code(site, [push, go]), "call as push $A+len; jmp")


def unaligned_slot(shape: Shape, rng: random.Random) -> Candidate | None:
    """At CPL 3 with RFLAGS.AC set: the relocation's own access to tracer memory at an unaligned address
    (the qword of an absolute jump back, a save slot at an odd offset) raises #AC; the original makes none."""
    if not _position_independent(shape):
        return None
    site, n = USER, len(shape.raw)
    kind = rng.randrange(3)
    odd = rng.randrange(1, 8)
    if kind == 0:
        return _at(site, "unaligned-slot", 21, shape.raw, _abs_back(site, shape.raw, site.at + n, odd),
                   f"the absolute jump back's qword {odd} bytes off alignment")
    reg = _free(shape.ins, tuple(rng.sample(_SCRATCH, len(_SCRATCH))))
    if reg is None:
        return None
    body = _code(site, [_I.create_mem_reg(_C.MOV_RM64_R64, site.slot_at(0, odd), reg)], shape.raw,
                 [_I.create_reg_mem(_C.MOV_R64_RM64, reg, site.slot_at(0, odd))])
    reloc = _back(site, body, n) if kind == 1 else _abs_back(site, body, site.at + n, odd)
    return _at(site, "unaligned-slot", 21, shape.raw, reloc, f"a save slot {odd} bytes off alignment", slots=True)


def _shift(code: int, reg: int, count: int) -> iced.Instruction:
    return _I.create_reg_i32(code, reg, count)


_SHIFT_CODES = {name: getattr(_C, name) for name in _NAMES.values()
                if name.split("_")[0] in ("ROL", "ROR", "RCL", "RCR", "SHL", "SAL", "SHR", "SAR")
                and name.endswith("_IMM8") and "_RM" in name}
_SHIFT_OF = {v: k for k, v in _SHIFT_CODES.items()}


def _edge_table(rng: random.Random) -> tuple[bytes, bytes, str]:
    """Fixed pairs whose difference, if any, shows only at an operand's edge."""
    a = rng.choice((_R.RAX, _R.RBX, _R.RDX, _R.RSI, _R.R9))
    a32, a16, a8 = _sized(a, 32), _sized(a, 16), _sized(a, 8)
    b = _R.RCX if a != _R.RCX else _R.RDX
    rows = (
        ([_shift(_C.ROL_RM8_IMM8, a8, 8)], [_shift(_C.ROL_RM8_IMM8, a8, 0)],
         "rol $8 vs rol $0 on 8 bits: CF from the result"),
        ([_shift(_C.ROR_RM16_IMM8, a16, 16)], [], "ror $16 on 16 bits vs nothing: CF, OF"),
        ([_shift(_C.RCL_RM8_IMM8, a8, 9)], [], "rcl $9 on 8 bits (a 9-bit rotation by 9) vs nothing"),
        ([_shift(_C.RCR_RM16_IMM8, a16, 17)], [], "rcr $17 on 16 bits (a 17-bit rotation by 17) vs nothing"),
        ([_shift(_C.SHL_RM32_IMM8, a32, 32)], [], "shl $32 on 32 bits (count masked to 0) vs nothing"),
        ([_shift(_C.SHR_RM64_IMM8, a, 64)], [], "shr $64 (count masked to 0) vs nothing"),
        ([_shift(_C.SAR_RM32_IMM8, a32, 33)], [_shift(_C.SAR_RM32_IMM8, a32, 1)], "sar $33 vs sar $1 (mod 32)"),
        ([_shift(_C.ROL_RM64_IMM8, a, 64)], [], "rol $64 (masked to 0) vs nothing"),
        ([_I.create_reg_reg_u32(_C.SHLD_RM64_R64_IMM8, a, b, 0)], [], "shld $0 vs nothing"),
        ([_I.create_reg_reg_u32(_C.SHRD_RM64_R64_IMM8, a, b, 64)], [], "shrd $64 (masked to 0) vs nothing"),
        ([_I.create_reg_reg_u32(_C.SHLD_RM16_R16_IMM8, a16, _sized(b, 16), 16)],
         [_I.create_reg_reg(_C.MOV_R16_RM16, a16, _sized(b, 16))],
         "shld $16 on 16 bits vs mov: a count past the width"),
        ([_I.create_reg_i32(_C.BT_RM64_IMM8, a, 64)], [_I.create_reg_i32(_C.BT_RM64_IMM8, a, 0)],
         "bt $64 vs bt $0 (mod 64)"),
        ([_I.create_reg_i32(_C.BT_RM32_IMM8, a32, 33)], [_I.create_reg_i32(_C.BT_RM32_IMM8, a32, 1)],
         "bt $33 vs bt $1 (mod 32)"),
        ([_shift(_C.SHL_RM32_IMM8, a32, 1)], [_I.create_reg_reg(_C.ADD_RM32_R32, a32, a32)], "shl $1 vs add r,r: AF"),
    )
    o, r, why = rng.choice(rows)
    orig = enc(*o, at=AT)
    return orig, (enc(*r) if r else b""), why


def edge_operand(shape: Shape, rng: random.Random) -> Candidate | None:
    """Pairs that differ, if at all, only at an operand's edge: a shift or rotate count of 0, 1, the width
    or past it (counts are masked to 5 or 6 bits, rcl/rcr then reduced mod width+1), a register count that
    is 0 after masking (the flags are left alone), bit offsets past the width: where a lifter's flag helper
    is most likely wrong and a form's random sample least likely to look."""
    kind = rng.randrange(3)
    if kind == 0 and shape.ins.code in _SHIFT_OF and shape.ins.op0_kind == iced.OpKind.REGISTER:
        ins, width = shape.ins, 8 * iced.RegisterExt.size(shape.ins.op0_register)
        counts = (0, 1, width - 1, width, width + 1, 31, 32, 33, 63, 64, 255)
        c1, c2 = rng.choice(counts), rng.choice(counts)
        orig = enc(_shift(ins.code, ins.op0_register, c1), at=AT)
        reloc = enc(_shift(ins.code, ins.op0_register, c2))
        why = f"{shape.mnemonic} by {c1} vs by {c2} on {width} bits"
    elif kind == 1:
        reg_code = rng.choice(("SHL", "SHR", "SAR", "ROL", "ROR"))
        bits = rng.choice((32, 64))
        r = _sized(rng.choice((_R.RAX, _R.RBX, _R.RSI)), bits)
        orig = enc(_I.create_reg_reg(getattr(_C, f"{reg_code}_RM{bits}_CL"), r, _R.CL), at=AT)
        mask = bits - 1
        reloc = enc(_I.create_mem_reg(_C.MOV_RM64_R64, USER.slot_at(0), _R.RCX),
                    _I.create_reg_i32(_C.AND_RM32_IMM8, _R.ECX, mask),
                    _I.create_reg_reg(getattr(_C, f"{reg_code}_RM{bits}_CL"), r, _R.CL),
                    _I.create_reg_mem(_C.MOV_R64_RM64, _R.RCX, USER.slot_at(0)))
        return Candidate("edge-operand", 22, orig, with_back(reloc, _shape_of(orig)), tracer_memory=SLOTS,
                         note=f"{reg_code.lower()} %cl vs and ${mask},%ecx first: the flags differ when the count is 0")
    else:
        orig, reloc, why = _edge_table(rng)
    return Candidate("edge-operand", 22, orig, with_back(reloc, _shape_of(orig)), note=why)


def _wants_shift(raw: bytes) -> bool:
    f = facts(raw)
    return f is not None and _decode(raw).code in _SHIFT_OF and _decode(raw).op0_kind == iced.OpKind.REGISTER


# Controls of the machine classes


def _writes_rsp(ins: iced.Instruction) -> bool:
    """``ins`` writes RSP other than as the stack of push and pop (xchg %esp, mov to %rsp, ...)."""
    return not ins.is_stack_instruction and any(
        iced.RegisterExt.full_register(u.register) == _R.RSP and u.access not in (iced.OpAccess.READ,
                                                                                 iced.OpAccess.COND_READ)
        for u in _INFO.info(ins).used_registers())


def control_stack_order(shape: Shape, rng: random.Random) -> Candidate | None:
    """At CPL 0: pop as a load then ``lea 8(%rsp),%rsp``, push as ``lea -8(%rsp),%rsp`` then a store,
    leave likewise: nothing is ever below RSP at a boundary, and lea leaves the flags alone.  Shapes with
    one prefix at most (a REX): redundant prefixes make forms of their own, few of them validated exact."""
    if not _stack_form(shape) or shape.mnemonic == "ret" or shape.prefixes > 1:
        return None
    ins, m = shape.ins, shape.mnemonic
    rsp = lambda d: iced.MemoryOperand(_R.RSP, displ=d, displ_size=1 if d else 0)  # noqa: E731
    lea = lambda d: _I.create_reg_mem(_C.LEA_R64_M, _R.RSP, rsp(d))  # noqa: E731
    if m == "pop":
        body = [_I.create_reg_mem(_C.MOV_R64_RM64, ins.op0_register, rsp(0)), lea(8)]
    elif m == "push" and ins.op0_kind == iced.OpKind.REGISTER:
        body = [lea(-8), _I.create_mem_reg(_C.MOV_RM64_R64, rsp(0), ins.op0_register)]
    elif m == "push":
        body = [lea(-8), _I.create_mem_i32(_C.MOV_RM64_IMM32, rsp(0), _signed64(ins.immediate(0)))]
    else:
        body = [_I.create_reg_reg(_C.MOV_R64_RM64, _R.RSP, _R.RBP), _I.create_reg_mem(_C.MOV_R64_RM64, _R.RBP, rsp(0)),
                lea(8)]
    return _at(KERNEL, "stack-order", 0, shape.raw, _back(KERNEL, _code(KERNEL, body), len(shape.raw)),
               f"{m}: rsp moved so that nothing is below it")


def control_aligned_slot(shape: Shape, rng: random.Random) -> Candidate | None:
    """At CPL 3: the copy with an aligned save slot around it, and the jump back rel32 or absolute with an
    aligned qword."""
    if not _position_independent(shape) or _writes_rsp(shape.ins):
        return None
    site, n = USER, len(shape.raw)
    reg = _free(shape.ins, tuple(rng.sample(_SCRATCH, len(_SCRATCH))))
    if reg is None:
        return None
    body = _code(site, [_I.create_mem_reg(_C.MOV_RM64_R64, site.slot_at(1), reg)], shape.raw,
                 [_I.create_reg_mem(_C.MOV_R64_RM64, reg, site.slot_at(1))])
    reloc = _back(site, body, n) if rng.random() < 0.5 else _abs_back(site, body, site.at + n)
    return _at(site, "aligned-slot", 0, shape.raw, reloc, "an aligned save slot and jump back", slots=True)


def control_kernel_copy(shape: Shape, rng: random.Random) -> Candidate | None:
    """At CPL 0: the copy and a direct jump back (no indirect branch for IBT, nothing below RSP)."""
    if not _position_independent(shape):
        return None
    return _at(KERNEL, "kernel-copy", 0, shape.raw, _back(KERNEL, shape.raw, len(shape.raw)),
               "copy, then jmp rel32 at CPL 0")


def control_same_segment(shape: Shape, rng: random.Random) -> Candidate | None:
    """A memory operand's base moved onto another register of the same segment class (DS onto DS, rsp
    onto rbp): the same address, the same fault."""
    ins = shape.ins
    if not _position_independent(shape) or not _based(ins) or ins.has_lock_prefix or _writes_rsp(ins):
        return None  # a locked operation's operand rebased is another atomic operation to the checker
    if ins.memory_base == _R.RSP:
        new = _free(ins, (_R.RBP,))
    elif ins.memory_base == _R.RBP:
        return None
    else:
        new = _free(ins)
    if new is None:
        return None
    site = USER if rng.random() < 0.7 else KERNEL
    body = _rebased(shape, site, new)
    if body is None:
        return None
    return _at(site, "same-segment", 0, shape.raw, _back(site, body, len(shape.raw)), "rebased, same segment",
               slots=True)


# ---------------------------------------------------------------------------
# Controls: truly equivalent relocations
# ---------------------------------------------------------------------------


def control_own_plan(shape: Shape, rng: random.Random) -> Candidate | None:
    """The project's own plan (copy, rewrite) for the shape."""
    plan = own_plan(shape)
    return None if plan is None else _cand("own-plan", 0, shape, plan, "our own plan")


def control_absolute_jump(shape: Shape, rng: random.Random) -> Candidate | None:
    """The copy with an absolute jump back (NOPs, ``jmp *0(%rip); .quad A+len``) instead of rel32, its
    qword 8-aligned: at CPL 3 with RFLAGS.AC set an unaligned one raises #AC (class 21)."""
    if not _position_independent(shape):
        return None
    return _cand("absolute-jump-back", 0, shape, _abs_back(USER, shape.raw, shape.end), "copy, then jmp *0(%rip)")


_ALT = {(_C.MOV_RM64_R64, _C.MOV_R64_RM64), (_C.MOV_RM32_R32, _C.MOV_R32_RM32), (_C.XOR_RM32_R32, _C.XOR_R32_RM32),
        (_C.ADD_RM64_R64, _C.ADD_R64_RM64), (_C.SUB_RM64_R64, _C.SUB_R64_RM64), (_C.CMP_RM64_R64, _C.CMP_R64_RM64),
        (_C.AND_RM32_R32, _C.AND_R32_RM32), (_C.OR_RM64_R64, _C.OR_R64_RM64), (_C.TEST_RM64_R64, _C.TEST_RM64_R64)}
_ALT_MAP = {a: b for a, b in _ALT} | {b: a for a, b in _ALT}
_CODE_NAMES = {v: k for k, v in vars(_C).items() if k.isupper()}
_IMM32_OF = {code: getattr(_C, name.replace("IMM8", "IMM32")) for code, name in _CODE_NAMES.items()
             if name.endswith(("_RM64_IMM8", "_RM32_IMM8")) and name.split("_")[0] in
             ("ADD", "SUB", "AND", "OR", "XOR", "CMP", "ADC", "SBB") and hasattr(_C, name.replace("IMM8", "IMM32"))}


def control_reencode(shape: Shape, rng: random.Random) -> Candidate | None:
    """The same operation encoded another way: the other ModRM direction of a register-register ALU op or
    mov, an imm8 as an imm32, a nop in front."""
    ins = shape.ins
    if not _position_independent(shape):
        return None
    if ins.code in _ALT_MAP and ins.op_count == 2 and ins.op0_kind == ins.op1_kind == iced.OpKind.REGISTER:
        a, b = ins.op0_register, ins.op1_register
        body = enc(_I.create_reg_reg(_ALT_MAP[ins.code], a, b))
        if ins.code == _C.TEST_RM64_R64:
            body = enc(_I.create_reg_reg(ins.code, b, a))
        return _cand("re-encode", 0, shape, with_back(body, shape), "the other ModRM direction")
    wide = _IMM32_OF.get(ins.code)
    if wide is not None and ins.op_count == 2 and ins.op0_kind == iced.OpKind.REGISTER:
        body = enc(_I.create_reg_i32(wide, ins.op0_register, ins.immediate(1) - (1 << 64) if ins.immediate(1) >> 63
                                     else ins.immediate(1)))
        return _cand("re-encode", 0, shape, with_back(body, shape), "imm8 as imm32")
    return _cand("re-encode", 0, shape, with_back(b"\x90" + shape.raw, shape), "a nop in front")


OPERATORS: tuple[Operator, ...] = (
    Operator("rex-before-legacy", 1, "REX (W, R, X, B, or two) then a legacy prefix: ignored by the CPU, applied by VEX",
             rex_before_legacy),
    Operator("prefix-reorder", 1, "the original's prefixes shuffled: a REX before a legacy prefix is ignored",
             prefix_reorder, wants=_wants_prefixed),
    Operator("nan-sign", 2, "bitwise xmm ops (exact on NaNs) vs arithmetic twins (not)", nan_sign),
    Operator("mxcsr-status", 3, "max(x,x)/min(x,x) inserted: no value changes, MXCSR status does", mxcsr_status),
    Operator("compare-predicate", 3, "ordered/unordered, quiet/signalling predicates; comisd/ucomisd", compare_predicate),
    Operator("conversion", 3, "conversions swapped for twins (rounding, precision, invalid)", conversion),
    Operator("fence-swap", 4, "a fence for another kind, for nothing, or for a locked op on tracer memory", fence_swap,
             wants=_wants_fence),
    Operator("nontemporal-store", 4, "a store made non-temporal (movnti)", nontemporal_store, wants=_wants_store),
    Operator("locked-to-fenced", 4, "a locked RMW for mfence around the unlocked op", locked_to_fenced,
             wants=_wants_lock),
    Operator("flag-substitution", 5, "inc->add/sub/lea, test->and, add 0->imul 1, ...: flags (or undefined flags) differ",
             flag_substitution),
    Operator("multiply-helpers", 6, "mul/imul of each width, adc/sbb/rcl/rcr: VEX's flag helpers decide", multiply_helpers),
    Operator("x87-state", 7, "x87 instructions vs look-alikes: FSW, ES, B, tags", x87_state),
    Operator("avx512-state", 8, "vector twins that differ in zmm upper bits, zmm16-31, k0-7", avx512_state),
    Operator("alignment", 9, "aligned vs unaligned 16-byte accesses (#GP)", alignment),
    Operator("too-long", 9, "redundant prefixes past 15 bytes (#GP)", too_long),
    Operator("dead-divide", 9, "a division whose result is thrown away (#DE)", dead_divide),
    Operator("undefined-opcode", 9, "an instruction some CPU does not have (#UD)", undefined_opcode),
    Operator("operand-size-branch", 10, "0x66 on a near branch: 16-bit on AMD, ignored on Intel", operand_size_branch),
    Operator("ret-call-66", 10, "0x66 on ret, call or jmp through a register", ret_and_call_66),
    Operator("self-write", 11, "a store into the relocation's own code", self_write),
    Operator("jump-into-instruction", 12, "jmp +1 over a byte a linear sweep reads as part of the next instruction",
             jump_into_instruction),
    Operator("store-split", 13, "a store split in two, reordered, or re-read in between", store_split,
             wants=_wants_store),
    Operator("constant-model", 14, "xgetbv, xbegin, xtest, rdtsc, rdrand, cpuid ... relocated as VEX's constant",
             constant_model),
    Operator("vacuous-precondition", 15, "tracer memory whose union covers every address", vacuous_precondition),
    Operator("own-plan", 0, "our own plan", control_own_plan, control=True, wants=_wants_validated),
    Operator("absolute-jump-back", 0, "copy with an absolute jump back", control_absolute_jump, control=True,
             wants=_wants_validated),
    Operator("re-encode", 0, "the same operation encoded another way", control_reencode, control=True,
             wants=_wants_validated),
    Operator("fault-segment", 16, "an SS access rebased onto DS or the other way, an ss:/ds: override put or "
             "removed: #SS (SIGBUS) vs #GP (SIGSEGV)", fault_segment, wants=_wants_based),
    Operator("rmw-split", 16, "a read-modify-write split into load, op, store: the page fault's W bit",
             rmw_split, wants=_wants_rmw),
    Operator("trap-late", 17, "popf, sti, mov ss copied before the jump back: the trap or shadow one instruction "
             "early", trap_late),
    Operator("below-rsp", 18, "push, pop, leave, ret at CPL 0 with the data below RSP at a boundary", below_rsp,
             wants=_wants_stack_form),
    Operator("ibt-indirect", 19, "the jump back or a direct branch made indirect at CPL 0: #CP without endbr64",
             ibt_indirect),
    Operator("shadow-stack", 20, "call as push+jmp, ret as lea+jmp: the shadow stack one entry off", shadow_stack,
             wants=_wants_mnemonic("call", "ret")),
    Operator("unaligned-slot", 21, "an unaligned save slot or absolute jump qword at CPL 3: #AC", unaligned_slot),
    Operator("edge-operand", 22, "shift and rotate counts 0, 1, width and past it, bit offsets past the width",
             edge_operand, wants=_wants_shift),
    Operator("stack-order", 0, "push, pop, leave at CPL 0 with rsp moved first (nothing below it)",
             control_stack_order, control=True, wants=lambda raw: _wants_validated(raw) and _wants_stack_form(raw)),
    Operator("aligned-slot", 0, "an aligned save slot and jump back at CPL 3", control_aligned_slot, control=True,
             wants=_wants_validated),
    Operator("kernel-copy", 0, "the copy and a direct jump back at CPL 0", control_kernel_copy, control=True,
             wants=_wants_validated),
    Operator("same-segment", 0, "a memory operand rebased onto a register of the same segment class",
             control_same_segment, control=True, wants=lambda raw: _wants_exact(raw) and _wants_based(raw)),
)
