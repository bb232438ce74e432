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
from . import lift as L
from . import semantics as S
from .reachable import reachable
from .solvers import timed_solver, unsatisfiable
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
            info = L.REG_OF_BYTE.get(off)
            names.add(info[0] if info else f"guest_{off}")
    return names


def rflags_of(world, o, start_pc):
    """RFLAGS OSZACP of one way out, from its flags thunk through angr's helper (Gap if the thunk is symbolic)."""
    vals = [S.register_value(world, o.regs, n, start_pc) for n in L.FLAG_THUNK]
    if vals[0].op != "BVV":
        raise L.Gap("symbolic flags-thunk operation")
    r = S.rflags_all(*vals)
    return r & L.OSZACP


@dataclass(frozen=True)
class Item:
    what: str
    orig: object
    reloc: object


def flag_item(what: str, conditions) -> Item:
    """An item that differs exactly when one of ``conditions`` holds (the original's side is 0)."""
    return Item(what, claripy.BVV(0, 1), claripy.If(claripy.Or(*conditions), claripy.BVV(1, 1), claripy.BVV(0, 1)))


def items(world, orig_outs, reloc_outs, at, tramp, x):
    """What the two sides must agree on: the fault (first exception vector, or none), and when the
    original completes, the next rip, the kind of exit, every register either side wrote (RFLAGS as
    flags) and every byte of memory (at ``x``).  When the original faults, only the fault is
    compared here: the registers at a fault are the tracer's to restore (it saved them), while
    memory events before it are compared in program order by ``event_conditions``."""
    completes = _merge(orig_outs, lambda o: o.fault) == 0
    items = [Item("rip", _merge(orig_outs, lambda o: o.target), _merge(reloc_outs, lambda o: o.target))]
    jk_id = {}

    def jk(o):
        k = o.jumpkind if o.jumpkind not in L.NORMAL_JUMPKINDS else "Ijk_Boring"
        return claripy.BVV(jk_id.setdefault(k, len(jk_id)), 8)

    items.append(Item("event", _merge(orig_outs, jk), _merge(reloc_outs, jk)))
    names = _written_registers(orig_outs) | _written_registers(reloc_outs)
    if names & set(L.FLAG_THUNK):
        items.append(Item("rflags", _merge(orig_outs, lambda o: rflags_of(world, o, at)),
                           _merge(reloc_outs, lambda o: rflags_of(world, o, tramp))))
    for name in sorted(names - set(L.FLAG_THUNK) - L.VEX_BOOKKEEPING - {"rip"}):
        if name.startswith("guest_"):
            raise L.Gap(f"a write to unnamed guest state at offset {name[6:]}")
        items.append(Item(name, _merge(orig_outs, lambda o: S.register_value(world, o.regs, name, at)),
                           _merge(reloc_outs, lambda o: S.register_value(world, o.regs, name, tramp))))
    if any(o.writes for o in orig_outs) or any(o.writes for o in reloc_outs):
        items.append(Item("memory", _merge(orig_outs, lambda o: S.read_memory_byte(world, o.writes, x)),
                           _merge(reloc_outs, lambda o: S.read_memory_byte(world, o.writes, x))))
    items = [Item(it.what, claripy.If(completes, it.orig, it.reloc), it.reloc) for it in items]
    items.insert(0, Item("fault", _merge(orig_outs, lambda o: o.fault), _merge(reloc_outs, lambda o: o.fault)))
    return items


def _visible_events(world, outs):
    """Every memory event outside tracer memory, in program order per way out, with its guard
    conjoined with the way out's guard so that events on diverging paths stay apart."""
    events = []
    for o in outs:
        for e in o.events:
            if e.kind in "RW" and e.address.op == "BVV" and world.in_tracer(e.address.args[0]):
                continue
            events.append((claripy.And(o.guard, e.guard), e))
    return events


def _event_difference(go, eo, gr, er):
    if eo.kind != er.kind or eo.size != er.size or eo.fence != er.fence:
        return claripy.Or(go, gr)
    same = [eo.address == er.address] if eo.kind in "RW" else []
    if eo.kind == "W":
        same.append(eo.value == er.value)
    return claripy.Or(go != gr, claripy.And(go, claripy.Not(claripy.And(*same)))) if same else go != gr


def event_conditions(world, orig_outs, reloc_outs):
    """Conditions under which the two sides' memory events differ (obligations 2 and 3): the reads
    (address and width), the writes (address, width and value: one 8-byte store is not two 4-byte
    ones, which a concurrent reader can see torn; a store the original does not make is a difference
    even when it writes the value already there, since another CPU's update in between would be lost
    and a read-only page would fault) and the fences (with their kind: an lfence is not an mfence),
    all in one program order, tracer memory excepted."""
    eo, er = _visible_events(world, orig_outs), _visible_events(world, reloc_outs)
    conds = []
    for i in range(max(len(eo), len(er))):
        if i >= len(eo):
            conds.append(er[i][0])
        elif i >= len(er):
            conds.append(eo[i][0])
        else:
            conds.append(_event_difference(eo[i][0], eo[i][1], er[i][0], er[i][1]))
    return [c for c in conds if not claripy.is_false(c)]


def code_spans(code: bytes, tramp: int) -> list[tuple[int, int]]:
    """The byte ranges of the relocation's reachable instructions (``proof.reachable``), merged: the bytes
    the checker lifts.  Save slots and the qwords of absolute jumps are data, read through the write log."""
    spans: list[tuple[int, int]] = []
    for address, raw in reachable(code, tramp).instructions:
        if spans and spans[-1][0] + spans[-1][1] >= address:
            lo, n = spans[-1]
            spans[-1] = (lo, max(n, address + len(raw) - lo))
        else:
            spans.append((address, len(raw)))
    return spans


def code_writes(world, reloc_outs, spans):
    """Conditions under which the relocation stores into the bytes of its own instructions (``code_spans``):
    the checker lifted the bytes as they were, the CPU would run the ones written."""
    conds = []
    for o in reloc_outs:
        for e in o.events:
            if e.kind != "W":
                continue
            last = e.address + (e.size - 1) if e.size > 1 else e.address
            for lo, n in spans:
                hit = claripy.And(claripy.UGE(last, lo), claripy.ULT(e.address, (lo + n) & MASK64))
                if not claripy.is_false(hit):
                    conds.append(claripy.And(o.guard, e.guard, hit))
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
    after = _merge(orig_outs, lambda o: rflags_of(world, o, at))
    before = world.rflags & L.OSZACP
    bits = {1: 11, 2: 7, 4: 6, 8: 4, 16: 0, 32: 2}  # iced OF SF ZF AF CF PF -> RFLAGS bit
    clobbered = 0
    for iced_bit, bit in bits.items():
        if not unaffected & iced_bit:
            continue
        differs = after[bit] != before[bit]
        if unsatisfiable(world.constraints() + [differs], timeout_ms):
            continue
        solver = timed_solver(timeout_ms)
        for c in world.constraints():
            solver.add(c)
        solver.add(differs)
        if solver.satisfiable():
            clobbered |= iced_bit
    return clobbered


def _not_tracer(world, x):
    return [claripy.Or(claripy.ULT(x, lo), claripy.UGE(x, lo + n)) if lo + n <= MASK64 else claripy.ULT(x, lo)
            for lo, n in world.tracer_ranges]


def first_satisfiable(world, conditions, timeout_ms, precondition=()):
    """The first of ``conditions`` ((condition, what it means), ...) some input satisfies, as (solver with a
    model, what it means), or None."""
    for condition, why in conditions:
        constraints = world.constraints() + list(precondition) + [condition]
        if unsatisfiable(constraints, timeout_ms):
            continue
        solver = timed_solver(timeout_ms)
        for c in constraints:
            solver.add(c)
        if solver.satisfiable():
            return solver, why
    return None


def solve(world, items, read_conds, x, timeout_ms, extra=(), precondition=()):
    """None if the negated obligation is unsatisfiable (a proof); else a solver holding a model.

    Two stages, so that a counterexample shows a difference in outputs
    whenever one exists (those replay on unicorn); only if the outputs can
    never differ is a difference in the memory reads alone looked for."""
    base = world.constraints() + _not_tracer(world, x) + list(extra) + list(precondition)
    for stage in ([it.orig != it.reloc for it in items], read_conds):
        if not stage:
            continue
        negated = claripy.Or(*stage)
        if unsatisfiable(base + [negated], timeout_ms):
            continue
        solver = timed_solver(timeout_ms)
        for c in base:
            solver.add(c)
        solver.add(negated)
        if solver.satisfiable():
            return solver
    return None


def _bits(solver, e) -> int:
    return solver.eval(e, 1)[0]


_OUT_NAMES = {"fs": "fs_base", "gs": "gs_base"}


def model_state(world: S.World, solver):
    regs = []
    for name, sym in sorted(world.reg_syms.items()):
        regs.append((_OUT_NAMES.get(name, name), _bits(solver, sym)))
    rflags = (_bits(solver, world.rflags) & L.OSZACP) | (_bits(solver, world.df) << 10) | 0x2
    regs.append(("rflags", rflags))
    mem = {}
    for addr, byte in world.mem_syms.values():
        a = _bits(solver, addr)
        mem[a] = _bits(solver, byte)
    return tuple(regs), tuple(sorted(mem.items()))


def counterexample(world, solver, items, read_conds, x, decoded, tramp, reloc_hex, effects) -> Counterexample:
    regs, mem = model_state(world, solver)
    diffs = []
    for it in items:
        o, r = _bits(solver, it.orig), _bits(solver, it.reloc)
        if o != r:
            what = f"mem[{_bits(solver, x):#x}]" if it.what == "memory" else it.what
            if it.what == "fault":
                diffs.append(Difference(what, L.FAULT_NAMES.get(o, "none"), L.FAULT_NAMES.get(r, "none")))
            else:
                diffs.append(Difference(what, hex(o), hex(r)))
    if not diffs and read_conds:
        diffs.append(Difference("memory events", "the original's reads, writes and fences",
                                "different ones (order, width, address, value or kind)"))
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



def stack_exposure(world, orig_outs, reloc_outs, at: int, tramp: int, red_zone: int, allowance: int,
                   stack_range: tuple[int, int]):
    """Rows interrupt-frame and signal-frame of ``machine_model``: conditions, each with what it means, under
    which an interrupt (at CPL 0, ``red_zone`` 0) or a signal (at CPL 3, ``red_zone`` 128) arriving at a
    boundary *inside* the relocation (after its first instruction started, before its last one ended)
    changes what it computes.  The handler's frame may overwrite every byte below ``rsp - red_zone`` there
    (its *exposed* bytes).  With offsets from the entry rsp (``d``: at the boundary, ``f``: the original's
    rsp at its end), some byte ``y``:

    * exposed at the boundary, at or above ``f`` (the original keeps it live at its end), not exposed on entry
      or written by the relocation before the boundary (below ``-red_zone`` an interrupt before the original
      could equally have written it), and written by no later store of the relocation: the interrupt's value
      survives where the original's does not;
    * exposed at the boundary, not exposed on entry (``y >= -red_zone``: below that, an interrupt before the
      original could equally have written it) or written by the relocation before the boundary, read later,
      and written by no store between the boundary and the read;
    * or ``d < min(0, f) - allowance``: the stack pointer leaves the stack the tracer's own trap frame used,
      or is not the stack at all: the frame itself would fault.

    Offsets are exact integers (66-bit), so no wrap-around of the address space makes or hides a case.  The
    original's stack is a stack: its rsp on entry and at its end lie in ``stack_range`` (the context's half
    of the canonical address space, a page from either end); the relocation's rsp is not assumed anything."""
    def z(v):  # addresses as exact integers: 66-bit two's complement holds every difference of two of them
        return v.zero_extend(2)

    entry = world.initial_register("rsp", tramp)
    final = _merge(orig_outs, lambda o: S.register_value(world, o.regs, "rsp", at))
    lo, hi = stack_range
    valid = claripy.And(claripy.UGE(entry, lo), claripy.ULT(entry, hi), claripy.UGE(final, lo), claripy.ULT(final, hi))
    rsp0 = z(entry)
    f = z(final) - rsp0
    zero = claripy.BVV(0, 66)
    floor = claripy.BVV(-red_zone & ((1 << 66) - 1), 66)  # the exposed top on entry, as an offset
    low = claripy.If(claripy.SLT(f, zero), f, zero) - allowance
    y = claripy.BVS("exposed_byte", 66, explicit_name=True)

    def covers(e):
        return claripy.And(e.guard, claripy.SLE(z(e.address) - rsp0, y), claripy.SLT(y, z(e.address) - rsp0 + e.size))

    def stores(events):
        """The stores of ``events`` outside tracer memory (the tracer's slots are no stack)."""
        return [e for e in events if e.kind == "W" and not (e.address.op == "BVV" and world.in_tracer(e.address.args[0]))]

    def unwritten(events):
        """``y`` is written by none of ``events``' stores."""
        return [claripy.Not(covers(e)) for e in stores(events)]

    def written(events):
        """``y`` is written by one of ``events``' stores."""
        return claripy.Or(claripy.false(), *(covers(e) for e in stores(events)))

    found = []
    for o in reloc_outs:
        for b in o.boundaries[1:]:
            d = z(b.rsp) - rsp0
            top = d - red_zone
            where = f"T+{b.address - tramp:#x}"
            after = o.events[b.before:]
            before = o.events[:b.before]
            meaningful = claripy.Or(claripy.SLE(floor, y), written(before))
            found.append((claripy.And(o.guard, claripy.SLE(f, y), claripy.SLT(y, top), meaningful, *unwritten(after)),
                          f"at the boundary before {where} stack the original keeps is exposed, and not written "
                          f"again"))
            found.append((claripy.And(o.guard, claripy.SLT(d, low)),
                          f"at the boundary before {where} rsp is not within the tracer's stack"))
            for k, e in enumerate(after):
                if e.kind != "R" or (e.address.op == "BVV" and world.in_tracer(e.address.args[0])):
                    continue
                da = z(e.address) - rsp0
                hit = claripy.And(meaningful, claripy.SLT(y, top), claripy.SLE(da, y), claripy.SLT(y, da + e.size),
                                  *unwritten(after[:k]))
                found.append((claripy.And(o.guard, e.guard, hit),
                              f"a read after the boundary before {where} reads stack exposed there"))
    return [(claripy.And(valid, c), why) for c, why in found if not claripy.is_false(c)]
