"""The SMT obligation: both sides run symbolically over one shared initial
state (``semantics.World``), their outputs compared item by item, the
negation handed to z3; a model becomes a counterexample, confirmed only by a
concrete replay on unicorn (``relocverify.concrete.replay``)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import claripy

from ..concrete import replay as R
from ..concrete.outcome import Difference
from ..plan.effects import effect_json
from ..x86.instruction import Instruction
from ..x86.registers import MASK64
from . import semantics as S
from .verdict import Counterexample


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


def items(world, orig_outs, reloc_outs, at, tramp, x):
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


def read_conditions(world, orig_outs, reloc_outs):
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


def write_conditions(world, orig_outs, reloc_outs):
    """Conditions under which the two sides' sequences of memory writes differ (address and value
    of each byte written, in program order, tracer memory excepted): a store the original does
    not make is a difference even when it writes the value already there (another CPU's update
    in between would be lost; a read-only page would fault).  And a fence one side has and the
    other has not."""
    def visible(outs):
        out = []
        for o in outs:
            for addr, byte in o.writes:
                if addr.op == "BVV" and world.in_tracer(addr.args[0]):
                    continue
                out.append((o.guard, addr, byte))
        return out

    wo, wr = visible(orig_outs), visible(reloc_outs)
    conds = []
    for i in range(max(len(wo), len(wr))):
        if i >= len(wo):
            conds.append(wr[i][0])
        elif i >= len(wr):
            conds.append(wo[i][0])
        else:
            (go, ao, vo), (gr, ar, vr) = wo[i], wr[i]
            conds.append(claripy.Or(go != gr, claripy.And(go, claripy.Or(ao != ar, vo != vr))))
    fo = _merge(orig_outs, lambda o: claripy.BVV(o.fences, 16))
    fr = _merge(reloc_outs, lambda o: claripy.BVV(o.fences, 16))
    if not (fo.op == "BVV" and fr.op == "BVV" and fo.args[0] == fr.args[0]):
        conds.append(fo != fr)
    return conds


def private_tracer_memory(world, orig_outs) -> list:
    """The obligation's precondition: no access of the original, whatever its segment or base,
    touches tracer memory (the trampoline, the save slots: the tracer's private memory)."""
    if not world.tracer_ranges:
        return []
    cs = []
    for o in orig_outs:
        accesses = [(r.guard, r.address, r.size) for r in o.reads] + [(o.guard, a, 1) for a, _ in o.writes]
        for guard, addr, size in accesses:
            for lo, n in world.tracer_ranges:
                end = addr + (size - 1) if size > 1 else addr
                inside = claripy.And(claripy.UGE(end, lo), claripy.ULT(addr, (lo + n) & MASK64)) \
                    if lo + n <= MASK64 else claripy.UGE(end, lo)
                cs.append(claripy.Or(claripy.Not(guard), claripy.Not(inside)))
    return cs


def clobbered_flags(world, orig_outs, at: int, unaffected: int, timeout_ms: int) -> int:
    """The flags (iced RflagsBits) the decoders say the original leaves alone but VEX may change."""
    if not unaffected:
        return 0
    after = _merge(orig_outs, lambda o: _flags(world, o, at))
    before = world.rflags & S.OSZACP
    bits = {1: 11, 2: 7, 4: 6, 8: 4, 16: 0, 32: 2}  # iced OF SF ZF AF CF PF -> RFLAGS bit
    clobbered = 0
    for iced_bit, bit in bits.items():
        if not unaffected & iced_bit:
            continue
        solver = claripy.Solver(timeout=timeout_ms)
        for c in world.constraints():
            solver.add(c)
        solver.add(after[bit] != before[bit])
        if solver.satisfiable():
            clobbered |= iced_bit
    return clobbered


def _not_tracer(world, x):
    return [claripy.Or(claripy.ULT(x, lo), claripy.UGE(x, lo + n)) if lo + n <= MASK64 else claripy.ULT(x, lo)
            for lo, n in world.tracer_ranges]


def solve(world, items, read_conds, x, timeout_ms, extra=(), precondition=()):
    """None if the negated obligation is unsatisfiable (a proof); else a solver holding a model.

    Two stages, so that a counterexample shows a difference in outputs
    whenever one exists (those replay on unicorn); only if the outputs can
    never differ is a difference in the memory reads alone looked for."""
    base = world.constraints() + _not_tracer(world, x) + list(extra) + list(precondition)
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


def counterexample(world, solver, items, read_conds, x, decoded, tramp, reloc_hex, effects) -> Counterexample:
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


def replay(cex: Counterexample, decoded: Instruction, reloc: bytes | None, effects, tramp, tracer_ranges):
    """Run both sides concretely on unicorn from the counterexample's inputs.

    Returns (confirmed, note): confirmed only by a conclusive difference
    (``replay.Replay.differ``), never by a replay limit."""
    state = cex.state()
    rep = R.replay(decoded.raw, decoded.address, tramp, state, reloc=reloc if not effects else None,
                   effects=tuple(effects) if effects else None, tracer_memory=tracer_ranges)
    if not rep.replayable:
        return False, f"not replayable: {rep.limit}"
    note = ", ".join(f"{d.what}: {d.original} vs {d.relocated}" for d in rep.differences[:4])
    return rep.differ, note or "unicorn saw no difference"

