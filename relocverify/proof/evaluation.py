"""The proof's semantics evaluated on one concrete state: what ``proof.semantics`` says the code does.

``evaluate(code, address, states, ...)`` runs ``semantics.execute_original``
(one instruction) or ``execute_relocated`` (a trampoline) symbolically once,
converts every output to z3, and for each concrete state substitutes the
inputs and simplifies: GPRs, RFLAGS (VEX's lazy thunk through angr's flag
helpers), DF, AC, fs/gs bases, MXCSR (VEX keeps only its rounding control),
ymm0-15 and the zmm upper bits (``semantics.ZMM_HI``), the next rip, the
bytes written, and the first fault.  Memory bytes come from the state; a
byte the state does not name reads as ``code`` where the code lies, else 0
(as ``concrete.cpu`` maps them).  An output the semantics leaves
unspecified for that state (a NaN's bits, which z3's FP theory does not fix)
evaluates to None.

This is how the trust base is checked against the CPU (``selftest``): the
same expressions the proof compares, not a second implementation of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import claripy
import z3

from ..concrete.outcome import MachineState, Outcome
from ..x86.registers import GPR64, MASK64
from . import lift as L
from . import semantics as S
from .smt import rflags_of

_CONVERT = claripy.backends.z3.convert
RC_SHIFT = 13


class Unevaluable(Exception):
    """The semantics reads state this evaluator cannot set from a CPU state (x87 registers, VEX-internal)."""


#: VEX guest state that is bookkeeping, pinned to 0.
_ZERO = frozenset({"emnote", "cmstart", "cmlen", "nraddr", "ip_at_syscall"})


@dataclass
class _Compiled:
    outs: list
    world: S.World
    start: int
    regs: list  # per outcome: {name: z3 expr}
    guards: list
    targets: list
    faults: list
    writes: list  # per outcome: [(address z3, byte z3)]
    packed: list = None  # per outcome: (one z3 concatenation of every output, [(key, width)])


def _packed(regs: dict, target, fault, writes) -> tuple:
    """Every output of one way out as one bit-vector, so that a state costs one substitution."""
    parts, layout = [], []
    for key, e in list(regs.items()) + [("target", target), ("fault", fault)] + \
            [(("wa", k), a) for k, (a, _) in enumerate(writes)] + [(("wb", k), b) for k, (_, b) in enumerate(writes)]:
        parts.append(e)
        layout.append((key, e.size()))
    return (z3.Concat(*parts) if len(parts) > 1 else parts[0]), layout


def _fast_values(packed: tuple, frm, to) -> dict | None:
    expr, layout = packed
    v = z3.simplify(z3.substitute(expr, *zip(frm, to))) if frm else z3.simplify(expr)
    if not z3.is_bv_value(v):
        return None
    n = v.as_long()
    out, shift = {}, sum(w for _, w in layout)
    for key, width in layout:
        shift -= width
        out[key] = (n >> shift) & ((1 << width) - 1)
    return out


def _compile(world: S.World, outs: list, start: int) -> _Compiled:
    regs, guards, targets, faults, writes = [], [], [], [], []
    for o in outs:
        r = {name: S.register_value(world, o.regs, name, start) for name in GPR64}
        for i in range(16):
            r[f"ymm{i}"] = S.register_value(world, o.regs, f"ymm{i}", start)
            r[f"zmmhi{i}"] = S.register_value(world, o.regs, f"zmmhi{i}", start)
        thunk = [S.register_value(world, o.regs, n, start) for n in L.FLAG_THUNK]
        if thunk[0].op == "BVV":
            r["flags"] = rflags_of(world, o, start)
        else:  # a shift by cl keeps the old thunk when the count is 0: evaluated per state (``_flags_of``)
            r.update({f"thunk{k}": t for k, t in enumerate(thunk)})
        r["d"] = S.register_value(world, o.regs, "d", start)
        r["ac"] = S.register_value(world, o.regs, "ac", start)
        r["sseround"] = S.register_value(world, o.regs, "sseround", start)
        r["fs"] = S.register_value(world, o.regs, "fs", start)
        r["gs"] = S.register_value(world, o.regs, "gs", start)
        regs.append({k: _CONVERT(v) for k, v in r.items()})
        guards.append(_CONVERT(o.guard))
        targets.append(_CONVERT(o.target))
        faults.append(_CONVERT(o.fault))
        writes.append([(_CONVERT(a), _CONVERT(S.read_memory_byte(world, o.writes, a))) for a, _ in o.writes])
    packed = [_packed(r, t, f, w) for r, t, f, w in zip(regs, targets, faults, writes)]
    return _Compiled(outs, world, start, regs, guards, targets, faults, writes, packed)


def _value(e, subs):
    v = z3.simplify(z3.substitute(e, *subs)) if subs else z3.simplify(e)
    if z3.is_bv_value(v):
        return v.as_long()
    if z3.is_true(v):
        return 1
    if z3.is_false(v):
        return 0
    return None


def _inputs(world: S.World, state: MachineState) -> list:
    regs = state.registers
    subs = []
    for name, sym in world.reg_syms.items():
        zsym = _CONVERT(sym)
        if name in GPR64:
            v = regs.get(name, 0)
        elif name.startswith("ymm") and name[3:].isdigit():
            v = _vector(regs, int(name[3:])) & ((1 << 256) - 1)
        elif name.startswith("zmmhi"):
            v = _vector(regs, int(name[5:])) >> 256
        elif name == "sseround":
            v = (regs.get("mxcsr", 0x1F80) >> RC_SHIFT) & 3
        elif name == "fs":
            v = regs.get("fs_base", 0)
        elif name == "gs":
            v = regs.get("gs_base", 0)
        elif name in _ZERO:
            v = 0
        else:
            raise Unevaluable(f"the semantics reads VEX state {name!r}, which no CPU state here sets")
        subs.append((zsym, z3.BitVecVal(v & ((1 << sym.size()) - 1), sym.size())))
    rflags = regs.get("rflags", 2)
    subs.append((_CONVERT(world.rflags), z3.BitVecVal(rflags, 64)))
    subs.append((_CONVERT(world.df), z3.BitVecVal((rflags >> 10) & 1, 1)))
    subs.append((_CONVERT(world.ac), z3.BitVecVal((rflags >> 18) & 1, 1)))
    subs.append((_CONVERT(world.idf), z3.BitVecVal((rflags >> 21) & 1, 1)))
    subs.append((_CONVERT(world.mm), z3.BitVecVal((regs.get("mxcsr", 0) >> 17) & 1, 1)))
    return subs


def _vector(regs: dict, i: int) -> int:
    for name, bits in ((f"zmm{i}", 512), (f"ymm{i}", 256), (f"xmm{i}", 128)):
        if name in regs:
            return regs[name] & ((1 << bits) - 1)
    return 0


def _memory_inputs(world: S.World, subs: list, memory) -> list:
    """Pin each initial memory byte the semantics read to the state's byte at its address (addresses may
    depend on other bytes read: resolved in rounds)."""
    pending = list(world.mem_syms.values())
    for _ in range(8):
        left = []
        for addr, byte in pending:
            a = _value(_CONVERT(addr), subs)
            if a is None:
                left.append((addr, byte))
                continue
            subs.append((_CONVERT(byte), z3.BitVecVal(memory(a & MASK64), 8)))
        if not left:
            return subs
        pending = left
    raise Unevaluable("a memory address depends on itself")


def evaluate(code: bytes, address: int, states: list[MachineState], *, relocated: bool = False,
             data=None) -> list[Outcome]:
    """One ``Outcome`` per state: the semantics of ``code`` at ``address`` (an original instruction, or
    with ``relocated`` a trampoline run until it leaves).  ``registers`` holds the GPRs, ``rflags``
    (OSZACP, DF, AC, bit 1), ``fs_base``, ``gs_base``, ``mxcsr`` and ``zmm0``-``zmm15``; a value the
    semantics leaves unspecified is None.  ``fault`` is a FAULT_NAMES name or None.  Raises ``L.Gap``
    (no semantics) or ``Unevaluable``."""
    world = S.World()
    outs = (S.execute_relocated(world, code, address, address) if relocated
            else S.execute_original(world, code, address))
    compiled = _compile(world, outs, address)
    results = []
    for state in states:
        mem = state.memory

        def memory(a, mem=mem):
            if a in mem:
                return mem[a] & 0xFF
            if address <= a < address + len(code):
                return code[a - address]
            return 0

        subs = _memory_inputs(world, _inputs(world, state), memory)
        results.append(_one(compiled, subs, state, memory))
    return results


def _one(c: _Compiled, subs: list, state: MachineState, memory) -> Outcome:
    taken = [i for i, g in enumerate(c.guards) if _value(g, subs) == 1] if len(c.guards) > 1 else [0]
    if len(taken) != 1:
        raise Unevaluable(f"{len(taken)} ways out are taken on one state")
    i = taken[0]
    fast = _fast_values(c.packed[i], [a for a, _ in subs], [b for _, b in subs])
    if fast is not None:
        return _assemble(c, i, fast, state)
    r = {name: _value(e, subs) for name, e in c.regs[i].items()}
    regs = {name: r[name] for name in GPR64}
    if "flags" not in r:
        r["flags"] = None if any(r[f"thunk{k}"] is None for k in range(4)) else _flags_of(r)
    flags, d, ac = r["flags"], r["d"], r["ac"]
    regs["rflags"] = None if None in (flags, d, ac) else (flags | 2 | (0x400 if d == MASK64 else 0)
                                                          | ((ac & 1) << 18))
    regs["fs_base"], regs["gs_base"] = r["fs"], r["gs"]
    mxcsr = state.registers.get("mxcsr", 0x1F80)
    regs["mxcsr"] = None if r["sseround"] is None else (mxcsr & ~(3 << RC_SHIFT)) | ((r["sseround"] & 3) << RC_SHIFT)
    for k in range(16):
        low, high = r[f"ymm{k}"], r[f"zmmhi{k}"]
        regs[f"zmm{k}"] = None if low is None or high is None else low | (high << 256)
    writes = {}
    for a, b in c.writes[i]:
        av = _value(a, subs)
        if av is None:
            raise Unevaluable("a store address the semantics leaves unspecified")
        writes[av & MASK64] = _value(b, subs)
    fault = _value(c.faults[i], subs)
    jumpkind = c.outs[i].jumpkind
    name = L.FAULT_NAMES.get(fault) if fault else None
    if name is None and jumpkind.startswith("Ijk_Sig"):
        name = jumpkind  # a fault VEX models by its exit kind; Yield (pause) and cache hints are not faults
    return Outcome(regs, _value(c.targets[i], subs), writes, name)


def _flags_of(v: dict) -> int:
    """RFLAGS' OSZACP from a flags thunk whose operation was symbolic until the state fixed it."""
    if "flags" in v:
        return v["flags"]
    args = [claripy.BVV(v[f"thunk{k}"], 64) for k in range(4)]
    r = S.rflags_all(*args)
    return claripy.backends.concrete.convert(r).value & L.OSZACP


def _assemble(c: _Compiled, i: int, v: dict, state: MachineState) -> Outcome:
    regs = {name: v[name] for name in GPR64}
    v = dict(v)
    v["flags"] = _flags_of(v)
    regs["rflags"] = v["flags"] | 2 | (0x400 if v["d"] == MASK64 else 0) | ((v["ac"] & 1) << 18)
    regs["fs_base"], regs["gs_base"] = v["fs"], v["gs"]
    mxcsr = state.registers.get("mxcsr", 0x1F80)
    regs["mxcsr"] = (mxcsr & ~(3 << RC_SHIFT)) | ((v["sseround"] & 3) << RC_SHIFT)
    for k in range(16):
        regs[f"zmm{k}"] = v[f"ymm{k}"] | (v[f"zmmhi{k}"] << 256)
    writes = {}
    for k in range(len(c.writes[i])):
        writes[v[("wa", k)]] = v[("wb", k)]
    fault = v["fault"]
    name = L.FAULT_NAMES.get(fault) if fault else None
    jumpkind = c.outs[i].jumpkind
    if name is None and jumpkind.startswith("Ijk_Sig"):
        name = jumpkind
    return Outcome(regs, v["target"], writes, name)
