"""Random and edge machine states for the CPU judge, with every memory access placed in a data arena.

``random_registers(rng)`` draws the whole user-visible register state the
judge (``concrete.cpu``) loads: the 16 GPRs (random or edge values),
RFLAGS (CF PF AF ZF SF OF DF; AC clear, since Linux sets CR0.AM and AC=1
turns every misaligned user access into #AC, which no semantics here
models), MXCSR (rounding mode, FTZ/DAZ, sometimes unmasked exceptions and
preset status flags), the x87 control/status/tag words and stack (80-bit
values with NaNs, infinities, denormals), zmm0-31 (lanes with signed and
signalling NaNs with payloads, zeros, infinities, denormals, integers) and
k0-7, and fs/gs bases.

``place(raw, address, regs, rng)`` then chooses the registers an
instruction's memory accesses depend on (iced-x86's list of the accesses it
makes, implicit ones included: the stack of push/pop/call/ret, rsi/rdi of
string instructions) so that every access lands inside ``ARENA``, fills
the bytes around each access with random data (for an instruction that
computes floating point, the access itself with signalling and quiet NaNs,
denormals and other edge values in turn, ``_fp_bytes``), and points an indirect
branch, call or return at ``PAD``.  It returns None when no choice places
every access (the state is dropped).
"""

from __future__ import annotations

import random
import struct

import iced_x86 as iced

from ..x86.registers import GPR64, MASK64, reg_family
from .cpu import mxcsr_mask
from .outcome import MachineState

ARENA = 0x20000000
ARENA_SIZE = 0x10000
PAD = 0x540000000  # where indirect branches, calls and returns are sent
MARGIN = 64

EDGE_VALUES = (0, 1, 2, MASK64, MASK64 - 1, 1 << 63, (1 << 63) - 1, 1 << 31, (1 << 31) - 1, 0xFFFFFFFF,
               1 << 32, 0x80, 0xFF, 0x7F, 0x8000, 0xFFFF, 0x7FFF, 63, 64, 31, 32, 15, 16, 7, 8)
_F64 = (0x0000000000000000, 0x8000000000000000, 0x3FF0000000000000, 0xBFF0000000000000, 0x7FF0000000000000,
        0xFFF0000000000000, 0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0xFFF4000000000123,
        0x7FFC00000000ABCD, 0x0000000000000001, 0x800FFFFFFFFFFFFF, 0x0010000000000000, 0x7FEFFFFFFFFFFFFF,
        0x4004000000000000, 0xC00C000000000000, 0x43E0000000000000, 0xC3E0000000000000, 0x41DFFFFFFFC00000)
_F32 = (0x00000000, 0x80000000, 0x3F800000, 0xBF800000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
        0x7F800001, 0xFFA00123, 0x7FE0ABCD, 0x00000001, 0x807FFFFF, 0x00800000, 0x7F7FFFFF, 0x40200000,
        0x4F000000, 0xCF000000)
_X87 = (0, 0x3FFF8000000000000000, 0xBFFF8000000000000000, 0x7FFF8000000000000000, 0x7FFFC000000000000000,
        0xFFFFC000000000000000, 0x7FFFA000000000000001, 0x00000000000000000001, 0x00018000000000000000,
        0x40008000000000000000, 0x3FFF0000000000000000)
RFLAGS_ARITH = 0x8D5  # OF SF ZF AF PF CF
DF = 0x400


def _gpr(rng: random.Random) -> int:
    return rng.choice(EDGE_VALUES) if rng.random() < 0.35 else rng.getrandbits(64)


def _lane64(rng: random.Random) -> int:
    pick = rng.random()
    if pick < 0.35:
        return rng.choice(_F64)
    if pick < 0.6:
        return rng.choice(_F32) | (rng.choice(_F32) << 32)
    if pick < 0.7:
        return rng.choice(EDGE_VALUES)
    return rng.getrandbits(64)


def _vector(rng: random.Random, bits: int) -> int:
    v = 0
    for k in range(bits // 64):
        v |= _lane64(rng) << (64 * k)
    return v


def random_registers(rng: random.Random, *, vector_state: bool = True) -> dict[str, int]:
    """A random full register state (no memory); see the module doc."""
    regs = {r: _gpr(rng) for r in GPR64}
    regs["rflags"] = 0x2 | (rng.getrandbits(16) & (RFLAGS_ARITH | DF))
    mxcsr = 0x1F80 | (rng.randrange(4) << 13)
    if rng.random() < 0.2:
        mxcsr |= 0x8040  # FTZ and DAZ
    if rng.random() < 0.15:
        mxcsr &= ~(rng.getrandbits(6) << 7)  # unmask some exceptions: #XM is behaviour too
    if rng.random() < 0.3:
        mxcsr |= rng.getrandbits(6)  # sticky status flags already set
    regs["mxcsr"] = mxcsr & mxcsr_mask()
    regs["fs_base"] = rng.getrandbits(46) & ~0xFFF
    regs["gs_base"] = rng.getrandbits(46) & ~0xFFF
    if not vector_state:
        return regs
    for i in range(32):
        regs[f"zmm{i}"] = _vector(rng, 512)
    for i in range(8):
        regs[f"k{i}"] = rng.getrandbits(64) if rng.random() < 0.7 else rng.choice((0, MASK64, 0xFFFF))
    regs["fcw"] = 0x037F if rng.random() < 0.7 else (0x0040 | (rng.randrange(4) << 10) | (rng.randrange(4) << 8)
                                                       | (rng.getrandbits(6) | 0x3F))
    regs["fsw"] = (rng.randrange(8) << 11) | (rng.getrandbits(4) << 8 & 0x4700) | (rng.getrandbits(6) if
                                                                                   rng.random() < 0.3 else 0)
    regs["ftw"] = rng.getrandbits(8)
    for i in range(8):
        regs[f"st{i}"] = rng.choice(_X87) if rng.random() < 0.5 else rng.getrandbits(80)
    return regs


_INFO = iced.InstructionInfoFactory()
_REGISTER_NAMES = {v: k.lower() for k, v in vars(iced.Register).items() if k.isupper()}
_INDIRECT = frozenset({iced.FlowControl.INDIRECT_BRANCH, iced.FlowControl.INDIRECT_CALL, iced.FlowControl.RETURN})


def _family(reg: int) -> str | None:
    if reg == iced.Register.NONE:
        return None
    return reg_family(_REGISTER_NAMES[iced.RegisterExt.full_register(reg)])


def _accesses(ins: iced.Instruction) -> list:
    return [m for m in _INFO.info(ins).used_memory() if m.access != iced.OpAccess.NO_MEM_ACCESS]


def access_spans(raw: bytes, address: int, regs: dict[str, int]) -> list[tuple[int, int]]:
    """(address, bytes) of each memory access ``raw`` at ``address`` makes from ``regs``, in iced's order
    (implicit ones included): where a caller puts an operand's value after ``place``."""
    ins = iced.Decoder(64, raw, ip=address).decode()
    return [(_address(m, regs), max(iced.MemorySizeExt.size(m.memory_size), 1)) for m in _accesses(ins)]


def _address(m, regs: dict) -> int:
    base, index = _family(m.base), _family(m.index)
    if m.base == iced.Register.RIP:
        return m.displacement & MASK64  # iced gives the RIP-relative target here
    value = m.displacement + (regs[base] if base else 0) + (regs[index] * m.scale if index else 0)
    if m.segment == iced.Register.FS:
        value += regs.get("fs_base", 0)
    elif m.segment == iced.Register.GS:
        value += regs.get("gs_base", 0)
    return value & (MASK64 if m.address_size != iced.CodeSize.CODE32 else 0xFFFFFFFF)


_STRING = frozenset("movsb movsw movsd movsq stosb stosw stosd stosq lodsb lodsw lodsd lodsq scasb scasw scasd "
                    "scasq cmpsb cmpsw cmpsd cmpsq insb insw insd outsb outsw outsd".split())
_MNEMONIC = {v: k.lower() for k, v in vars(iced.Mnemonic).items() if k.isupper()}


#: The floating-point operands whose handling VEX does not model, first: a signalling NaN (MXCSR's invalid
#: flag, a quieted result), a denormal (the denormal flag; DAZ), a quiet NaN with a payload, their negative
#: twins, an infinity, a negative zero, 1.0.  ``place`` gives them to a memory operand in this order.
_F32_ORDER = (0x7F800001, 0x00000001, 0x7FC00000, 0xFFA00123, 0x807FFFFF, 0x7F800000, 0x80000000, 0x3F800000)
_F64_ORDER = (0x7FF0000000000001, 0x0000000000000001, 0x7FF8000000000000, 0xFFF4000000000123, 0x800FFFFFFFFFFFFF,
              0x7FF0000000000000, 0x8000000000000000, 0x3FF0000000000000)


def _edge_lane(edge: int) -> int:
    """The 64-bit lane of the ``edge``-th even state: doubles and pairs of singles from the ordered edges, in turn."""
    k = edge // 2
    return _F64_ORDER[k // 2 % len(_F64_ORDER)] if k % 2 == 0 else \
        _F32_ORDER[k // 2 % len(_F32_ORDER)] | _F32_ORDER[(k // 2 + 1) % len(_F32_ORDER)] << 32


def edge_vectors(regs: dict[str, int], edge: int) -> dict[str, int]:
    """``regs`` with, in an even ``edge``-th state, every lane of zmm0-31 the ordered floating-point edge of
    that state (``_fp_bytes``'s, so a scalar single in lane 0 meets a signalling NaN and a denormal in the
    first four states too); an odd state's registers as drawn."""
    if edge % 2:
        return regs
    lane = _edge_lane(edge)
    vector = sum(lane << (64 * k) for k in range(8))
    return regs | {f"zmm{i}": vector for i in range(32) if f"zmm{i}" in regs}


def _fp_bytes(rng: random.Random, width: int, edge: int) -> bytes | None:
    """What a floating-point instruction's memory operand of ``width`` bytes holds in its ``edge``-th state
    (None: random bytes).  Even states take the ordered edges in turn, so four states already meet a
    signalling NaN, a denormal and a quiet NaN as a single (4 bytes), and as doubles and as pairs of singles
    (8 bytes and wider: the lane's type is the instruction's); odd states random edge lanes half of the time."""
    k = edge // 2
    if edge % 2 == 0:
        if width == 4:
            return struct.pack("<I", _F32_ORDER[k % len(_F32_ORDER)])
        if width >= 8 and width % 8 == 0:
            return struct.pack("<Q", _edge_lane(edge)) * (width // 8)
        return None
    if rng.random() < 0.5:
        return None
    if width == 4:
        return struct.pack("<I", rng.choice(_F32))
    if width >= 8 and width % 8 == 0:
        return b"".join(struct.pack("<Q", _lane64(rng)) for _ in range(width // 8))
    return None


def place(raw: bytes, address: int, regs: dict[str, int], rng: random.Random,
          arena: tuple[int, int] = (ARENA, ARENA_SIZE), fp_edge: int | None = None) -> MachineState | None:
    """``regs`` adjusted so that every memory access of ``raw`` at ``address`` falls in ``arena``, with
    random bytes around each access (None when that cannot be done); see the module doc.  ``fp_edge``:
    the instruction computes floating point, and this is its ``fp_edge``-th state: each access holds
    floating-point edge values as ``_fp_bytes`` chooses them.  With random bytes alone a memory operand
    was a NaN or a denormal about once in a hundred states, and forms whose CPU behaviour differs only
    there (cvtss2sd from memory sets MXCSR's invalid flag for a signalling NaN) validated exact."""
    lo, size = arena
    regs = dict(regs)
    ins = iced.Decoder(64, raw, ip=address).decode()
    mnemonic = _MNEMONIC[ins.mnemonic]
    fixed: set[str] = set()
    if mnemonic in _STRING and (ins.has_rep_prefix or ins.has_repne_prefix):
        regs["rcx"] = rng.randrange(6)
        fixed.add("rcx")
    if ins.flow_control in _INDIRECT or ins.is_stack_instruction or any(
            _family(u.register) == "rsp" for u in _INFO.info(ins).used_registers()):
        regs["rsp"] = lo + size // 2 + rng.randrange(-64, 64) * 8
        fixed.add("rsp")
    memory: dict[int, int] = {}
    if mnemonic in ("bt", "bts", "btr", "btc") and ins.op_count == 2 and ins.op1_kind == iced.OpKind.REGISTER \
            and ins.op0_kind == iced.OpKind.MEMORY:
        # a bit string: the register offset reaches base + offset/8, beyond the operand iced lists
        bits = _family(ins.op1_register)
        regs[bits] = rng.randrange(-64, 256) & MASK64
        fixed.add(bits)
    for m in _accesses(ins):
        base, index = _family(m.base), _family(m.index)
        target = lo + size // 4 + rng.randrange(size // 2)
        if rng.random() < 0.75:
            target &= ~63
        if m.base == iced.Register.RIP or (base is None and index is None):
            if m.segment in (iced.Register.FS, iced.Register.GS):
                seg = "fs_base" if m.segment == iced.Register.FS else "gs_base"
                if seg not in fixed:
                    regs[seg] = (target - m.displacement) & MASK64
                    fixed.add(seg)
        else:
            if m.segment in (iced.Register.FS, iced.Register.GS):
                seg = "fs_base" if m.segment == iced.Register.FS else "gs_base"
                if seg not in fixed:
                    regs[seg] = 0
                    fixed.add(seg)
            if index and index not in fixed and index != base and base is None:
                # index only ([index*scale + disp]): the index alone must reach the arena
                seg = regs.get("fs_base", 0) if m.segment == iced.Register.FS else \
                    regs.get("gs_base", 0) if m.segment == iced.Register.GS else 0
                regs[index] = ((target - m.displacement - seg) // m.scale) & MASK64
                fixed.add(index)
            if index and index not in fixed and index != base:
                regs[index] = rng.randrange(8)
                fixed.add(index)
            if base and base == index and base not in fixed:  # [r + r*scale]: r alone reaches the arena
                seg = regs.get("fs_base", 0) if m.segment == iced.Register.FS else \
                    regs.get("gs_base", 0) if m.segment == iced.Register.GS else 0
                regs[base] = ((target - m.displacement - seg) // (1 + m.scale)) & MASK64
                fixed.add(base)
            if base and base not in fixed:
                idx = regs[index] * m.scale if index else 0
                seg = regs.get("fs_base", 0) if m.segment == iced.Register.FS else \
                    regs.get("gs_base", 0) if m.segment == iced.Register.GS else 0
                regs[base] = (target - m.displacement - idx - seg) & MASK64
                fixed.add(base)
        at = _address(m, regs)
        width = max(iced.MemorySizeExt.size(m.memory_size), 1)
        span = 6 * 8 if mnemonic in _STRING else 0
        if not (lo + MARGIN + span <= at and at + width + MARGIN + span <= lo + size):
            return None
        for a in range(at - MARGIN - span, at + width + MARGIN + span):
            memory.setdefault(a, rng.getrandbits(8))
        if fp_edge is not None:
            edge = _fp_bytes(rng, width, fp_edge)
            if edge is not None:
                for k, b in enumerate(edge):
                    memory[at + k] = b
    if mnemonic in ("popf", "popfq", "popfd", "popfw", "iretq", "iret", "iretd"):
        rsp = regs["rsp"]
        memory[rsp + 1] = memory.get(rsp + 1, 0) & ~0x01  # TF would single-step into SIGTRAP
        memory[rsp + 2] = memory.get(rsp + 2, 0) & ~0x04  # AC: see the module doc
    if ins.flow_control in _INDIRECT:
        if ins.op_count and ins.op0_kind == iced.OpKind.REGISTER:
            regs[_family(ins.op0_register)] = PAD
        else:
            read = next((m for m in _accesses(ins) if m.access in (iced.OpAccess.READ, iced.OpAccess.COND_READ)
                         and iced.MemorySizeExt.size(m.memory_size) == 8), None)
            if read is None:
                return None
            at = _address(read, regs)
            for k, b in enumerate(struct.pack("<Q", PAD)):
                memory[at + k] = b
    return MachineState(regs, memory)
