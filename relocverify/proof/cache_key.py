"""The proof cache key: what a verdict depends on, so that it may be reused."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import NamedTuple

import iced_x86

from ..plan.effects import AddRsp, Const, Jump, Let, Load, Push
from ..plan.plan import Plan, PlanKind
from ..plan.policy import RULES, classify
from ..versions import source_digest, versions_tag
from ..x86.encoding import iter_code
from ..x86.instruction import Decoded, Instruction
from ..x86.registers import MASK64
from . import form_table
from .forms import IMMEDIATE_OPERANDS
from .machine_model import Context, Machine
from .verdict import ProofResult, Verdict


class PcField(NamedTuple):
    offset: int
    size: int
    value: int  # the address the field denotes
    data: bool = False  # a RIP-relative operand whose data address's alignment is part of its role (``role_of``)


#: Instructions whose memory operand may sit at any address, whatever its alignment, when they carry no LOCK
#: prefix and only general-purpose registers: integer loads, stores, read-modify-writes and ``lea`` (which
#: accesses nothing).  The SDM requires no alignment of them (Vol. 1 §4.1.1; #AC applies only at CPL 3 with
#: RFLAGS.AC and CR0.AM, and there an original's access and its relocated copy's are the same access), and
#: libVEX lifts them with no alignment check (it checks only the aligned SSE/AVX moves, ``cmpxchg16b`` and the
#: state saves: ``test_vex_checks_alignment_at_lift_time``).  A RIP-relative operand of one of them is keyed
#: without its alignment, so its instances at every alignment share one proof; every other instruction's keeps
#: it (``tests/test_cache.py`` lifts both kinds at every alignment).
ALIGNMENT_BLIND = frozenset(getattr(iced_x86.Mnemonic, m) for m in (
    "MOV", "MOVZX", "MOVSX", "MOVSXD", "LEA", "ADD", "ADC", "SUB", "SBB", "AND", "OR", "XOR", "CMP", "TEST",
    "INC", "DEC", "NEG", "NOT", "IMUL", "MUL", "DIV", "IDIV", "BT", "BTS", "BTR", "BTC", "SHL", "SHR", "SAR",
    "ROL", "ROR", "CMOVO", "CMOVNO", "CMOVB", "CMOVAE", "CMOVE", "CMOVNE", "CMOVBE", "CMOVA", "CMOVS", "CMOVNS",
    "CMOVP", "CMOVNP", "CMOVL", "CMOVGE", "CMOVLE", "CMOVG", "SETO", "SETNO", "SETB", "SETAE", "SETE", "SETNE",
    "SETBE", "SETA", "SETS", "SETNS", "SETP", "SETNP", "SETL", "SETGE", "SETLE", "SETG"))
_BLIND_OPERAND_KINDS = frozenset({iced_x86.OpKind.REGISTER, iced_x86.OpKind.MEMORY, iced_x86.OpKind.IMMEDIATE8,
                           iced_x86.OpKind.IMMEDIATE16, iced_x86.OpKind.IMMEDIATE32, iced_x86.OpKind.IMMEDIATE8TO16,
                           iced_x86.OpKind.IMMEDIATE8TO32, iced_x86.OpKind.IMMEDIATE8TO64,
                           iced_x86.OpKind.IMMEDIATE32TO64})


def alignment_blind(ins: iced_x86.Instruction) -> bool:
    """Whether nothing ``ins`` does depends on its memory operand's alignment (``ALIGNMENT_BLIND``)."""
    if ins.mnemonic not in ALIGNMENT_BLIND or ins.has_lock_prefix or ins.encoding != iced_x86.EncodingKind.LEGACY:
        return False
    for k in range(ins.op_count):
        kind = ins.op_kind(k)
        if kind not in _BLIND_OPERAND_KINDS:
            return False
        if kind == iced_x86.OpKind.REGISTER and not iced_x86.RegisterExt.is_gpr(ins.op_register(k)):
            return False
    return True


def pc_fields(code: bytes, base: int) -> list[PcField] | None:
    """Every field of ``code`` (decoded at ``base``) whose value is an address:
    (offset, size, the address it denotes).  A RIP-relative displacement
    denotes next-rip + disp; a relative branch, its target; the qword after
    ``jmp *0(%rip)``, itself; a movabs immediate (a scratch plan's A+len),
    itself.  None if the bytes do not decode."""
    fields = []
    for piece in iter_code(code, base):
        off = piece.offset
        if piece.kind == "invalid":
            return None
        if piece.kind == "qword":
            fields.append(PcField(off, 8, int.from_bytes(code[off:off + 8], "little")))
            continue
        dec = iced_x86.Decoder(64, code[off:off + piece.length], ip=(base + off) & MASK64)
        ins = dec.decode()
        co = dec.get_constant_offsets(ins)
        if ins.is_ip_rel_memory_operand:
            fields.append(PcField(off + co.displacement_offset, co.displacement_size, ins.ip_rel_memory_address,
                                  not alignment_blind(ins)))
        if ins.flow_control in (1, 3, 5, 8) and ins.near_branch_target and co.has_immediate:
            fields.append(PcField(off + co.immediate_offset, co.immediate_size, ins.near_branch_target & MASK64))
        if ins.code == iced_x86.Code.MOV_R64_IMM64:
            fields.append(PcField(off + co.immediate_offset, 8, ins.immediate64))
    return fields


def role_of(value: int, data: bool, name: str) -> str:
    """A role, with the address's alignment (mod 64) when it addresses data:
    VEX decides at lift time whether an aligned access (movdqa, cmpxchg16b)
    faults, from the constant address itself (found by tests/test_cache.py)."""
    return f"{name}@{value & 63}" if data else name


def shape_of(code: bytes, fields) -> bytes:
    """``code`` with the bytes of its address-dependent ``fields`` zeroed: what a proof of it depends on."""
    b = bytearray(code)
    for f in fields:
        b[f.offset:f.offset + f.size] = bytes(f.size)
    return bytes(b)


#: The immediates the key leaves out: ``proof.forms.IMMEDIATE_OPERANDS`` (defined there, with the forms).



def operand_immediate(decoded: Instruction) -> bool:
    """True if the instruction's immediate is one of ``IMMEDIATE_OPERANDS``' plain constant operands."""
    if not decoded.imm_size or decoded.imm2_size or decoded.encoding != "legacy":
        return False
    if decoded.opname not in IMMEDIATE_OPERANDS or decoded.branch_target is not None:
        return False
    return not (decoded.opcode in (b"\xf6", b"\xf7") and decoded.modrm is not None and (decoded.modrm >> 3) & 7 == 1)


def copy_shape(decoded: Instruction) -> bytes:
    """A position-independent instruction's bytes with its displacement (and an
    ``IMMEDIATE_OPERANDS`` immediate) zeroed, followed by the displacement's
    alignment mod 64 when it is an absolute address (no base or index
    register), else 0xff."""
    raw = bytearray(decoded.raw)
    align = 0xFF
    if decoded.disp_size and not decoded.rip_relative:
        o, n = decoded.disp_offset, decoded.disp_size
        raw[o:o + n] = bytes(n)
        mem = decoded.memory
        if mem is not None and mem.base is None and mem.index is None:
            align = decoded.displacement & 63
    if operand_immediate(decoded):
        o, n = decoded.imm_offset, decoded.imm_size
        raw[o:o + n] = bytes(n)
    return bytes(raw) + bytes([align])


@lru_cache(maxsize=4)
def policy_digest(rules=RULES) -> bytes:
    """8 bytes identifying a policy table: a change of any row changes every key."""
    text = "\n".join(f"{r.name}|{r.strategy}|{r.reason}" for r in rules)
    return hashlib.sha256(text.encode()).digest()[:8]


def cache_tag(rules=RULES) -> bytes:
    """The versions of every tool (``versions.versions_tag``), the policy table's digest, the
    CPU-validated form table's (``form_table.digest``) and relocverify's own source (``versions.source_digest``:
    the checker and its machine model): a verdict is reused only under all four.
    Remembered by the table's identity (every proof asks; hashing its rows each time cost 5% of a proof)."""
    hit = _TAGS.get(id(rules))
    if hit is None or hit[0] is not rules:
        hit = _TAGS[id(rules)] = (rules, versions_tag() + policy_digest(rules) + form_table.digest()
                                  + source_digest()[:8])
    return hit[1]


_TAGS: dict[int, tuple[tuple, bytes]] = {}  # id of a policy table -> (the table, its tag)


def cache_key(decoded: Decoded, plan: Plan, where: Machine | None = None) -> bytes | None:
    """The key under which a verdict for ``plan`` may be reused, or None.

    What a verdict depends on: the bytes, the plan, and how the addresses in
    them relate to A and T; plus the versions of every tool that produced it.

    1. A byte-identical copy of a position-independent instruction (policy
       strategy ``copy``): keyed by its bytes with the displacement and an
       operand immediate zeroed (``copy_shape``), the alignment mod 64 of the displacement when it is
       an absolute address (no base, no index: ``%gs:0x28``), and the form
       of the jump back (rel32 or absolute).  The instruction has no
       RIP-relative operand and no relative branch, so A and T enter its VEX
       IR only as PC constants (IMark, rip writes, a rep loop's jump to
       itself), which no verdict depends on: the fast path drops or maps
       exactly those (A <-> T), the opaque test reads only the opcode, and
       the SMT obligation is relative.  The displacement (and an
       ``IMMEDIATE_OPERANDS`` immediate) enters the IR of both sides as the
       same constant, so the two sides' IR agree for one value exactly when
       they agree for another; only the alignment of an absolute address is
       decided at lift time, and it is in the key.
       Tracer memory is outside every address the original may access (a
       precondition of the obligation), so no value of it can alias the
       trampoline either.

    2. Any other plan: keyed by its *shape*: the original's bytes and the
       trampoline's bytes (or the effect program) with every address-valued
       field zeroed (``pc_fields``), and the *role* of each such field's
       value: the original's own target, A+len, or a trampoline offset; a
       data address also keeps its alignment mod 64 (``role_of``).
       Roles must be unambiguous (distinct values), else no key.  Only
       fast-path proofs are stored under such keys (see ``reusable``).
       Why reuse is sound: VEX lifts bytes at an address to IR that depends
       on the address only through PC constants (address, address+len, and
       address+len+field for RIP-relative operands and branches).  Two
       instances with the same shape and the same roles therefore lift, on
       both sides, to the same IR trees with the same role in each
       address-valued position; the fast path's equality of canonical IR,
       established for one instance, holds position by position for the
       other.  This invariance of the lifter is an assumption, tested in
       tests/test_cache.py over samples and over >10,000 real kernel
       instructions (which is how the alignment dependence was found).
    """
    if plan.kind is PlanKind.REJECT or not isinstance(decoded, Instruction):
        return None
    tag = cache_tag() + _context(where or Machine.at(plan.tramp), plan.tramp)
    if plan.kind is PlanKind.COPY and classify(decoded).strategy == "copy":
        form = b"r" if len(plan.trampoline) == decoded.length + 5 else b"a"
        return b"copy|" + tag + form + copy_shape(decoded)
    a, n, t = decoded.address, decoded.length, plan.tramp
    ofields = pc_fields(decoded.raw, a)
    if ofields is None:
        return None
    roles = {(a + n) & MASK64: "next", a: "self"}
    for k, f in enumerate(ofields):
        if f.value in roles:
            return None
        roles[f.value] = role_of(f.value, f.data, f"f{k}")
    if plan.kind is PlanKind.EMULATE:
        body = repr(tuple(_effect_roles(e, roles) for e in plan.effects))
        if "?" in body:
            return None
        return b"emu|" + tag + shape_of(decoded.raw, ofields) + b"|" + body.encode()
    tfields = pc_fields(plan.trampoline, t)
    if tfields is None:
        return None
    sig = []
    for f in tfields:
        v = f.value
        internal = 0 <= (v - t) & MASK64 < len(plan.trampoline) + 16
        if internal and v in roles:
            return None  # ambiguous: a trampoline address that is also one of the original's
        r = role_of(v, f.data, f"t+{(v - t) & MASK64}") if internal else roles.get(v)
        if r is None:
            return None
        sig.append(r)
    return (b"rel|" + tag + plan.rule.encode() + b"|" + shape_of(decoded.raw, ofields) + b"|"
            + shape_of(plan.trampoline, tfields) + b"|" + ",".join(sig).encode())


def _context(where: Machine, t: int) -> bytes:
    """What the machine model's verdict depends on beyond the shape: the machine (CPL 0 or 3: interrupt
    frames against signal frames, IBT, alignment checking; at CPL 0 whether the kernel may enforce IBT),
    and at CPL 3 the alignment of T mod 16, which fixes the alignment of every tracer-memory access (row
    alignment-check)."""
    return where.key + (bytes([t % 16]) if where.context is Context.USER else b"")


def _effect_roles(e, roles):
    def val(v):
        if isinstance(v, Const):
            return ("c", roles.get(v.value & MASK64, "?"))
        if isinstance(v, Load):
            ad = v.address
            disp = roles.get(ad.disp & MASK64, "?") if ad.base is None and ad.index is None else ad.disp
            return ("ld", ad.base, ad.index, ad.scale, disp, ad.segment, ad.address_size, v.size)
        return (type(v).__name__, getattr(v, "name", None))

    if isinstance(e, (Let,)):
        return ("let", e.name, val(e.value))
    if isinstance(e, Push):
        return ("push", val(e.value))
    if isinstance(e, AddRsp):
        return ("add", e.delta)
    if isinstance(e, Jump):
        return ("jump", val(e.to))
    return ("branch", e.cond, roles.get(e.taken & MASK64, "?"), roles.get(e.fallthrough & MASK64, "?"))


def reusable(key: bytes, result: ProofResult) -> bool:
    """May ``result`` be stored under ``key``?  Copies: any verdict but a
    timeout or internal error.  Shapes: only fast-path proofs (an SMT model
    may depend on the particular addresses, e.g. on which bytes alias)."""
    if result.method in ("timeout", "error", "crash"):
        return False
    if key.startswith(b"copy|"):
        return True
    return result.method == "fast-path" and result.verdict is Verdict.PROVED

