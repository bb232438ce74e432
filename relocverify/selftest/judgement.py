"""The CPU's judgement of a candidate: do the original and the relocation behave alike on this machine?

``judge(candidate, n, rng)`` draws ``n`` states (``concrete.states``: random
and edge registers, vectors with NaNs, x87 and MXCSR variations, every memory
access of the original placed in the arena), runs the original at ``at``
and the relocation at ``tramp`` on the CPU (``concrete.cpu``), and compares
everything the judge can see: the exit (the original's successor, under
A <-> T), the fault class, the 16 GPRs, RFLAGS (CF PF AF ZF SF OF DF AC),
fs/gs bases, MXCSR, zmm0-31, k0-7, the x87 control, status and tag words and
stack, and every byte written outside tracer memory; of the vector and mask
state, only what this CPU has under the feature mask (``cpu.state_names``,
``cpu.unseen``: without AVX-512, not zmm16-31, k0-7 or zmm bits 511:256).
A program with an instruction this CPU lacks a feature for is not run
(``Program.check``): the judgement is then no difference, with why.  While
the relocation runs, the original's first byte is int3, as under a probe.
When the original faults, only the fault class is compared (registers at a
fault are the tracer's to restore).

Candidates of the concurrency classes (memory ordering, store width and
tearing) are judged by ``memory_model.compare`` instead: a sequential run
cannot see them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import iced_x86 as iced

from ..concrete import cpu, states as ST
from ..concrete.outcome import MachineState, Outcome
from ..x86.registers import GPR64
from . import memory_model
from .form_validation import fault_class
from .operators import Candidate

_BRANCH_KINDS = (iced.OpKind.NEAR_BRANCH16, iced.OpKind.NEAR_BRANCH32, iced.OpKind.NEAR_BRANCH64)
COMPARED = GPR64 + ("fs_base", "gs_base", "mxcsr", "fcw", "fsw", "ftw") + tuple(f"st{i}" for i in range(8)) + \
    tuple(f"zmm{i}" for i in range(32)) + tuple(f"k{i}" for i in range(8))
RFLAGS_COMPARED = 0x8D5 | 0x400 | (1 << 18)


@dataclass(frozen=True)
class Judgement:
    differs: bool
    how: str = ""  # what differed, on the state below
    state: MachineState | None = None
    runs: int = 0

    def state_json(self) -> dict | None:
        if self.state is None:
            return None
        return {"registers": {k: hex(v) for k, v in sorted(self.state.registers.items())},
                "memory": {hex(a): f"{b:02x}" for a, b in sorted(self.state.memory.items())[:64]}}


def _exits(c: Candidate) -> tuple[int, ...]:
    ins = iced.Decoder(64, c.orig, ip=c.at).decode()
    exits = {c.at + len(c.orig), ST.PAD}
    if ins.op_count and ins.op0_kind in _BRANCH_KINDS:
        exits.add(ins.near_branch_target)
    return tuple(sorted(exits))


def _data(c: Candidate) -> tuple[tuple[int, int], ...]:
    small = tuple((lo, n) for lo, n in c.tracer_memory if n <= 0x10000 and not c.tramp <= lo < c.tramp + 0x1000)
    return ((ST.ARENA, ST.ARENA_SIZE),) + small


def programs(c: Candidate) -> tuple[cpu.Program, cpu.Program]:
    exits = _exits(c)
    data = _data(c)
    orig = cpu.Program(((c.at, c.orig),), c.at, exits, data)
    probed = b"\xcc" + c.orig[1:]
    reloc = cpu.Program(((c.tramp, c.reloc), (c.at, probed)), c.tramp,
                        tuple(e for e in exits if not c.tramp <= e < c.tramp + len(c.reloc)), data)
    return orig, reloc


def difference(o: Outcome, r: Outcome, tracer_memory) -> str:
    """'' when the CPU saw the two alike, else what differed."""
    fo, fr = fault_class(o.fault), fault_class(r.fault)
    if fo or fr:
        if fo is None or fr is None or not fo & fr:
            return f"fault: original {o.fault or 'none'}, relocation {r.fault or 'none'}"
        return ""
    if o.next_rip != r.next_rip:
        return f"exit: original {o.next_rip:#x}, relocation {r.next_rip:#x}"
    if (o.registers["rflags"] ^ r.registers["rflags"]) & RFLAGS_COMPARED:
        return f"rflags: original {o.registers['rflags']:#x}, relocation {r.registers['rflags']:#x}"
    has = frozenset(cpu.state_names())
    for name in COMPARED:
        if name not in has:  # state this CPU lacks (or the feature mask hides): neither side has it
            continue
        a, b = o.registers.get(name), r.registers.get(name)
        if a != b:
            return f"{name}: original {a:#x}, relocation {b:#x}" if a is not None and b is not None else name
    wo = {a: v for a, v in o.writes.items() if not any(lo <= a < lo + n for lo, n in tracer_memory)}
    wr = {a: v for a, v in r.writes.items() if not any(lo <= a < lo + n for lo, n in tracer_memory)}
    if wo != wr:
        a = min(set(wo) ^ set(wr) | {k for k in wo if wo.get(k) != wr.get(k)})
        return f"memory at {a:#x}: original {wo.get(a)}, relocation {wr.get(a)}"
    return ""


def judge(c: Candidate, n: int = 16, rng: random.Random | None = None) -> Judgement:
    """See the module doc."""
    rng = rng or random.Random(0)
    if c.concurrency:
        how = memory_model.compare(c.orig, c.at, c.reloc, c.tramp, c.tracer_memory)
        return Judgement(bool(how), how, None, 0)
    placed = []
    for _ in range(n * 4):
        if len(placed) == n:
            break
        s = ST.place(c.orig, c.at, ST.random_registers(rng), rng)
        if s is not None:
            placed.append(s)
    if not placed:
        return Judgement(False, "no state places the original's accesses", None, 0)
    try:
        orig_p, reloc_p = programs(c)
        orig_p.check()
        reloc_p.check()
    except ValueError as exc:
        return Judgement(False, f"not runnable here: {exc}", None, 0)
    ro = cpu.run_on_cpu(orig_p, placed)
    rr = cpu.run_on_cpu(reloc_p, placed)
    tracer = ((c.tramp, len(c.reloc)),) + tuple(c.tracer_memory)
    for state, o, r in zip(placed, ro, rr):
        how = difference(o, r, tracer)
        if how:
            return Judgement(True, how, state, len(placed))
    return Judgement(False, "", None, len(placed))
