"""Probes on the boot-patched kernel: placed only where every context's plan is proved.

``ProbeRuntime(kernel, verdicts)``:

* ``enable(address, callback)`` returns ``Enabled`` and writes an int3 at
  ``address`` only if the live instruction there (``KernelMachine`` after
  boot patches) is an instruction boundary of its function and its verdict
  is ``proved`` for the trampoline of every context; otherwise it returns
  ``Refused`` with the first verdict that is not, and its reason, and writes
  nothing.  Several consumers may share an address: each ``enable`` adds a
  callback, each ``disable`` removes one, and the original bytes come back
  with the last.
* On the trap (the int3's #BP, reported by unicorn's interrupt hook, which
  stops the emulation: the handler runs outside unicorn) every callback of
  the address runs, ``callback(address, context)``, then the context's plan:
  copy/rewrite plans are written to the context's trampoline (kinst: one per
  thread or CPU; rewritten only by that context's own traps, so another
  context inside its own trampoline is undisturbed) and rip goes there;
  emulate plans run on ``concrete.effect_machine``'s interpreter with the
  machine's registers and memory, and rip goes where the program jumps.
  An emulated call pushes A+len, the original return address, so no return
  ever lands in a trampoline and ``disable`` is safe while a context is
  inside a callee.
* ``start``/``run``/``step`` run a call into the kernel on a context, to
  completion or one probe hit at a time, so that contexts can be
  interleaved at every probed instruction (every instruction of a function
  whose instructions are all probed).

Every write the emulated kernel makes (and every write of an emulation's
effects) is journalled with the byte it replaced (``WriteJournal``):
``written()`` lists them and ``rollback()`` restores them, so that trials
start from the same memory.  ``FunctionBounds`` (the image's function spans)
answers ``enable``'s question whether an address is an instruction boundary
of its function's live text.  The trampoline pages are tracer memory
(``tracer_ranges``).

``force_plan_for_testing`` replaces a probe's plan without a proof: a door
for the tests that check that a wrong plan is caught, and for nothing else.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable

import iced_x86
from unicorn import UC_HOOK_INTR, UC_HOOK_MEM_UNMAPPED, UC_HOOK_MEM_WRITE, UcError
from unicorn import x86_const as X

from ..concrete.effect_machine import EffectMachine  # the one effect interpreter; see its module
from ..concrete.machine import VECTORS
from ..concrete.outcome import GPRS
from ..image.functions import find_functions
from ..plan.plan import Plan, PlanKind, make_plan
from ..proof.verdict import Finding, Verdict
from ..x86.decode import decode
from ..x86.registers import MASK64
from .kernel import PAGE, RETURN_SENTINEL, Context, KernelMachine

Callback = Callable[[int, Context], None]

STATE_REGISTERS = GPRS + ("rip", "rflags", "fs_base", "gs_base")
_UC_IDS = {**{r: getattr(X, f"UC_X86_REG_{r.upper()}") for r in GPRS}, "rip": X.UC_X86_REG_RIP,
           "rflags": X.UC_X86_REG_RFLAGS, "fs_base": X.UC_X86_REG_FS_BASE, "gs_base": X.UC_X86_REG_GS_BASE}
_IDS = [_UC_IDS[r] for r in STATE_REGISTERS]
RFLAGS_START = 0x2


@dataclass(frozen=True)
class Enabled:
    address: int
    length: int
    variant: str  # the live variant's name ("on disk" where no boot patch applies)
    findings: tuple[Finding, ...]  # per context


@dataclass(frozen=True)
class Refused:
    address: int
    verdict: str
    reason: str


@dataclass(frozen=True)
class Stop:
    """Why a call into the kernel ended: 'returned', 'fault' (with the address) or 'budget'."""

    kind: str
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.kind == "returned"


@dataclass
class Thread:
    """A call into the kernel on one context: its saved registers while another context runs."""

    context: Context
    regs: dict[str, int]
    stop: Stop | None = None
    traps: int = 0


@dataclass
class Probe:
    """A placed probe: its address, the original bytes under it, the plans of the instructions it
    covers, and who is called when it fires (the int3 runtime and the jump-probe runtime share it)."""
    address: int
    raw: bytes
    plans: list[Plan]
    consumers: list[Callback] = field(default_factory=list)


class _LiveMemory:
    """The byte map ``EffectMachine`` reads (``.get``), backed by the machine's memory."""

    def __init__(self, uc):
        self.uc = uc

    def get(self, address: int, default: int = 0) -> int:
        return self.uc.mem_read(address, 1)[0]


@dataclass(frozen=True)
class FunctionBounds:
    """The functions of an image as sorted (start, end) spans: the one that holds an address, and whether an
    address is an instruction boundary of its live text."""

    spans: tuple[tuple[int, int], ...]
    starts: tuple[int, ...]

    @classmethod
    def of(cls, image) -> FunctionBounds:
        """The sized function symbols' spans (System.map symbols have no sizes: the image stage's function
        bounds)."""
        funcs = sorted((s.address, s.address + s.size) for s in image.symbols if s.kind == "func" and s.size)
        if not funcs:
            funcs = [(f.start, f.end) for f in find_functions(image)]
        return cls(tuple(funcs), tuple(a for a, _ in funcs))

    def span_of(self, address: int) -> tuple[int, int] | None:
        """(start, end) of the function that holds ``address``; None where no function does."""
        i = bisect.bisect_right(self.starts, address) - 1
        if i < 0 or address >= self.spans[i][1]:
            return None
        return self.spans[i]

    def boundary_problem(self, address: int, read_live: Callable[[int, int], bytes]) -> str | None:
        """Why ``address`` is not an instruction boundary of its function's live text (``read_live(address,
        size)``), or None when it is one."""
        span = self.span_of(address)
        if span is None:
            return f"{address:#x} is in no sized function symbol, so its instruction boundaries are unknown"
        start, end = span
        live = read_live(start, end - start)
        dec = iced_x86.Decoder(64, live, ip=start)
        for ins in dec:
            if ins.ip >= address:
                return None if ins.ip == address else (f"{address:#x} is not an instruction boundary of the live "
                                                      f"text of its function at {start:#x}")
        return f"{address:#x} is not an instruction boundary"


class WriteJournal:
    """The bytes written to the machine since the last rollback, each with the byte it replaced: ``written``
    lists them, ``rollback`` restores them.  ``on_write`` is its unicorn write hook."""

    def __init__(self, uc):
        self.uc = uc
        self._old: dict[int, int] = {}

    def on_write(self, uc, _access, address: int, size: int, _value, _data) -> None:
        self.record(address, size)

    def record(self, address: int, size: int) -> None:
        """Journal the bytes of [address, address+size) not journalled yet (unmapped: none, the write faults)."""
        journal = self._old
        if all(((address + i) & MASK64) in journal for i in range(size)):
            return
        try:
            old = self.uc.mem_read(address, size)
        except UcError:
            return  # unmapped: the write faults
        for i in range(size):
            journal.setdefault((address + i) & MASK64, old[i])

    def written(self, tracer_ranges: tuple[tuple[int, int], ...]) -> dict[int, int]:
        """Every byte written since the last rollback, and its value now (``tracer_ranges`` left out)."""
        out = {}
        for a in sorted(self._old):
            if not any(0 <= a - s < n for s, n in tracer_ranges):
                out[a] = self.uc.mem_read(a, 1)[0]
        return out

    def rollback(self) -> None:
        """Every journalled byte back to what it was; the journal empty."""
        for a, b in self._old.items():
            self.uc.mem_write(a, bytes([b]))
        self._old.clear()


class ProbeRuntime:
    def __init__(self, kernel: KernelMachine, verdicts):
        self.kernel = kernel
        self.verdicts = verdicts
        self.uc = kernel.uc
        self._probes: dict[int, Probe] = {}
        self._loaded: dict[int, int | None] = {c.index: None for c in kernel.contexts}
        self._journal = WriteJournal(self.uc)
        self._trap: int | None = None
        self._fault: str | None = None
        self.uc.hook_add(UC_HOOK_INTR, self._on_interrupt)
        self.uc.hook_add(UC_HOOK_MEM_UNMAPPED, self._on_unmapped)
        self.uc.hook_add(UC_HOOK_MEM_WRITE, self._journal.on_write)
        self._bounds = FunctionBounds.of(kernel.image)

    @property
    def tracer_ranges(self) -> tuple[tuple[int, int], ...]:
        return tuple((c.tramp & ~(PAGE - 1), PAGE) for c in self.kernel.contexts)

    # -- the probe API -----------------------------------------------------------
    def enable(self, address: int, callback: Callback) -> Enabled | Refused:
        address &= MASK64
        probe = self._probes.get(address)
        if probe is None:
            made = self._place(address)
            if isinstance(made, Refused):
                return made
            probe = made
        probe.consumers.append(callback)
        return self._enabled(probe)

    def disable(self, address: int, callback: Callback | None = None) -> bool:
        """Remove ``callback`` (None: every consumer); restore the bytes when none is left."""
        probe = self._probes.get(address & MASK64)
        if probe is None:
            return False
        if callback is None:
            probe.consumers.clear()
        elif callback in probe.consumers:
            probe.consumers.remove(callback)
        if not probe.consumers:
            self.kernel.write_code(probe.address, probe.raw[:1])
            del self._probes[probe.address]
        return True

    def read_live(self, address: int, size: int) -> bytes:
        """The live text without the probes' int3s: the boot-patched bytes."""
        live = bytearray(self.kernel.read(address, size))
        for p in self._probes.values():
            if address <= p.address < address + size:
                live[p.address - address] = p.raw[0]
        return bytes(live)

    def is_enabled(self, address: int) -> bool:
        return address in self._probes

    def plan_of(self, address: int, context: int) -> Plan:
        """The plan an enabled probe runs for ``context``."""
        return self._probes[address & MASK64].plans[context]

    def write_memory(self, address: int, data: bytes) -> None:
        """Write data (arguments, say) into the machine, journalled so that ``rollback`` undoes it."""
        self._journal.record(address, len(data))
        self.uc.mem_write(address, data)

    def force_plan_for_testing(self, address: int, context: int, plan: Plan) -> None:
        """TEST ONLY: run ``plan`` for ``context`` at an enabled probe, without a proof."""
        self._probes[address].plans[context] = plan
        self._loaded[context] = None

    def _enabled(self, probe: Probe) -> Enabled:
        patch = self.kernel.patches.get(probe.address)
        findings = tuple(self.verdicts.finding(probe.address, probe.raw, c.tramp) for c in self.kernel.contexts)
        return Enabled(probe.address, len(probe.raw), patch.variant if patch else "on disk", findings)

    def _place(self, address: int) -> Probe | Refused:
        if not self.kernel.image.is_executable(address):
            return Refused(address, Verdict.REJECTED.value, f"{address:#x} is not in an executable section")
        boundary = self._bounds.boundary_problem(address, self.read_live)
        if boundary:
            return Refused(address, Verdict.REJECTED.value, boundary)
        length = self.kernel.instruction_length(address)
        if length == 0:
            return Refused(address, Verdict.UNKNOWN.value, f"no decodable instruction is mapped at {address:#x}")
        raw = self.kernel.read(address, length)
        for c in self.kernel.contexts:
            f = self.verdicts.finding(address, raw, c.tramp)
            if f.verdict is not Verdict.PROVED:
                return Refused(address, f.verdict.value, f"context {c.index} (trampoline {c.tramp:#x}): {f.reason}")
        plans = [make_plan(decode(raw, address), c.tramp) for c in self.kernel.contexts]
        self.kernel.write_code(address, b"\xcc")
        probe = self._probes[address] = Probe(address, raw, plans)
        return probe

    # -- hooks (inside unicorn: record and stop, never raise) -----------------------------
    def _on_interrupt(self, uc, intno: int, _data) -> None:
        rip = uc.reg_read(X.UC_X86_REG_RIP)
        if intno == 3 and ((rip - 1) & MASK64) in self._probes:
            self._trap = (rip - 1) & MASK64
        elif intno == 3:
            self._fault = f"int3 at {(rip - 1) & MASK64:#x}, where no probe is enabled"
        else:
            self._fault = f"exception {VECTORS.get(intno, 'interrupt')} (vector {intno}) at {rip:#x}"
        uc.emu_stop()

    def _on_unmapped(self, uc, access, address: int, size: int, _value, _data) -> bool:
        what = {19: "read", 20: "write", 21: "fetch"}.get(access, "access")
        self._fault = f"unmapped {what} of {size} bytes at {address:#x}"
        return False

    # -- the write journal -----------------------------------------------------------
    def written(self) -> dict[int, int]:
        """Every byte written since the last rollback, and its value now (tracer memory left out)."""
        return self._journal.written(self.tracer_ranges)

    def rollback(self) -> None:
        """Every byte written since the last rollback back to what it was."""
        self._journal.rollback()

    # -- running -------------------------------------------------------------------
    def start(self, context: Context, entry: int, regs: dict[str, int]) -> Thread:
        """A call of ``entry`` on ``context``: ``regs`` (GPRs; rsp and rip are set here), returning to the sentinel."""
        state = {r: regs.get(r, 0) & MASK64 for r in STATE_REGISTERS}
        state.update(rsp=context.stack_top - 8, rip=entry & MASK64, rflags=RFLAGS_START, gs_base=context.gs_base,
                     fs_base=0)
        self.write_memory(state["rsp"], RETURN_SENTINEL.to_bytes(8, "little"))
        return Thread(context, state)

    def _load(self, t: Thread) -> None:
        self.uc.reg_write_batch(list(zip(_IDS, (t.regs[r] for r in STATE_REGISTERS))))

    def _save(self, t: Thread) -> None:
        t.regs = dict(zip(STATE_REGISTERS, self.uc.reg_read_batch(_IDS)))

    def run(self, t: Thread, budget: int) -> Stop:
        """Run ``t`` until it returns, faults, or runs more than ``budget`` instructions (or traps)."""
        self._load(t)
        while t.stop is None:
            self._segment(t, RETURN_SENTINEL, budget)
            if t.stop is None and t.traps > budget:
                t.stop = Stop("budget", f"more than {budget} probe hits: a runaway loop?")
        self._save(t)
        return t.stop

    def step(self, t: Thread, budget: int) -> Stop | None:
        """Run ``t`` up to and including its next probe hit (the callbacks and the plan's handler), or
        to its end.  With every instruction of a function probed, that is one instruction: the
        trampoline of the previous hit and the trap of the next one.

        (Not unicorn's single-step, emu_start's count=1 or a stopping code hook: with either, unicorn
        2.1 re-runs a store in the trampoline page without advancing rip.)"""
        if t.stop is None:
            self._load(t)
            self._segment(t, RETURN_SENTINEL, budget)
            if t.stop is None and t.traps > budget:
                t.stop = Stop("budget", f"more than {budget} probe hits: a runaway loop?")
            self._save(t)
        return t.stop

    def _segment(self, t: Thread, until: int, count: int) -> None:
        rip = self.uc.reg_read(X.UC_X86_REG_RIP)
        if rip == RETURN_SENTINEL:
            t.stop = Stop("returned")
            return
        self._trap = self._fault = None
        try:
            self.uc.emu_start(rip, until, count=count)
        except UcError as e:
            self._fault = self._fault or f"unicorn: {e}"
        if self._fault is not None:
            t.stop = Stop("fault", self._fault)
        elif self._trap is not None:
            t.traps += 1
            self._handle(t, self._trap)
        elif self.uc.reg_read(X.UC_X86_REG_RIP) == RETURN_SENTINEL:
            t.stop = Stop("returned")
        else:
            t.stop = Stop("budget", f"more than {count} instructions without returning: a runaway loop? "
                                    f"(stopped at {self.uc.reg_read(X.UC_X86_REG_RIP):#x})")

    def _handle(self, t: Thread, address: int) -> None:
        probe = self._probes[address]
        ctx = t.context
        for callback in list(probe.consumers):
            callback(address, ctx)
        plan = probe.plans[ctx.index]
        if plan.kind is PlanKind.EMULATE:
            fault = self._emulate(plan, address)
            if fault:
                t.stop = Stop("fault", f"emulating {address:#x}: {fault}")
            return
        if self._loaded[ctx.index] != address:
            self.kernel.write_code(plan.tramp, plan.trampoline)
            self._loaded[ctx.index] = address
        self.uc.reg_write(X.UC_X86_REG_RIP, plan.tramp)

    def _emulate(self, plan: Plan, address: int) -> str | None:
        names = GPRS + ("rflags", "fs_base", "gs_base")
        regs = dict(zip(names, self.uc.reg_read_batch([_UC_IDS[n] for n in names])))
        m = EffectMachine(dict(regs), _LiveMemory(self.uc))
        next_rip = address
        try:
            for e in plan.effects:
                r = m.step(e)
                next_rip = next_rip if r is None else r
        except UcError as e:
            return f"unmapped memory: {e}"
        except Exception as e:  # _EffectFault: a program that cannot run
            return str(e)
        for a, b in m.writes.items():
            self._journal.record(a, 1)
            self.uc.mem_write(a, bytes([b]))
        changed = [(_UC_IDS[n], v) for n, v in m.regs.items() if regs.get(n) != v]
        if changed:
            self.uc.reg_write_batch(changed)
        self.uc.reg_write(X.UC_X86_REG_RIP, next_rip & MASK64)
        return None
