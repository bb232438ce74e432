"""Proof by IR identity: the relocation's canonical VEX IR is the original's,
up to the A <-> T correspondence (``fast_path``), or the original's IR is
an effect program's IR image (``fast_path_effects``).  Each function's
docstring holds its soundness argument."""

from __future__ import annotations

import pyvex

from ..plan.effects import Address, AddRsp, Const, Jump, Let, Load, Push, Reg, Temp
from ..x86.encoding import ABS_JUMP
from ..x86.registers import MASK64
from . import lift as L
from .canonical import NotApplicable, drop_dead
from .lifted import lifted, lifted_one


def pure_jump_target(code: bytes, tramp: int, pc: int, depth: int = 0) -> int:
    """Where a trampoline-internal block that only jumps goes (through chains of such blocks)."""
    if depth > 8:
        raise NotApplicable("jump chain too long")
    irsb = L.lift(code[pc - tramp:], pc)
    for st in irsb.statements:
        if type(st) in (pyvex.stmt.IMark, pyvex.stmt.NoOp):
            continue
        if type(st) is pyvex.stmt.Put and st.offset == L.REG_BY_NAME["rip"][0] and type(st.data) is pyvex.expr.Const:
            continue
        if type(st) is pyvex.stmt.WrTmp and type(st.data) is pyvex.expr.Load and type(st.data.addr) is pyvex.expr.Const:
            continue  # the qword load of jmp *0(%rip), resolved below
        raise NotApplicable("internal block does more than jump")
    if irsb.jumpkind != "Ijk_Boring":
        raise NotApplicable("internal block is not a plain jump")
    nxt = irsb.next
    if type(nxt) is pyvex.expr.Const:
        target = nxt.con.value
    else:
        load = next((st.data for st in irsb.statements if type(st) is pyvex.stmt.WrTmp
                     and type(nxt) is pyvex.expr.RdTmp and st.tmp == nxt.tmp), None)
        if load is None or type(load) is not pyvex.expr.Load or load.ty != "Ity_I64":
            raise NotApplicable("internal block jumps indirectly")
        off = load.addr.con.value - tramp
        if not 0 <= off <= len(code) - 8:
            raise NotApplicable("absolute jump through memory outside the trampoline")
        target = int.from_bytes(code[off:off + 8], "little")
    if tramp < target < tramp + len(code):
        return pure_jump_target(code, tramp, target, depth + 1)
    return target


def fast_path(raw: bytes, at: int, code: bytes, tramp: int) -> bool:
    """Prove equivalence by IR identity, or return False (no conclusion).

    Argument.  The original is one IRSB lifted at A; the relocation's first
    IRSB is lifted at T.  After canonicalisation (``canonical.canon_block``) the two
    statement lists are required to be identical, and no statement reads
    rip.  Both run from the same initial state, and the only state they may
    see differently is rip (A vs T), which neither reads: by induction over
    the statements every temp, register write, load, store, CAS and exit
    guard has the same value on both sides, so each exit is taken under the
    same inputs with the same state.  Writes of rip are dead (each exit and
    the block's end set rip).  Exit targets are compared after mapping:
    the relocation's T is A (the instruction starting over), and a target
    inside the trampoline is replaced by where the block there jumps,
    which is sound only because such a block is checked to do nothing but
    jump (no state change except rip).  A load of the qword of the
    trampoline's own ``jmp *0(%rip)`` is its constant: those bytes are
    tracer memory, which the original never accesses (the precondition) and
    no store of the relocation hits (``smt.code_writes`` covers the SMT
    path; here the statement lists are equal, so the relocation stores only
    where the original does).  Equal mapped targets and equal states at every
    exit are exactly obligations 1-4.
    """
    end = tramp + len(code)

    def resolve_reloc(v: int) -> int:
        if v == tramp:
            return at
        if tramp < v < end:
            return pure_jump_target(code, tramp, v)
        return v

    def qword(address: int) -> int | None:
        """The target of the trampoline's own ``jmp *0(%rip)`` when ``address`` is its qword."""
        off = address - tramp
        if 6 <= off <= len(code) - 8 and code[off - 6:off] == ABS_JUMP:
            return int.from_bytes(code[off:off + 8], "little")
        return None

    try:
        orig = lifted_one(bytes(raw), at)
        if orig.size != len(raw):
            return False
        reloc = lifted(code, tramp, constant=qword)
        return orig.canonical() == reloc.canonical(resolve_reloc)
    except NotApplicable:
        return False


def _effects_image(effects) -> tuple | None:
    """The IR image of an effect program, in ``canon_block``'s canonical form,
    or None when the program uses a form this translation does not cover
    (memory operands: those go to the SMT path).

    Each effect becomes the IR statements that mean exactly what effects.py
    says it means: Push(v) is ``t=GET(rsp); t'=Sub64(t,8); PUT(rsp)=t';
    STle(t')=v``; AddRsp(d) is ``PUT(rsp)=Add64(rsp,d)``; Let(n, Load(rsp))
    is ``LDle:I64(rsp)``; a 64-bit load from base + index*scale + disp (no
    segment) is ``LDle:I64(Add64(Add64(base, Shl64(index, log2 scale)), disp))``
    with the parts that are absent left out; Jump(v) ends the block at v.  A register's value
    is re-used from the last statement that produced it, as VEX's lifter
    does, so that an identical image means an identical computation.
    """
    rsp = L.REG_BY_NAME["rsp"][0]
    out: list = []
    known: dict[int, tuple] = {}
    names: dict[str, tuple] = {}
    counter = [0]

    def wr(expr) -> tuple:
        out.append(("wr", counter[0], expr))
        counter[0] += 1
        return ("t", counter[0] - 1)

    def reg(name: str) -> tuple:
        off = L.REG_BY_NAME[name][0]
        if off not in known:
            known[off] = wr(("get", off, "Ity_I64"))
        return known[off]

    def value(v):
        if isinstance(v, Const):
            return ("c", "Ity_I64", v.value & MASK64)
        if isinstance(v, Reg):
            return reg(v.name)
        if isinstance(v, Temp):
            return names.get(v.name)
        if isinstance(v, Load) and v.size == 8 and v.address == Address(base="rsp"):
            return wr(("ld", "Iend_LE", "Ity_I64", reg("rsp")))
        if (isinstance(v, Load) and v.size == 8 and v.address.base is None and v.address.index is None
                and v.address.segment is None and v.address.address_size == 64):
            return wr(("ld", "Iend_LE", "Ity_I64", ("c", "Ity_I64", v.address.disp & MASK64)))
        if (isinstance(v, Load) and v.size == 8 and v.address.segment is None and v.address.address_size == 64
                and v.address.scale in (1, 2, 4, 8)):
            # base + index*scale + disp, mod 2^64, in the statements VEX's lifter writes for it (the
            # index read and scaled first, then the base, then the displacement): the exact meaning
            # of the effect's address, so an identical image is an identical computation
            a = v.address
            addr = None
            if a.index is not None:
                addr = reg(a.index)
                if a.scale > 1:
                    addr = wr(("Iop_Shl64", addr, ("c", "Ity_I8", a.scale.bit_length() - 1)))
            if a.base is not None:
                base = reg(a.base)
                addr = base if addr is None else wr(("Iop_Add64", base, addr))
            if addr is None:
                return None
            if a.disp & MASK64:
                addr = wr(("Iop_Add64", addr, ("c", "Ity_I64", a.disp & MASK64)))
            return wr(("ld", "Iend_LE", "Ity_I64", addr))
        return None

    for k, e in enumerate(effects):
        last = k == len(effects) - 1
        if isinstance(e, Let):
            val = value(e.value)
            if val is None:
                return None
            names[e.name] = val
        elif isinstance(e, Push):
            val = value(e.value)
            if val is None:
                return None
            new = wr(("Iop_Sub64", reg("rsp"), ("c", "Ity_I64", 8)))
            out.append(("put", rsp, new))
            known[rsp] = new
            out.append(("st", "Iend_LE", new, val))
        elif isinstance(e, AddRsp):
            new = wr(("Iop_Add64", reg("rsp"), ("c", "Ity_I64", e.delta & MASK64)))
            out.append(("put", rsp, new))
            known[rsp] = new
        elif isinstance(e, Jump) and last:
            val = value(e.to)
            if val is None:
                return None
            end = ("exit", val[2], "Ijk_Boring") if val[0] == "c" else ("next", val, "Ijk_Boring")
            return drop_dead(tuple(out) + (end,))
        else:
            return None
    return None


def fast_path_effects(raw: bytes, at: int, effects) -> bool:
    """Prove an emulation by IR identity: the original's canonical IR equals
    the effect program's IR image (``_effects_image``), so the two compute
    the same state and the same next rip by the argument of ``fast_path``."""
    image = _effects_image(effects)
    if image is None:
        return False
    try:
        orig = lifted_one(bytes(raw), at)
        if orig.size != len(raw):
            return False
        return orig.canonical() == image
    except NotApplicable:
        return False

