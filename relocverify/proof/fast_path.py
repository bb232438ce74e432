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


class NotApplicable(Exception):
    pass


def _canon_expr(e, temps: dict):
    t = type(e)
    if t is pyvex.expr.RdTmp:
        return ("t", temps[e.tmp])
    if t is pyvex.expr.Const:
        return ("c", e.con.type, e.con.value)
    if t is pyvex.expr.Get:
        if e.offset == L.REG_BY_NAME["rip"][0]:
            raise NotApplicable("reads rip")
        return ("get", e.offset, e.ty)
    if t in (pyvex.expr.Unop, pyvex.expr.Binop, pyvex.expr.Triop, pyvex.expr.Qop):
        return (e.op,) + tuple(_canon_expr(a, temps) for a in e.args)
    if t is pyvex.expr.Load:
        return ("ld", e.end, e.ty, _canon_expr(e.addr, temps))
    if t is pyvex.expr.ITE:
        return ("ite", _canon_expr(e.cond, temps), _canon_expr(e.iftrue, temps), _canon_expr(e.iffalse, temps))
    if t is pyvex.expr.CCall:
        return ("ccall", e.cee.name, e.retty) + tuple(_canon_expr(a, temps) for a in e.args)
    raise NotApplicable(f"expression {t.__name__}")


def _define(temps: dict, tmp: int) -> int:
    temps[tmp] = len(temps)
    return temps[tmp]


def canon_block(irsb, resolve, constant=None) -> tuple:
    """A canonical form of an IRSB: temps renamed by definition order, IMarks
    and writes of rip dropped (every exit and the block's end overwrite rip,
    and no statement reads it: checked), exit targets passed through ``resolve``.
    ``constant(address)`` may give the value of an 8-byte load from a constant
    address (the qword of the trampoline's own ``jmp *0(%rip)``): the load is
    then the constant, and a block ending in a jump through it ends at that
    constant, resolved like any other exit."""
    temps: dict = {}
    out = []
    folded: dict = {}
    rip = L.REG_BY_NAME["rip"][0]
    for st in irsb.statements:
        t = type(st)
        if t in (pyvex.stmt.IMark, pyvex.stmt.NoOp, pyvex.stmt.AbiHint):
            continue
        if t is pyvex.stmt.WrTmp and constant is not None and type(st.data) is pyvex.expr.Load \
                and st.data.ty == "Ity_I64" and type(st.data.addr) is pyvex.expr.Const:
            value = constant(st.data.addr.con.value)
            if value is not None:
                folded[st.tmp] = value
                continue
        if t is pyvex.stmt.WrTmp:
            if any(type(e) is pyvex.expr.RdTmp and e.tmp in folded for e in st.data.child_expressions) \
                    or (type(st.data) is pyvex.expr.RdTmp and st.data.tmp in folded):
                raise NotApplicable("a folded jump qword used as data")
            data = _canon_expr(st.data, temps)
            out.append(("wr", _define(temps, st.tmp), data))
        elif t is pyvex.stmt.Put:
            if st.offset == rip:
                _canon_expr(st.data, temps)  # still must not read rip
                continue
            out.append(("put", st.offset, _canon_expr(st.data, temps)))
        elif t is pyvex.stmt.Store:
            out.append(("st", st.end, _canon_expr(st.addr, temps), _canon_expr(st.data, temps)))
        elif t is pyvex.stmt.StoreG:
            out.append(("stg", st.end, _canon_expr(st.addr, temps), _canon_expr(st.data, temps),
                        _canon_expr(st.guard, temps)))
        elif t is pyvex.stmt.LoadG:
            args = (_canon_expr(st.addr, temps), _canon_expr(st.alt, temps), _canon_expr(st.guard, temps))
            out.append(("ldg", st.end, st.cvt, _define(temps, st.dst)) + args)
        elif t is pyvex.stmt.CAS:
            args = (_canon_expr(st.addr, temps), _canon_expr(st.expdLo, temps), _canon_expr(st.dataLo, temps))
            if st.dataHi is not None:
                args += (_canon_expr(st.expdHi, temps), _canon_expr(st.dataHi, temps))
                out.append(("cas2", st.end, _define(temps, st.oldLo), _define(temps, st.oldHi)) + args)
            else:
                out.append(("cas", st.end, _define(temps, st.oldLo)) + args)
        elif t is pyvex.stmt.MBE:
            out.append(("mbe", st.event))
        elif t is pyvex.stmt.Exit:
            out.append(("exit", _canon_expr(st.guard, temps), resolve(st.dst.value), _jk(st.jumpkind)))
        elif t is pyvex.stmt.Dirty:
            raise L.Gap(f"VEX models this instruction as the dirty helper {st.cee.name}, outside the IR")
        else:
            raise NotApplicable(f"statement {t.__name__}")
    nxt = irsb.next
    if type(nxt) is pyvex.expr.Const:
        end = ("exit", resolve(nxt.con.value), _jk(irsb.jumpkind))
    elif type(nxt) is pyvex.expr.RdTmp and nxt.tmp in folded:
        end = ("exit", resolve(folded[nxt.tmp]), _jk(irsb.jumpkind))
    else:
        end = ("next", _canon_expr(nxt, temps), _jk(irsb.jumpkind))
    return _drop_dead(tuple(out) + (end,))


def _jk(jumpkind: str) -> str:
    """Call and Ret are hints to VEX's clients; as state transitions they are Boring."""
    return "Ijk_Boring" if jumpkind in L.NORMAL_JUMPKINDS else jumpkind


def _uses(node, acc: set) -> set:
    if isinstance(node, tuple):
        if len(node) == 2 and node[0] == "t" and isinstance(node[1], int):
            acc.add(node[1])
        else:
            for n in node:
                _uses(n, acc)
    return acc


def _pure(node) -> bool:
    """No load inside: evaluating it has no effect (VEX operations and clean helpers are pure)."""
    if isinstance(node, tuple):
        if node and node[0] == "ld":
            return False
        return all(_pure(n) for n in node)
    return True


def _drop_dead(stmts: tuple) -> tuple:
    """Drop writes of temps nobody reads whose expression is pure (AbiHint's red-zone arithmetic)."""
    used = set()
    for st in stmts:
        if st[0] == "wr":
            _uses(st[2], used)
        else:
            _uses(st[1:], used)
    return tuple(st for st in stmts if not (st[0] == "wr" and st[1] not in used and _pure(st[2])))


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
    IRSB is lifted at T.  After canonicalisation (``canon_block``) the two
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
        orig = L.lift_one(bytes(raw), at)
        if orig.size != len(raw):
            return False
        reloc = L.lift(code, tramp)
        return canon_block(orig, lambda v: v) == canon_block(reloc, resolve_reloc, qword)
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
            return _drop_dead(tuple(out) + (end,))
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
        orig = L.lift_one(bytes(raw), at)
        if orig.size != len(raw):
            return False
        return canon_block(orig, lambda v: v) == image
    except NotApplicable:
        return False

