"""Instruction forms and the facts the semantics cannot see, from the bytes alone.

``facts(raw)`` decodes one instruction with iced-x86, which follows the
hardware (a REX prefix that is not the last prefix is ignored, a 16-byte
limit, invalid encodings are invalid), and returns ``InsnFacts``:

* ``form``: the instruction's *form*, the key of the CPU-validated table
  (``proof.form_table``): iced's ``Code`` (mnemonic, operand kinds and
  widths, encoding), each operand's kind and register class, the memory
  operand's addressing shape and segment, the pattern of register aliasing
  (which operands name the same register, and which are the instruction's
  implicit registers), the legacy/REX prefix sequence in order, the raw
  VEX/EVEX W and L bits, and every immediate except the plain constant
  operands of ``IMMEDIATE_BLIND``.  Two instructions with one form differ
  only in register numbers (respecting aliasing), displacement values,
  branch offsets and blind immediates: exactly the fields the proof cache
  and the engine's instance keys leave out, so an instance key determines
  the form;
* the hazards compared outside the semantics (``hazards``): fence kind,
  LOCK, non-temporal stores, cache-line flushes;
* what the semantics needs at each instruction: the memory alignment the
  instruction requires (legacy SSE 16-byte operands, the aligned VEX moves,
  ``cmpxchg16b``: #GP when misaligned, SDM Vol. 1 §14.9 and Vol. 2), and
  which zmm registers it zeroes above bit 255 (a VEX-encoded write zeroes
  bits MAXVL-1:VL; SDM Vol. 1 §15.5);
* CPUID features, whether x87/MMX state is touched, and whether Intel and
  AMD decode the bytes differently (iced's AMD decoder option: 16-bit near
  branches under 0x66, ud0 without ModRM, far transfers under REX.W; AMD
  APM Vol. 3 and SDM Vol. 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import iced_x86 as iced

CODE_NAMES = {v: k for k, v in vars(iced.Code).items() if k.isupper()}
MNEMONIC_NAMES = {v: k.lower() for k, v in vars(iced.Mnemonic).items() if k.isupper()}
REGISTER_NAMES = {v: k.lower() for k, v in vars(iced.Register).items() if k.isupper()}
FEATURE_NAMES = {v: k for k, v in vars(iced.CpuidFeature).items() if k.isupper()}
_OPKIND_NAMES = {v: k.lower() for k, v in vars(iced.OpKind).items() if k.isupper()}
_FLOW_NAMES = {v: k.lower() for k, v in vars(iced.FlowControl).items() if k.isupper()}
_BRANCH_KINDS = (iced.OpKind.NEAR_BRANCH16, iced.OpKind.NEAR_BRANCH32, iced.OpKind.NEAR_BRANCH64)
_RE = iced.RegisterExt
_INFO = iced.InstructionInfoFactory()

_LEGACY = {0x66: "66", 0x67: "67", 0xF0: "f0", 0xF2: "f2", 0xF3: "f3", 0x2E: "cs", 0x36: "ss", 0x3E: "ds",
           0x26: "es", 0x64: "fs", 0x65: "gs"}
#: Integer instructions whose immediate VEX lifts as a plain constant operand (its value never
#: changes which IR VEX emits or whether it can lift at all): the legacy ALU group, mov, test, imul,
#: push, shifts and rotates by imm8, and bt/bts/btr/btc imm8 (tested over many immediate values in
#: tests/test_cache.py; the proof cache and the engine's instance keys leave these immediates out).
IMMEDIATE_OPERANDS = frozenset(
    "add or adc sbb and sub xor cmp mov test imul push pushw pushq shl shr sal sar rol ror rcl rcr "
    "bt bts btr btc".split())
#: Immediates a form leaves out: those, and the byte count of ``ret imm16``.  Every other immediate is
#: part of the form (an SSE shuffle or compare predicate selects a different operation).  The CPU
#: validation of a form varies these immediates over edge values (0, 1, the width, random).
IMMEDIATE_BLIND = IMMEDIATE_OPERANDS | {"ret", "retf"}

#: Baseline features every x86-64 CPU has: never a reason to refuse.
BASELINE_FEATURES = frozenset({"INTEL8086", "INTEL186", "INTEL286", "INTEL386", "INTEL486", "X64", "CPUID",
                               "MULTIBYTENOP", "PAUSE", "INTEL8086_ONLY", "CMOV", "CX8", "SSE", "SSE2", "FXSR",
                               "FPU", "FPU287", "FPU387", "MMX", "SYSCALL", "RDTSC", "CLFSH"})

_FENCES = {"mfence": "mfence", "lfence": "lfence", "sfence": "sfence", "serialize": "serialize"}
_NONTEMPORAL = frozenset("movnti movntdq movntdqa movntps movntpd movntq movntss movntsd maskmovq maskmovdqu "
                         "vmovntdq vmovntdqa vmovntps vmovntpd vmaskmovdqu".split())
_CACHE = frozenset("clflush clflushopt clwb cldemote wbinvd wbnoinvd invd".split())
#: Legacy-SSE instructions whose 16-byte memory operand may be misaligned (SDM Vol. 1 §11.6.7, §12.10.3).
_UNALIGNED_SSE = frozenset("movups movupd movdqu lddqu pcmpestri pcmpestrm pcmpistri pcmpistrm".split())
#: VEX/EVEX instructions that still require an aligned operand (SDM Vol. 1 §14.9).
_ALIGNED_VEX = frozenset("vmovaps vmovapd vmovdqa vmovdqa32 vmovdqa64 vmovntps vmovntpd vmovntdq vmovntdqa".split())
_X87_FEATURES = frozenset({"FPU", "FPU287", "FPU387", "MMX", "MMXEXT", "D3NOW", "D3NOWEXT"})
_X87_MNEMONICS = frozenset({"wait", "fwait", "emms", "femms", "fxsave", "fxsave64", "fxrstor", "fxrstor64"})


@dataclass(frozen=True)
class Hazards:
    """What an instruction does that VEX's IR does not show: compared between the two sides, in order."""

    fence: str | None = None  # mfence, lfence, sfence, serialize
    locked: bool = False  # LOCK prefix, or xchg with memory (implicitly locked)
    nontemporal: bool = False  # a weakly ordered (write-combining) store or load hint
    cache: str | None = None  # clflush, clflushopt, clwb, ...

    def __bool__(self) -> bool:
        return bool(self.fence or self.locked or self.nontemporal or self.cache)

    def describe(self) -> str:
        parts = [self.fence or "", "locked" if self.locked else "", "non-temporal" if self.nontemporal else "",
                 self.cache or ""]
        return " ".join(p for p in parts if p) or "none"


@dataclass(frozen=True)
class InsnFacts:
    """One instruction's form and the facts the proof checks beside the semantics (shared by every
    instance of the instruction that differs only in a displacement or a branch offset)."""

    length: int
    form: str
    code: str
    mnemonic: str
    hazards: Hazards
    align: int  # bytes the explicit memory operand must be aligned to, else #GP; 0: none
    align_legacy: bool  # the alignment check is a legacy-SSE one (off under AMD's MXCSR.MM)
    zeroes_upper: tuple[int, ...]  # zmm registers whose bits 511:256 this instruction zeroes
    features: frozenset[str]
    x87: bool  # reads or writes x87/MMX state (FSW, FCW, tags, the register stack)
    vendor_split: str | None  # why Intel and AMD decode these bytes differently, else None
    position_dependent: bool  # reads RIP: a RIP-relative operand or a relative branch
    flow: str  # iced FlowControl, lower case


@lru_cache(maxsize=None)
def _family(reg: int) -> str:
    if _RE.is_vector_register(reg):
        return f"v{_RE.number(reg)}"
    return REGISTER_NAMES[_RE.full_register(reg)]


@lru_cache(maxsize=None)
def _register_class(reg: int) -> str:
    name = REGISTER_NAMES[reg]
    if _RE.is_gpr8(reg):
        if name in ("ah", "bh", "ch", "dh"):
            return "r8h"
        return "r8" if name in ("al", "bl", "cl", "dl") else "r8x"
    for cls, test in (("r16", _RE.is_gpr16), ("r32", _RE.is_gpr32), ("r64", _RE.is_gpr64), ("xmm", _RE.is_xmm),
                      ("ymm", _RE.is_ymm), ("zmm", _RE.is_zmm), ("k", _RE.is_k), ("st", _RE.is_st),
                      ("mm", _RE.is_mm)):
        if test(reg):
            return cls + ("h" if cls in ("xmm", "ymm", "zmm") and _RE.number(reg) >= 16 else "")
    return name  # segment, control, debug registers: by name


def _prefix_sequence(raw: bytes) -> list[str]:
    out, i = [], 0
    while i < len(raw):
        b = raw[i]
        if b in _LEGACY:
            out.append(_LEGACY[b])
        elif 0x40 <= b <= 0x4F:
            out.append("rex")
        else:
            break
        i += 1
    return out


def _vex_bits(raw: bytes, ins: iced.Instruction) -> str:
    """The raw W and L bits of a VEX/XOP/EVEX prefix (``''`` for legacy encodings)."""
    enc = ins.encoding
    i = len(_prefix_sequence(raw))
    if enc == iced.EncodingKind.VEX and raw[i] == 0xC5:
        return f"vex2.L{(raw[i + 1] >> 2) & 1}"
    if enc in (iced.EncodingKind.VEX, iced.EncodingKind.XOP):
        return f"vex3.W{raw[i + 2] >> 7}.L{(raw[i + 2] >> 2) & 1}"
    if enc == iced.EncodingKind.EVEX:
        return (f"evex.W{raw[i + 2] >> 7}.LL{(raw[i + 3] >> 5) & 3}.b{(raw[i + 3] >> 4) & 1}"
                f".z{raw[i + 3] >> 7}.aaa{int(ins.op_mask != iced.Register.NONE)}")
    return ""


def _immediate_class(mnemonic: str, value: int) -> str:
    if mnemonic in IMMEDIATE_BLIND:
        return "i"
    return f"i={value:x}"


def _form(raw: bytes, ins: iced.Instruction, mnemonic: str, info) -> str:
    used = {_family(u.register) for u in info.used_registers() if u.register != iced.Register.NONE}
    explicit = set()
    for k in range(ins.op_count):
        kind = ins.op_kind(k)
        if kind == iced.OpKind.REGISTER:
            explicit.add(_family(ins.op_register(k)))
        elif kind == iced.OpKind.MEMORY:
            for r in (ins.memory_base, ins.memory_index):
                if r not in (iced.Register.NONE, iced.Register.RIP, iced.Register.EIP):
                    explicit.add(_family(r))
    implicit = sorted(used - explicit)
    labels: dict[str, str] = {}

    def label(fam: str) -> str:
        if fam in implicit or fam == "rsp":
            return fam
        return labels.setdefault(fam, "ABCDEFGHIJKLMNOP"[len(labels)])

    ops = []
    for k in range(ins.op_count):
        kind = ins.op_kind(k)
        if kind == iced.OpKind.REGISTER:
            reg = ins.op_register(k)
            ops.append(f"{_register_class(reg)}:{label(_family(reg))}")
        elif kind == iced.OpKind.MEMORY:
            base, index = ins.memory_base, ins.memory_index
            if base in (iced.Register.RIP, iced.Register.EIP):
                shape = REGISTER_NAMES[base]
            elif base == iced.Register.NONE and index == iced.Register.NONE:
                shape = "abs"
            else:
                shape = ""
                if base != iced.Register.NONE:
                    shape = "b" + label(_family(base)) + ("" if _RE.is_gpr64(base) else "/" + _register_class(base))
                if index != iced.Register.NONE:
                    shape += "+i" + label(_family(index)) + ("" if _RE.is_gpr64(index) else "/" + _register_class(index))
                    shape += f"*{ins.memory_index_scale}" if ins.is_vsib else ""
            seg = REGISTER_NAMES[ins.memory_segment] if ins.segment_prefix != iced.Register.NONE else ""
            ops.append(f"m{iced.MemorySizeExt.size(ins.memory_size)}[{shape}{':' + seg if seg else ''}]")
        elif kind in (iced.OpKind.NEAR_BRANCH16, iced.OpKind.NEAR_BRANCH32, iced.OpKind.NEAR_BRANCH64):
            ops.append("rel")
        elif _OPKIND_NAMES[kind].startswith("immediate"):
            ops.append(_immediate_class(mnemonic, ins.immediate(k)))
        else:
            ops.append(_OPKIND_NAMES[kind])
    return f"{CODE_NAMES[ins.code]} {','.join(ops)} |{'.'.join(_prefix_sequence(raw))}|{_vex_bits(raw, ins)}|" \
           f"{','.join(implicit)}"


def _alignment(ins: iced.Instruction, mnemonic: str) -> tuple[int, bool]:
    """(bytes, legacy-SSE?) of the alignment the explicit memory operand needs to avoid #GP."""
    mem = next((k for k in range(ins.op_count) if ins.op_kind(k) == iced.OpKind.MEMORY), None)
    if mem is None:
        return 0, False
    size = iced.MemorySizeExt.size(ins.memory_size)
    if mnemonic == "cmpxchg16b":
        return 16, False
    if mnemonic in ("fxsave", "fxsave64", "fxrstor", "fxrstor64"):
        return 16, False
    if mnemonic.startswith("xsave") or mnemonic.startswith("xrstor"):
        return 64, False
    if ins.encoding == iced.EncodingKind.LEGACY and size == 16 and mnemonic not in _UNALIGNED_SSE and any(
            _RE.is_xmm(ins.op_register(k)) for k in range(ins.op_count) if ins.op_kind(k) == iced.OpKind.REGISTER):
        return 16, True
    if mnemonic in _ALIGNED_VEX:
        return size, False
    return 0, False


def _zeroes_upper(ins: iced.Instruction, mnemonic: str, info) -> tuple[int, ...]:
    if ins.encoding not in (iced.EncodingKind.VEX, iced.EncodingKind.EVEX, iced.EncodingKind.XOP):
        return ()
    if mnemonic in ("vzeroupper", "vzeroall"):
        return tuple(range(16))
    written = set()
    for u in info.used_registers():
        if u.access in (iced.OpAccess.WRITE, iced.OpAccess.READ_WRITE, iced.OpAccess.COND_WRITE,
                        iced.OpAccess.READ_COND_WRITE) and _RE.is_vector_register(u.register):
            written.add(_RE.number(u.register))  # iced names a VEX write by the whole zmm it zeroes
    return tuple(sorted(n for n in written if n < 16))


#: What iced-x86's AMD decoder option changes (its documentation): 16-bit near branches and returns under
#: 0x66, far transfers and lfs/lgs/lss under REX.W, ud0 without ModRM, LOCK mov to/from CR.  Only
#: instructions that transfer control, those mnemonics, or bytes iced cannot decode can read differently.
_VENDOR_MNEMONICS = frozenset({"ud0", "lfs", "lgs", "lss", "mov"})


def _vendor_split(raw: bytes, ins: iced.Instruction) -> str | None:
    if ins.flow_control == iced.FlowControl.NEXT and MNEMONIC_NAMES[ins.mnemonic] not in _VENDOR_MNEMONICS:
        return None
    if MNEMONIC_NAMES[ins.mnemonic] == "mov" and not ins.has_lock_prefix:
        return None
    amd = iced.Decoder(64, raw, iced.DecoderOptions.AMD).decode()
    if amd.is_invalid:
        return "AMD's decoder finds no instruction here (AMD APM Vol. 3); Intel's does (SDM Vol. 2)"
    if amd.len != ins.len or amd.code != ins.code or any(
            amd.op_kind(k) != ins.op_kind(k) for k in range(ins.op_count)):
        return (f"Intel reads {CODE_NAMES[ins.code].lower()} ({ins.len} bytes), AMD reads "
                f"{CODE_NAMES[amd.code].lower()} ({amd.len} bytes): SDM Vol. 2 vs AMD APM Vol. 3 (e.g. 0x66 on a "
                f"near branch is a 16-bit branch on AMD and ignored on Intel)")
    return None


@lru_cache(maxsize=1 << 17)
def facts(raw: bytes) -> InsnFacts | None:
    """The facts of the one instruction ``raw`` (None: it is not exactly one valid instruction on the CPU:
    invalid, longer than 15 bytes, or followed by more bytes).  Instances that differ only in a
    displacement or a branch offset share their facts."""
    raw = bytes(raw)
    if not raw or len(raw) > 15:
        return None
    dec = iced.Decoder(64, raw)
    ins = dec.decode()
    if ins.is_invalid or ins.len != len(raw):
        return None
    co = dec.get_constant_offsets(ins)
    shape = raw
    if co.has_displacement:
        shape = shape[:co.displacement_offset] + bytes(co.displacement_size) + shape[co.displacement_offset
                                                                                   + co.displacement_size:]
    if co.has_immediate and ins.op_count and ins.op0_kind in _BRANCH_KINDS:
        shape = shape[:co.immediate_offset] + bytes(co.immediate_size) + shape[co.immediate_offset
                                                                               + co.immediate_size:]
    return _facts_of_shape(shape)


@lru_cache(maxsize=1 << 16)
def _facts_of_shape(raw: bytes) -> InsnFacts | None:
    ins = iced.Decoder(64, raw).decode()
    if ins.is_invalid or ins.len != len(raw):
        return None
    mnemonic = MNEMONIC_NAMES[ins.mnemonic]
    info = _INFO.info(ins)
    features = frozenset(FEATURE_NAMES[f] for f in ins.cpuid_features())
    has_memory = any(ins.op_kind(k) == iced.OpKind.MEMORY for k in range(ins.op_count))
    hazards = Hazards(_FENCES.get(mnemonic), ins.has_lock_prefix or (mnemonic == "xchg" and has_memory),
                      mnemonic in _NONTEMPORAL, mnemonic if mnemonic in _CACHE else None)
    regs = [u.register for u in info.used_registers()]
    x87 = bool(features & _X87_FEATURES) or mnemonic in _X87_MNEMONICS or any(
        _RE.is_st(r) or _RE.is_mm(r) for r in regs)
    align, legacy = _alignment(ins, mnemonic)
    position = ins.is_ip_rel_memory_operand or any(ins.op_kind(k) in _BRANCH_KINDS for k in range(ins.op_count))
    return InsnFacts(len(raw), _form(raw, ins, mnemonic, info), CODE_NAMES[ins.code], mnemonic, hazards, align, legacy,
                     _zeroes_upper(ins, mnemonic, info), features, x87, _vendor_split(raw, ins), position,
                     _FLOW_NAMES[ins.flow_control])


def extra_features(orig: frozenset[str], reloc: frozenset[str]) -> frozenset[str]:
    """Features the relocation needs beyond the original's and the baseline (#UD on CPUs without them)."""
    return reloc - orig - BASELINE_FEATURES


@lru_cache(maxsize=1 << 16)
def cpu_length(raw: bytes) -> int:
    """The length of the instruction the CPU decodes at the start of ``raw`` (iced-x86), 0 if none."""
    ins = iced.Decoder(64, raw).decode()
    return 0 if ins.is_invalid else ins.len
