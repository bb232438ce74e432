"""Prove a relocation equivalent to the original instruction, or refute it.

The obligation (one instruction at A, its relocation at T):

  From one arbitrary machine state (every general-purpose register, RFLAGS
  (OF SF ZF AF PF CF, and DF, AC, ID), the fs/gs bases, every SIMD/x87
  register the code touches, and all of memory), run the original
  instruction at A and the relocation at T (its bytes, or an emulate plan's
  effects).  For every input the two must end with

    1. the same value in every register either side wrote (RFLAGS compared
       as flags, computed from VEX's lazy thunk, not the thunk itself);
    2. the same byte at every memory address outside tracer memory;
    3. the same sequence of memory reads (address and size, on the path taken),
       tracer memory excepted;
    4. the same next RIP, under the A <-> T correspondence: a jump back to T
       is the relocated instruction starting over, the image of the
       original jumping to A (rep string loops, CAS retries); every other
       exit must be the original's successor itself (A+len, the branch
       target, the call target with A+len pushed).

  Left out, and why: tracer memory, i.e. the trampoline bytes (and the
  absolute-jump qwords inside them) and a scratch plan's save slot.  The
  tracer allocates and writes them, no kernel code addresses them, and the
  original instruction cannot see them: they exist only for the relocation.
  A plan never writes below rsp except by an emulated push, which is the
  original's own push, compared like any other store.

  5. Atomicity, a separate obligation a sequential semantics cannot see:
     the relocated code performs the original's memory operation under
     LOCK exactly when the original does (a LOCK prefix, or xchg with
     memory, which is implicitly locked).

Semantics: ``semantics.py`` (VEX IR via pyvex, angr's claripy operations,
memory for all addresses).  A proof is an UNSAT answer from z3 for the
negated obligation, or the IR-identity fast path (``fast_path``), whose
soundness argument is in its docstring.  A SAT answer is a counterexample;
it is reported as ``refuted`` only after unicorn, an independent concrete
executor, replays both sides on it and sees a difference too; otherwise the
verdict is ``unknown``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import NamedTuple

import claripy
import pyvex

from . import semantics as S
from .effects import Address, AddRsp, Const, Effect, Jump, Let, Load, Push, Reg, Temp, effect_json
from .instruction import Decoded, Instruction
from .plan import Plan, PlanKind
from .policy import classify
from .verdict import Counterexample, Difference, ProofResult, Verdict

MASK64 = 0xFFFFFFFFFFFFFFFF
DEFAULT_TIMEOUT_MS = 10_000

# Instructions VEX lifts without error but wrongly (REFERENCES.md, "VEX").
# A byte-identical copy of one is ``opaque``: the copy runs the same
# hardware instruction, but no VEX-based proof of that exists.
OPAQUE_LIFTS: dict[str, str] = {
    "swapgs": "VEX lifts swapgs as a no-op",
    "cli": "VEX lifts cli as a privileged exit",
    "sti": "VEX lifts sti as a privileged exit",
    "iretq": "VEX's iretq ignores CS and SS",
    "rdmsr": "VEX models rdmsr as an effect-less helper",
    "sysret": "VEX models sysret as an effect-less helper",
    "sysretq": "VEX models sysret as an effect-less helper",
}


def _opaque_lift_reason(insn: Instruction) -> str | None:
    if insn.opname in OPAQUE_LIFTS:
        return OPAQUE_LIFTS[insn.opname]
    if insn.opcode in (b"\x0f\x20", b"\x0f\x22"):
        return "VEX lifts mov to/from a control register through a 32-bit truncation"
    if insn.opcode in (b"\x0f\x21", b"\x0f\x23"):
        return "VEX does not model debug registers"
    return None


# ---------------------------------------------------------------------------
# Fast path
# ---------------------------------------------------------------------------


class _NotApplicable(Exception):
    pass


def _canon_expr(e, temps: dict):
    t = type(e)
    if t is pyvex.expr.RdTmp:
        return ("t", temps[e.tmp])
    if t is pyvex.expr.Const:
        return ("c", e.con.type, e.con.value)
    if t is pyvex.expr.Get:
        if e.offset == S.REG_BY_NAME["rip"][0]:
            raise _NotApplicable("reads rip")
        return ("get", e.offset, e.ty)
    if t in (pyvex.expr.Unop, pyvex.expr.Binop, pyvex.expr.Triop, pyvex.expr.Qop):
        return (e.op,) + tuple(_canon_expr(a, temps) for a in e.args)
    if t is pyvex.expr.Load:
        return ("ld", e.end, e.ty, _canon_expr(e.addr, temps))
    if t is pyvex.expr.ITE:
        return ("ite", _canon_expr(e.cond, temps), _canon_expr(e.iftrue, temps), _canon_expr(e.iffalse, temps))
    if t is pyvex.expr.CCall:
        return ("ccall", e.cee.name, e.retty) + tuple(_canon_expr(a, temps) for a in e.args)
    raise _NotApplicable(f"expression {t.__name__}")


def _define(temps: dict, tmp: int) -> int:
    temps[tmp] = len(temps)
    return temps[tmp]


def _canon_block(irsb, resolve) -> tuple:
    """A canonical form of an IRSB: temps renamed by definition order, IMarks
    and writes of rip dropped (every exit and the block's end overwrite rip,
    and no statement reads it: checked), exit targets passed through ``resolve``."""
    temps: dict = {}
    out = []
    rip = S.REG_BY_NAME["rip"][0]
    for st in irsb.statements:
        t = type(st)
        if t in (pyvex.stmt.IMark, pyvex.stmt.NoOp, pyvex.stmt.AbiHint):
            continue
        if t is pyvex.stmt.WrTmp:
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
            if st.dataHi is not None:
                raise _NotApplicable("double CAS")
            args = (_canon_expr(st.addr, temps), _canon_expr(st.expdLo, temps), _canon_expr(st.dataLo, temps))
            out.append(("cas", st.end, _define(temps, st.oldLo)) + args)
        elif t is pyvex.stmt.MBE:
            out.append(("mbe", st.event))
        elif t is pyvex.stmt.Exit:
            out.append(("exit", _canon_expr(st.guard, temps), resolve(st.dst.value), _jk(st.jumpkind)))
        elif t is pyvex.stmt.Dirty:
            raise S.Gap(f"VEX models this instruction as the dirty helper {st.cee.name}, outside the IR")
        else:
            raise _NotApplicable(f"statement {t.__name__}")
    nxt = irsb.next
    if type(nxt) is pyvex.expr.Const:
        end = ("exit", resolve(nxt.con.value), _jk(irsb.jumpkind))
    else:
        end = ("next", _canon_expr(nxt, temps), _jk(irsb.jumpkind))
    return _drop_dead(tuple(out) + (end,))


def _jk(jumpkind: str) -> str:
    """Call and Ret are hints to VEX's clients; as state transitions they are Boring."""
    return "Ijk_Boring" if jumpkind in S.NORMAL_JUMPKINDS else jumpkind


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


def _pure_jump_target(code: bytes, tramp: int, pc: int, depth: int = 0) -> int:
    """Where a trampoline-internal block that only jumps goes (through chains of such blocks)."""
    if depth > 8:
        raise _NotApplicable("jump chain too long")
    irsb = S.lift(code[pc - tramp:], pc)
    for st in irsb.statements:
        if type(st) in (pyvex.stmt.IMark, pyvex.stmt.NoOp):
            continue
        if type(st) is pyvex.stmt.Put and st.offset == S.REG_BY_NAME["rip"][0] and type(st.data) is pyvex.expr.Const:
            continue
        if type(st) is pyvex.stmt.WrTmp and type(st.data) is pyvex.expr.Load and type(st.data.addr) is pyvex.expr.Const:
            continue  # the qword load of jmp *0(%rip), resolved below
        raise _NotApplicable("internal block does more than jump")
    if irsb.jumpkind != "Ijk_Boring":
        raise _NotApplicable("internal block is not a plain jump")
    nxt = irsb.next
    if type(nxt) is pyvex.expr.Const:
        target = nxt.con.value
    else:
        load = next((st.data for st in irsb.statements if type(st) is pyvex.stmt.WrTmp
                     and type(nxt) is pyvex.expr.RdTmp and st.tmp == nxt.tmp), None)
        if load is None or type(load) is not pyvex.expr.Load or load.ty != "Ity_I64":
            raise _NotApplicable("internal block jumps indirectly")
        off = load.addr.con.value - tramp
        if not 0 <= off <= len(code) - 8:
            raise _NotApplicable("absolute jump through memory outside the trampoline")
        target = int.from_bytes(code[off:off + 8], "little")
    if tramp < target < tramp + len(code):
        return _pure_jump_target(code, tramp, target, depth + 1)
    return target


def fast_path(raw: bytes, at: int, code: bytes, tramp: int) -> bool:
    """Prove equivalence by IR identity, or return False (no conclusion).

    Argument.  The original is one IRSB lifted at A; the relocation's first
    IRSB is lifted at T.  After canonicalisation (``_canon_block``) the two
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
    jump (no state change except rip).  Equal mapped targets and equal
    states at every exit are exactly obligations 1-4.
    """
    end = tramp + len(code)

    def resolve_reloc(v: int) -> int:
        if v == tramp:
            return at
        if tramp < v < end:
            return _pure_jump_target(code, tramp, v)
        return v

    try:
        orig = S.lift(raw, at, max_inst=1)
        if orig.size != len(raw):
            return False
        reloc = S.lift(code, tramp)
        return _canon_block(orig, lambda v: v) == _canon_block(reloc, resolve_reloc)
    except _NotApplicable:
        return False


def _effects_image(effects) -> tuple | None:
    """The IR image of an effect program, in ``_canon_block``'s canonical form,
    or None when the program uses a form this translation does not cover
    (memory operands: those go to the SMT path).

    Each effect becomes the IR statements that mean exactly what effects.py
    says it means: Push(v) is ``t=GET(rsp); t'=Sub64(t,8); PUT(rsp)=t';
    STle(t')=v``; AddRsp(d) is ``PUT(rsp)=Add64(rsp,d)``; Let(n, Load(rsp))
    is ``LDle:I64(rsp)``; Jump(v) ends the block at v.  A register's value
    is re-used from the last statement that produced it, as VEX's lifter
    does, so that an identical image means an identical computation.
    """
    rsp = S.REG_BY_NAME["rsp"][0]
    out: list = []
    known: dict[int, tuple] = {}
    names: dict[str, tuple] = {}
    counter = [0]

    def wr(expr) -> tuple:
        out.append(("wr", counter[0], expr))
        counter[0] += 1
        return ("t", counter[0] - 1)

    def reg(name: str) -> tuple:
        off = S.REG_BY_NAME[name][0]
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
        orig = S.lift(raw, at, max_inst=1)
        if orig.size != len(raw):
            return False
        return _canon_block(orig, lambda v: v) == image
    except _NotApplicable:
        return False


# ---------------------------------------------------------------------------
# SMT path
# ---------------------------------------------------------------------------


def _merge(outs, f):
    result = f(outs[-1])
    for o in reversed(outs[:-1]):
        result = claripy.If(o.guard, f(o), result)
    return result


def _written_registers(outs) -> set[str]:
    names = set()
    for o in outs:
        for off in o.regs:
            info = S._REG_OF_BYTE.get(off)
            names.add(info[0] if info else f"guest_{off}")
    return names


def _flags(world, o, start_pc):
    vals = [S.register_value(world, o.regs, n, start_pc) for n in S.FLAG_THUNK]
    if vals[0].op != "BVV":
        raise S.Gap("symbolic flags-thunk operation")
    r = S._ccall.amd64g_calculate_rflags_all(S._CCallState(), *vals)
    return r & S.OSZACP


@dataclass(frozen=True)
class _Item:
    what: str
    orig: object
    reloc: object


def _items(world, orig_outs, reloc_outs, at, tramp, x):
    items = [_Item("rip", _merge(orig_outs, lambda o: o.target), _merge(reloc_outs, lambda o: o.target))]
    jk_id = {}

    def jk(o):
        k = o.jumpkind if o.jumpkind not in S.NORMAL_JUMPKINDS else "Ijk_Boring"
        return claripy.BVV(jk_id.setdefault(k, len(jk_id)), 8)

    items.append(_Item("event", _merge(orig_outs, jk), _merge(reloc_outs, jk)))
    names = _written_registers(orig_outs) | _written_registers(reloc_outs)
    if names & set(S.FLAG_THUNK):
        items.append(_Item("rflags", _merge(orig_outs, lambda o: _flags(world, o, at)),
                           _merge(reloc_outs, lambda o: _flags(world, o, tramp))))
    for name in sorted(names - set(S.FLAG_THUNK) - S.VEX_BOOKKEEPING - {"rip"}):
        if name.startswith("guest_"):
            raise S.Gap(f"a write to unnamed guest state at offset {name[6:]}")
        items.append(_Item(name, _merge(orig_outs, lambda o: S.register_value(world, o.regs, name, at)),
                           _merge(reloc_outs, lambda o: S.register_value(world, o.regs, name, tramp))))
    if any(o.writes for o in orig_outs) or any(o.writes for o in reloc_outs):
        items.append(_Item("memory", _merge(orig_outs, lambda o: S.read_memory_byte(world, o.writes, x)),
                           _merge(reloc_outs, lambda o: S.read_memory_byte(world, o.writes, x))))
    return items


def _visible_reads(world, outs):
    """(guard, address, size) of every read outside tracer memory, in program order per way out.

    A read's guard is the path condition when it happened; it is conjoined
    with the way out's guard so that reads on diverging paths stay apart."""
    reads = []
    for o in outs:
        for r in o.reads:
            if r.address.op == "BVV" and world.in_tracer(r.address.args[0]):
                continue
            reads.append((claripy.And(o.guard, r.guard), r.address, r.size))
    return reads


def _read_conditions(world, orig_outs, reloc_outs):
    """Conditions under which the two sides' memory reads differ (obligation 3)."""
    ro, rr = _visible_reads(world, orig_outs), _visible_reads(world, reloc_outs)
    conds = []
    for i in range(max(len(ro), len(rr))):
        if i >= len(ro):
            conds.append(rr[i][0])
            continue
        if i >= len(rr):
            conds.append(ro[i][0])
            continue
        (go, ao, so), (gr, ar, sr) = ro[i], rr[i]
        if so != sr:
            conds.append(claripy.Or(go, gr))
            continue
        conds.append(claripy.Or(go != gr, claripy.And(go, ao != ar)))
    return conds


def _not_tracer(world, x):
    return [claripy.Or(claripy.ULT(x, lo), claripy.UGE(x, lo + n)) if lo + n <= MASK64 else claripy.ULT(x, lo)
            for lo, n in world.tracer_ranges]


def _solve(world, items, read_conds, x, timeout_ms, extra=()):
    """None if the negated obligation is unsatisfiable (a proof); else a solver holding a model.

    Two stages, so that a counterexample shows a difference in outputs
    whenever one exists (those replay on unicorn); only if the outputs can
    never differ is a difference in the memory reads alone looked for."""
    base = world.constraints() + _not_tracer(world, x) + list(extra)
    for stage in ([it.orig != it.reloc for it in items], read_conds):
        if not stage:
            continue
        solver = claripy.Solver(timeout=timeout_ms)
        for c in base:
            solver.add(c)
        solver.add(claripy.Or(*stage))
        if solver.satisfiable():
            return solver
    return None


def _bits(solver, e) -> int:
    return solver.eval(e, 1)[0]


_OUT_NAMES = {"fs": "fs_base", "gs": "gs_base"}


def _model_state(world: S.World, solver):
    regs = []
    for name, sym in sorted(world.reg_syms.items()):
        regs.append((_OUT_NAMES.get(name, name), _bits(solver, sym)))
    rflags = (_bits(solver, world.rflags) & S.OSZACP) | (_bits(solver, world.df) << 10) | 0x2
    regs.append(("rflags", rflags))
    mem = {}
    for addr, byte in world.mem_syms.values():
        a = _bits(solver, addr)
        mem[a] = _bits(solver, byte)
    return tuple(regs), tuple(sorted(mem.items()))


def _counterexample(world, solver, items, read_conds, x, decoded, tramp, reloc_hex, effects) -> Counterexample:
    regs, mem = _model_state(world, solver)
    diffs = []
    for it in items:
        o, r = _bits(solver, it.orig), _bits(solver, it.reloc)
        if o != r:
            what = f"mem[{_bits(solver, x):#x}]" if it.what == "memory" else it.what
            diffs.append(Difference(what, hex(o), hex(r)))
    if not diffs and read_conds:
        diffs.append(Difference("reads", "the original's memory reads", "different reads"))
    return Counterexample(regs, mem, tuple(diffs), decoded.raw.hex(), decoded.address, tramp, reloc_hex,
                          json.dumps([effect_json(e) for e in effects], separators=(",", ":")) if effects else "")


def _replay(cex: Counterexample, decoded: Instruction, reloc: bytes | None, effects, tramp, tracer_ranges):
    """Run both sides concretely on unicorn from the counterexample's inputs.

    Returns (confirmed, note): confirmed only by a conclusive difference
    (``replay.Replay.differ``), never by a replay limit."""
    from . import replay as R

    state = R.state_from_counterexample(cex)
    rep = R.replay(decoded.raw, decoded.address, tramp, state, reloc=reloc if not effects else None,
                   effects=tuple(effects) if effects else None, tracer_memory=tracer_ranges)
    if not rep.replayable:
        return False, f"not replayable: {rep.limit}"
    note = ", ".join(f"{d.what}: {d.original} vs {d.relocated}" for d in rep.differences[:4])
    return rep.differ, note or "unicorn saw no difference"


# ---------------------------------------------------------------------------
# Atomicity
# ---------------------------------------------------------------------------


def _atomic(insn: Instruction) -> bool:
    return insn.lock or (insn.opname == "xchg" and insn.memory is not None)


def _relocated_instructions(code: bytes, tramp: int):
    from .decoders import decode

    off, out = 0, []
    while off < len(code):
        d = decode(code[off:], tramp + off)
        if not isinstance(d, Instruction):
            off += max(1, d.length)
            continue
        out.append(d)
        off += d.length
        if d.raw[:6] == b"\xff\x25\x00\x00\x00\x00":
            off += 8
    return out


def _atomicity(decoded: Instruction, code: bytes | None, tramp: int, tracer_ranges) -> str | None:
    """None if the obligation holds, else the refutation's reason."""
    want = _atomic(decoded)
    got = 0
    if not want and (code is None or not (b"\xf0" in code or b"\x86" in code or b"\x87" in code)):
        return None  # no LOCK prefix and no xchg opcode byte anywhere: nothing locked on either side
    if code is not None:
        for ins in _relocated_instructions(code, tramp):
            if ins.memory is None or not _atomic(ins):
                continue
            t = ins.rip_target
            if t is not None and any(lo <= t < lo + n for lo, n in tracer_ranges):
                continue
            got += 1
    if want and got == 0:
        return "atomicity: the original's memory operation is LOCKed, the relocation's is not (LOCK dropped)"
    if not want and got:
        return "atomicity: the relocation performs a LOCKed memory operation the original does not (LOCK added)"
    if got > 1:
        return "atomicity: the relocation splits the original's locked operation into several"
    return None


# ---------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------


def _byte_identical_copy(decoded: Instruction, code: bytes | None) -> bool:
    if code is None or code[:decoded.length] != decoded.raw:
        return False
    return classify(decoded).strategy == "copy"


def _jumps_back(decoded: Instruction, code: bytes, tramp: int) -> bool:
    n = decoded.length
    if len(code) <= n:
        return False
    try:
        return _pure_jump_target(code, tramp, tramp + n) == decoded.end
    except (_NotApplicable, S.Gap):
        return False


def _gap_result(decoded: Instruction, code: bytes | None, tramp: int, reason: str, t0: float) -> ProofResult:
    if _byte_identical_copy(decoded, code) and _jumps_back(decoded, code, tramp):
        return ProofResult(Verdict.OPAQUE, f"byte-identical copy, not proved: {reason}", "copy-check",
                           seconds=time.perf_counter() - t0)
    return ProofResult(Verdict.UNKNOWN, reason, "smt", seconds=time.perf_counter() - t0)


def _check(decoded: Instruction, code: bytes | None, effects: tuple[Effect, ...], tramp: int,
           tracer_ranges, timeout_ms: int) -> ProofResult:
    t0 = time.perf_counter()
    lock = _atomicity(decoded, code, tramp, tracer_ranges)
    if lock is not None:
        cex = Counterexample((), (), (Difference("lock", "locked" if _atomic(decoded) else "unlocked",
                                                 "unlocked" if _atomic(decoded) else "locked"),),
                             decoded.raw.hex(), decoded.address, tramp, code.hex() if code else "",
                             replayed=None, replay_note="atomicity is not observable in a sequential replay")
        return ProofResult(Verdict.REFUTED, lock, "atomicity", cex, time.perf_counter() - t0)
    opaque = _opaque_lift_reason(decoded)
    if opaque is not None:
        return _gap_result(decoded, code, tramp, opaque, t0)
    try:
        if code is None and fast_path_effects(decoded.raw, decoded.address, effects):
            return ProofResult(Verdict.PROVED, "the original's IR is the effect program's IR image",
                               "fast-path", seconds=time.perf_counter() - t0)
    except S.Gap as gap:
        return _gap_result(decoded, code, tramp, gap.reason, t0)
    if code is not None:
        try:
            if fast_path(decoded.raw, decoded.address, code, tramp):
                return ProofResult(Verdict.PROVED, "the relocated IR is the original's up to A <-> T",
                                   "fast-path", seconds=time.perf_counter() - t0)
        except S.Gap as gap:
            return _gap_result(decoded, code, tramp, gap.reason, t0)
    tracer_bytes = {}
    if code is not None:
        tracer_bytes = {tramp + k: b for k, b in enumerate(code)}
    world = S.World(tracer_bytes, tracer_ranges)
    try:
        orig = S.execute_original(world, decoded.raw, decoded.address)
        if code is not None:
            reloc = S.execute_relocated(world, code, tramp, decoded.address)
        else:
            reloc = S.execute_effects(world, effects, decoded.address, tramp)
        x = claripy.BVS("x", 64, explicit_name=True)
        items = _items(world, orig, reloc, decoded.address, tramp, x)
        read_conds = _read_conditions(world, orig, reloc)
        solver = _solve(world, items, read_conds, x, timeout_ms)
    except S.Gap as gap:
        return _gap_result(decoded, code, tramp, gap.reason, t0)
    except claripy.errors.ClaripyError as exc:
        return ProofResult(Verdict.UNKNOWN, f"solver: {type(exc).__name__}: {str(exc)[:120]}", "smt",
                           seconds=time.perf_counter() - t0)
    if solver is None:
        return ProofResult(Verdict.PROVED, "z3: the negated obligation is unsatisfiable", "smt",
                           seconds=time.perf_counter() - t0)
    try:
        cex = _counterexample(world, solver, items, read_conds, x, decoded, tramp, code.hex() if code else "", effects)
    except claripy.errors.ClaripyError as exc:
        return ProofResult(Verdict.UNKNOWN, f"solver: {type(exc).__name__} while extracting a model", "smt",
                           seconds=time.perf_counter() - t0)
    confirmed, note = _replay(cex, decoded, code, effects, tramp, tracer_ranges)
    if not confirmed and note.startswith("not replayable") and "rcx" in world.reg_syms:
        # A counter the solver chose too large to replay (rep, loop): ask for a small one.
        small = _solve(world, items, read_conds, x, timeout_ms, (claripy.ULE(world.reg_syms["rcx"], 8),))
        if small is not None:
            solver = small
            cex = _counterexample(world, solver, items, read_conds, x, decoded, tramp, code.hex() if code else "",
                                  effects)
            confirmed, note = _replay(cex, decoded, code, effects, tramp, tracer_ranges)
    cex = Counterexample(cex.registers, cex.memory, cex.differences, cex.orig_hex, cex.at, cex.tramp,
                         cex.reloc_hex, cex.effects_json, confirmed, note)
    if world.uf_results and not confirmed:
        return ProofResult(Verdict.UNKNOWN, "counterexample depends on an uninterpreted helper and did not replay",
                           "smt", cex, time.perf_counter() - t0)
    if not confirmed:
        return ProofResult(Verdict.UNKNOWN, f"z3 found a counterexample that unicorn did not confirm ({note})",
                           "smt", cex, time.perf_counter() - t0)
    what = ", ".join(d.what for d in cex.differences) or "reads"
    return ProofResult(Verdict.REFUTED, f"differs in {what}", "smt", cex, time.perf_counter() - t0)


def prove_plan(decoded: Decoded, plan: Plan, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> ProofResult:
    """The verdict for one of our own plans."""
    if plan.kind is PlanKind.REJECT or not isinstance(decoded, Instruction):
        return ProofResult(Verdict.REJECTED, plan.reason, "policy")
    if plan.kind is PlanKind.EMULATE:
        return _check(decoded, None, plan.effects, plan.tramp, (), int(timeout_ms))
    return _check(decoded, plan.trampoline, (), plan.tramp, plan.tracer_memory, int(timeout_ms))


def prove_relocation(decoded: Decoded, reloc: bytes, tramp: int, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                     tracer_memory: tuple[tuple[int, int], ...] = ()) -> ProofResult:
    """The verdict for relocated bytes made by any tool, run from ``tramp``.

    Tracer memory is the relocated bytes themselves, plus ``tracer_memory``:
    (address, size) ranges the tool keeps its own data in (save slots)."""
    if not isinstance(decoded, Instruction):
        return ProofResult(Verdict.UNKNOWN, f"the original does not decode: {decoded.reason}")
    ranges = ((tramp, len(reloc)),) + tuple(tracer_memory)
    return _check(decoded, bytes(reloc), (), tramp, ranges, int(timeout_ms))


def prove_effects(decoded: Decoded, effects: tuple[Effect, ...], tramp: int,
                  timeout_ms: int = DEFAULT_TIMEOUT_MS) -> ProofResult:
    """The verdict for an emulation program made by any tool."""
    if not isinstance(decoded, Instruction):
        return ProofResult(Verdict.UNKNOWN, f"the original does not decode: {decoded.reason}")
    return _check(decoded, None, tuple(effects), tramp, (), int(timeout_ms))


# ---------------------------------------------------------------------------
# The proof cache key
# ---------------------------------------------------------------------------

_VERSIONS_TAG: bytes | None = None


def _versions_tag() -> bytes:
    global _VERSIONS_TAG
    if _VERSIONS_TAG is None:
        import hashlib

        import angr
        import claripy
        import z3

        from . import __version__
        from .decoders import decoder_versions

        text = repr((__version__, sorted(decoder_versions().items()), pyvex.__version__, angr.__version__,
                     claripy.__version__, z3.get_version_string()))
        _VERSIONS_TAG = hashlib.sha256(text.encode()).digest()[:8]
    return _VERSIONS_TAG


class PcField(NamedTuple):
    offset: int
    size: int
    value: int  # the address the field denotes
    data: bool = False  # a RIP-relative operand (addresses data), not a control-flow target


def pc_fields(code: bytes, base: int) -> list[PcField] | None:
    """Every field of ``code`` (decoded at ``base``) whose value is an address:
    (offset, size, the address it denotes).  A RIP-relative displacement
    denotes next-rip + disp; a relative branch, its target; the qword after
    ``jmp *0(%rip)``, itself; a movabs immediate (a scratch plan's A+len),
    itself.  None if the bytes do not decode."""
    import iced_x86

    dec = iced_x86.Decoder(64, code, ip=base)
    fields = []
    skip_to = 0
    for ins in dec:
        off = ins.ip - base
        if off < skip_to:
            continue
        if ins.is_invalid:
            return None
        co = dec.get_constant_offsets(ins)
        if ins.is_ip_rel_memory_operand:
            fields.append(PcField(off + co.displacement_offset, co.displacement_size, ins.ip_rel_memory_address,
                                  True))
        if ins.flow_control in (1, 3, 5, 8) and ins.near_branch_target and co.has_immediate:
            fields.append(PcField(off + co.immediate_offset, co.immediate_size, ins.near_branch_target & MASK64))
        if ins.code == iced_x86.Code.MOV_R64_IMM64:
            fields.append(PcField(off + co.immediate_offset, 8, ins.immediate64))
        if code[off:off + 6] == b"\xff\x25\x00\x00\x00\x00":
            q = off + 6
            if q + 8 > len(code):
                return None
            fields.append(PcField(q, 8, int.from_bytes(code[q:q + 8], "little")))
            skip_to = q + 8
            dec.position = skip_to
            dec.ip = base + skip_to
    return fields


def _role_of(value: int, data: bool, name: str) -> str:
    """A role, with the address's alignment (mod 64) when it addresses data:
    VEX decides at lift time whether an aligned access (movdqa, cmpxchg16b)
    faults, from the constant address itself (found by tests/test_cache.py)."""
    return f"{name}@{value & 63}" if data else name


def _shape(code: bytes, fields) -> bytes:
    b = bytearray(code)
    for f in fields:
        b[f.offset:f.offset + f.size] = bytes(f.size)
    return bytes(b)


def cache_key(decoded: Decoded, plan: Plan) -> bytes | None:
    """The key under which a verdict for ``plan`` may be reused, or None.

    What a verdict depends on: the bytes, the plan, and how the addresses in
    them relate to A and T; plus the versions of every tool that produced it.

    1. A byte-identical copy of a position-independent instruction (policy
       strategy ``copy``): keyed by its bytes and the form of the jump back
       (rel32 or absolute).  The instruction has no RIP-relative operand and
       no relative branch, so A and T enter its VEX IR only as PC constants
       (IMark, rip writes, a rep loop's jump to itself), which no verdict
       depends on: the fast path drops or maps exactly those (A <-> T), the
       opaque test reads only the bytes, and the SMT obligation is relative.

    2. Any other plan: keyed by its *shape*: the original's bytes and the
       trampoline's bytes (or the effect program) with every address-valued
       field zeroed (``pc_fields``), and the *role* of each such field's
       value: the original's own target, A+len, or a trampoline offset; a
       data address also keeps its alignment mod 64 (``_role_of``).
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
    tag = _versions_tag()
    if plan.kind is PlanKind.COPY and classify(decoded).strategy == "copy":
        form = b"r" if len(plan.trampoline) == decoded.length + 5 else b"a"
        return b"copy|" + tag + form + decoded.raw
    a, n, t = decoded.address, decoded.length, plan.tramp
    ofields = pc_fields(decoded.raw, a)
    if ofields is None:
        return None
    roles = {(a + n) & MASK64: "next", a: "self"}
    for k, f in enumerate(ofields):
        if f.value in roles:
            return None
        roles[f.value] = _role_of(f.value, f.data, f"f{k}")
    if plan.kind is PlanKind.EMULATE:
        body = repr(tuple(_effect_roles(e, roles) for e in plan.effects))
        if "?" in body:
            return None
        return b"emu|" + tag + _shape(decoded.raw, ofields) + b"|" + body.encode()
    tfields = pc_fields(plan.trampoline, t)
    if tfields is None:
        return None
    sig = []
    for f in tfields:
        v = f.value
        internal = 0 <= (v - t) & MASK64 < len(plan.trampoline) + 16
        if internal and v in roles:
            return None  # ambiguous: a trampoline address that is also one of the original's
        r = _role_of(v, f.data, f"t+{(v - t) & MASK64}") if internal else roles.get(v)
        if r is None:
            return None
        sig.append(r)
    return (b"rel|" + tag + plan.rule.encode() + b"|" + _shape(decoded.raw, ofields) + b"|"
            + _shape(plan.trampoline, tfields) + b"|" + ",".join(sig).encode())


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
