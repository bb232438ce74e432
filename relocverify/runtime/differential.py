"""Differential execution of a real kernel function: unprobed, then probed.

``Differential(image, ...)`` holds two boot-patched machines built the same
way: the reference, where no probe is ever placed, and the probed one.
``run(function, specs, trials, seed, probe_all)`` draws each trial's inputs
(``args.draw``, seeded with ``seed + trial`` so that one trial replays
alone), runs the function on context 0 of both machines, and compares

* the final GPRs, rip and the compared rflags bits (``RFLAGS_COMPARED``),
* every byte written (final values; the trampoline pages, tracer memory,
  left out), and how the run ended,
* the probe hits per address against the reference's executed
  instructions per address (a code hook on the function's range; a rep
  string instruction counts once per execution, as its probe fires once).

Both machines are rolled back to their boot state after each trial.  With
``probe_all`` every live instruction of the function is probed except int3
padding (never executed); otherwise only its first instruction.  Probes
that are refused are listed with their verdict and reason, and the run goes
on with the others.

``interleave`` runs several calls on different contexts one probe hit
at a time each, round robin, for the check that interleaving changes no
result.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

import iced_x86
from unicorn import UC_HOOK_CODE

from ..concrete.machine import is_rep_string
from ..concrete.outcome import GPRS, RFLAGS_COMPARED
from ..errors import InputError
from ..image.functions import find_functions
from ..image.locations import FunctionIndex, parse_location
from ..image.image import Image
from .args import ArgSpec, draw
from .kernel import DEFAULT_CPU_FEATURES, KernelMachine
from .probes import Enabled, ProbeRuntime, Refused, Stop, Thread
from .verdicts import LiveVerdicts

DEFAULT_BUDGET = 100_000  # instructions per call


@dataclass(frozen=True)
class Function:
    name: str
    start: int
    end: int


@dataclass(frozen=True)
class Execution:
    stop: Stop
    registers: dict[str, int]
    writes: dict[int, int]
    counts: dict[int, int]  # executed instructions (reference) or probe hits (probed), per address


@dataclass(frozen=True)
class Divergence:
    trial: int
    what: str
    unprobed: str
    probed: str
    replay: str


@dataclass
class Report:
    function: str
    trials: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    instructions_executed: int = 0
    probes_fired: int = 0
    probes_placed: int = 0
    refused: list[Refused] = field(default_factory=list)
    stopped: str | None = None  # the reference run's fault or budget message, when it did not return

    def as_json(self) -> dict:
        return {"function": self.function, "trials": self.trials, "divergences": len(self.divergences),
                "instructions_executed": self.instructions_executed, "probes_fired": self.probes_fired,
                "probes_placed": self.probes_placed,
                "refused": [{"address": hex(r.address), "verdict": r.verdict, "reason": r.reason}
                            for r in self.refused],
                "stopped": self.stopped,
                "first_divergence": None if not self.divergences else vars(self.divergences[0])}


def find_function(image: Image, name: str) -> Function:
    """The function ``name`` or ``name@0xADDR`` (several static functions may share a name: the
    error lists them as NAME@ADDR)."""
    spec = parse_location(name)
    if spec.absolute is not None or spec.offset:
        raise InputError(f"{name!r}: a function is NAME or NAME@0xADDR, without an offset")
    found = {s.address: Function(spec.name, s.address, s.address + s.size)
             for s in image.symbols if s.name == spec.name and s.kind == "func" and s.size}
    if not found and image.symbol_address(spec.name) is not None:
        found = {f.start: Function(spec.name, f.start, f.end) for f in find_functions(image) if f.name == spec.name}
    if not found:
        raise InputError(f"no function named {spec.name!r} in {image.path}"
                         + ("" if image.has_symbols() else " (it has no symbols: pass --system-map)"))
    return FunctionIndex(found.values()).named(spec.name, spec.at)


def live_instructions(runtime: ProbeRuntime, fn: Function) -> list[iced_x86.Instruction]:
    return list(iced_x86.Decoder(64, runtime.read_live(fn.start, fn.end - fn.start), ip=fn.start))


def is_leaf(runtime: ProbeRuntime, fn: Function) -> bool:
    """No call, and no jump leaving the function, in its live (boot-patched) text."""
    for ins in live_instructions(runtime, fn):
        fc = ins.flow_control
        if fc in (iced_x86.FlowControl.CALL, iced_x86.FlowControl.INDIRECT_CALL,
                  iced_x86.FlowControl.INDIRECT_BRANCH):
            return False
        if fc in (iced_x86.FlowControl.UNCONDITIONAL_BRANCH, iced_x86.FlowControl.CONDITIONAL_BRANCH):
            if not fn.start <= ins.near_branch_target < fn.end:
                return False
    return True


def first_difference(a: Execution, b: Execution) -> tuple[str, str, str] | None:
    """The first output that differs between the unprobed run ``a`` and the probed run ``b``: (what, a, b)."""
    if a.stop != b.stop or not a.stop.ok:  # a fault's rip may lie in the trampoline: compare the faults only
        if a.stop.kind == b.stop.kind and (a.stop.kind == "budget" or a.stop.message == b.stop.message):
            return None  # both ran out of budget (counted differently on each side), or the same fault
        return "stop", f"{a.stop.kind} {a.stop.message}".strip(), f"{b.stop.kind} {b.stop.message}".strip()
    for r in GPRS + ("rip",):
        if a.registers[r] != b.registers[r]:
            return r, hex(a.registers[r]), hex(b.registers[r])
    fa, fb = a.registers["rflags"] & RFLAGS_COMPARED, b.registers["rflags"] & RFLAGS_COMPARED
    if fa != fb:
        return "rflags", hex(fa), hex(fb)
    for addr in sorted(set(a.writes) | set(b.writes)):
        va, vb = a.writes.get(addr), b.writes.get(addr)
        if va != vb:
            show = lambda v: "not written" if v is None else f"{v:#04x}"  # noqa: E731
            return f"mem[{addr:#x}]", show(va), show(vb)
    for addr in sorted(set(a.counts) | set(b.counts)):
        if a.counts.get(addr, 0) != b.counts.get(addr, 0):
            return (f"executions of {addr:#x}", f"{a.counts.get(addr, 0)} executed",
                    f"{b.counts.get(addr, 0)} probe hits")
    return None


class Differential:
    def __init__(self, image: Image, cpu_features=frozenset(DEFAULT_CPU_FEATURES), sites=None,
                 verdicts=None, budget: int = DEFAULT_BUDGET):
        self.image = image
        self.budget = budget
        self.reference = KernelMachine(image, cpu_features, sites=sites)
        self.kernel = KernelMachine(image, cpu_features, sites=self.reference.sites)
        self.ref_runtime = ProbeRuntime(self.reference, None)
        self.runtime = ProbeRuntime(self.kernel, verdicts or LiveVerdicts(self.kernel.sites))
        self.hits: dict[int, int] = {}

    def _count_hit(self, address: int, _ctx) -> None:
        self.hits[address] = self.hits.get(address, 0) + 1

    def probe(self, fn: Function, probe_all: bool) -> tuple[list[Enabled], list[Refused]]:
        enabled, refused = [], []
        insns = live_instructions(self.runtime, fn)
        for ins in insns if probe_all else insns[:1]:
            if ins.code == iced_x86.Code.INT3:
                continue  # padding after a ret, never executed
            r = self.runtime.enable(ins.ip, self._count_hit)
            (enabled if isinstance(r, Enabled) else refused).append(r)
        return enabled, refused

    def unprobe(self, enabled: list[Enabled]) -> None:
        for e in enabled:
            self.runtime.disable(e.address, self._count_hit)

    def execute(self, runtime: ProbeRuntime, fn: Function, regs: dict[str, int], memory: dict[int, bytes],
                count_range: Function | None) -> Execution:
        ctx = runtime.kernel.contexts[0]
        for addr, data in memory.items():
            runtime.write_memory(addr, data)
        counts: dict[int, int] = {}
        hook = None
        if count_range is not None:
            last = [None]

            def on_code(uc, address, size, _data):
                if address == last[0] and is_rep_string(bytes(uc.mem_read(address, size))):
                    return
                last[0] = address
                counts[address] = counts.get(address, 0) + 1
            hook = runtime.uc.hook_add(UC_HOOK_CODE, on_code, begin=count_range.start, end=count_range.end - 1)
        else:
            self.hits.clear()
        t = runtime.start(ctx, fn.start, regs)
        try:
            stop = runtime.run(t, self.budget)
        finally:
            if hook is not None:
                runtime.uc.hook_del(hook)
        out = Execution(stop, dict(t.regs), runtime.written(), counts if hook is not None else dict(self.hits))
        runtime.rollback()
        return out

    def trial_inputs(self, specs: tuple[ArgSpec, ...], seed: int, context: int = 0
                     ) -> tuple[dict[str, int], dict[int, bytes]]:
        rng = random.Random(seed)
        regs = {r: rng.getrandbits(64) for r in GPRS}
        args, memory = draw(specs, rng, self.kernel.contexts[context].heap)
        regs.update(args)
        return regs, memory

    def run(self, name: str, specs: tuple[ArgSpec, ...], trials: int, seed: int, probe_all: bool,
            replay: str = "", prepare: Callable[[ProbeRuntime, list[Enabled]], None] | None = None) -> Report:
        """``prepare(runtime, enabled)`` runs once the probes are placed (the tests' door for wrong plans)."""
        fn = find_function(self.image, name)
        report = Report(name)
        enabled, report.refused = self.probe(fn, probe_all)
        report.probes_placed = len(enabled)
        try:
            if prepare is not None:
                prepare(self.runtime, enabled)
            for i in range(trials):
                regs, memory = self.trial_inputs(specs, seed + i)
                ref = self.execute(self.ref_runtime, fn, regs, memory, fn)
                got = self.execute(self.runtime, fn, regs, memory, None)
                report.trials += 1
                report.instructions_executed += sum(ref.counts.values())
                report.probes_fired += sum(got.counts.values())
                if probe_all and not report.refused:
                    diff = first_difference(ref, got)
                else:  # only the probed addresses are counted on the probed side
                    probed = {e.address for e in enabled}
                    diff = first_difference(Execution(ref.stop, ref.registers, ref.writes,
                                              {a: n for a, n in ref.counts.items() if a in probed}), got)
                if diff is not None:
                    report.divergences.append(Divergence(i, *diff, replay=f"{replay} --trials 1 --seed {seed + i}"))
                    break
                if not ref.stop.ok:
                    report.stopped = f"trial {i}: {ref.stop.kind}: {ref.stop.message}"
                    break
        finally:
            self.unprobe(enabled)
        return report


def interleave(runtime: ProbeRuntime, threads: list[Thread], budget: int) -> list[Stop]:
    """Step each thread to its next probe hit in turn until all have stopped."""
    live = list(threads)
    while live:
        for t in list(live):
            if runtime.step(t, budget) is not None:
                live.remove(t)
    return [t.stop for t in threads]


