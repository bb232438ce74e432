"""The machine monitor: one side of a candidate run on unicorn, instruction by instruction, recorded as a
``Trace`` that the machine judges read (``traps``, ``indirect_branches``, ``shadow_stack``,
``fault_kinds``, ``interrupt_frames``).

``run_trace(side, state, ...)`` runs a ``Side`` (its code, the region whose leaving is its exit) from a
``MachineState`` and records, for every instruction that starts, a ``Step``: its address and bytes, RFLAGS
and RSP before it, and the memory accesses it made.  It stops at the exit (the first address outside the
side's code; an arrival at T again stands for A, as in ``concrete.machine.run_relocated``), or, with a
``continuation`` at that exit, after one more instruction there (the instruction at A+len, which a deferred
trap or shadow acts on).  What the machine does beyond unicorn's semantics is modelled here, from the
manuals, not taken from unicorn:

* **Faults of an access** (the first one ends the run, as the CPU would): a non-canonical address raises
  #SS when the access goes through SS (a base of rsp or rbp, or an implicit stack access: push, pop,
  call, ret) and #GP otherwise (SDM Vol. 1 §3.3.7.1, Vol. 3 §6.15).  An ss: or ds: override does not
  change that: in 64-bit mode the CS, DS, ES and SS overrides are ignored (AMD APM Vol. 1 §4.12.2), and
  this CPU (AMD, measured with ``selftest.machine_states``) raises SIGBUS for ``mov %ds:8(%rsp)`` and
  SIGSEGV for ``mov %ss:8(%rbx)``.  An access to a page the caller marks ``absent`` raises #PF with the
  error code's W bit set for a write and for every access of a read-modify-write operand, whose read is
  made with write intent (SDM Vol. 3 §4.7), and CR2 the first absent byte.
* **Interrupt frames**: ``interrupt=(k, frame)`` writes ``frame(rsp)``'s bytes into memory at the boundary
  before the k-th instruction (k = the number of the side's own instructions: at the exit), as an
  interrupt taken there would (``interrupt_frames`` says what a frame is).
* **RFLAGS.TF**: unicorn's own single-step #DB (QEMU raises it) is ignored; the judge that cares
  (``traps``) reads TF from each step's RFLAGS.  Nothing else about TF, IF or the shadows is acted on.

Everything else is unicorn's (QEMU's TCG) semantics at CPL 0, which is why a value comparison of a
candidate is the CPU's (``selftest.judgement``), and a trace only compares things of the same run with
itself or events the CPU judge cannot see.  ``Trace.limit`` says why a run cannot stand for the CPU: an
instruction unicorn cannot run or runs wrongly (``concrete.machine.UNICORN_DEFECTS``), a system call, the
step budget.  A judge does not compare a limited trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import iced_x86 as iced
from unicorn import (UC_ARCH_X86, UC_ERR_INSN_INVALID, UC_HOOK_CODE, UC_HOOK_INSN, UC_HOOK_INTR, UC_HOOK_MEM_READ,
                     UC_HOOK_MEM_UNMAPPED, UC_HOOK_MEM_WRITE, UC_HOOK_TLB_FILL, UC_MEM_WRITE, UC_MODE_64,
                     UC_PROT_ALL, UC_TLB_VIRTUAL, Uc, UcError)
from unicorn import x86_const as X

from ..concrete.machine import UC_REGISTERS, VECTORS, is_rep_string, unicorn_defect
from ..concrete.outcome import MachineState
from ..concrete.states import PAD
from ..x86.registers import GPR64, MASK64

PAGE = 0x1000
TF, IF, AC = 1 << 8, 1 << 9, 1 << 18
ENDBR64 = b"\xf3\x0f\x1e\xfa"
MAX_STEPS = 256
TCG_BUFFER = 4 << 20  # unicorn's default code buffer is 1 GiB of address space per engine
COMPARED = GPR64 + tuple(f"xmm{i}" for i in range(16)) + ("rflags",)

_INFO = iced.InstructionInfoFactory()
_RMW = (iced.OpAccess.READ_WRITE, iced.OpAccess.READ_COND_WRITE)
_SS_BASES = (iced.Register.RSP, iced.Register.RBP)
_GPR_OF = {getattr(iced.Register, n.upper()): n for n in GPR64}
_UD = frozenset({iced.Mnemonic.UD0, iced.Mnemonic.UD1, iced.Mnemonic.UD2})


@dataclass(frozen=True)
class Access:
    address: int
    size: int
    write: bool


@dataclass(frozen=True)
class Step:
    """One instruction that started: where, its bytes, RFLAGS and RSP before it, what it accessed."""

    address: int
    raw: bytes
    rflags: int
    rsp: int
    accesses: tuple[Access, ...] = ()
    continuation: bool = False  # the instruction at the exit, run after the side's own code

    @property
    def ins(self) -> iced.Instruction:
        return iced.Decoder(64, self.raw, ip=self.address).decode()


@dataclass(frozen=True)
class Fault:
    """The first fault: its vector, the step that raised it, the data address (a #PF's CR2, the non-canonical
    address) and a #PF error code's W bit."""

    vector: str
    step: int
    address: int | None = None
    write: bool | None = None

    def describe(self) -> str:
        if self.vector == "#PF":
            return f"#PF at {self.address:#x} (W={int(bool(self.write))})"
        return self.vector if self.address is None else f"{self.vector} at {self.address:#x}"


@dataclass(frozen=True)
class Trace:
    steps: tuple[Step, ...]
    exit: int | None
    fault: Fault | None
    registers: dict[str, int] = field(hash=False)
    memory: dict[int, int] = field(hash=False)  # the final byte at every address written (frames included)
    limit: str | None = None

    def own_steps(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if not s.continuation)


@dataclass(frozen=True)
class Side:
    """What one side runs: code placed in memory, the region whose leaving is the exit, the entry, and for
    the relocation the address an arrival at the entry again stands for (A)."""

    code: tuple[tuple[int, bytes], ...]
    region: tuple[int, int]
    entry: int
    again: int | None = None
    rep: bool = False  # a rep string instruction at the entry: its iterations stay inside


def canonical(address: int) -> bool:
    top = address >> 47
    return top == 0 or top == (1 << 17) - 1


@dataclass
class _Run:
    side: Side
    absent: frozenset[int]
    interrupt: tuple[int, Callable[[int], tuple[int, bytes]]] | None
    continuation: frozenset[int]
    image: dict[int, bytes]
    uc: Uc | None = None
    steps: list = field(default_factory=list)
    pending: dict | None = None  # the step being run: address, raw, rflags, rsp, accesses
    exit: int | None = None
    fault: Fault | None = None
    limit: str | None = None
    written: set = field(default_factory=set)
    done: bool = False

    # -- hooks ---------------------------------------------------------------------------------------------

    def on_code(self, uc, address: int, size: int, _data) -> None:
        if self.done:
            uc.emu_stop()
            return
        self._finish_step()
        if self.steps and self.exit is None:
            left = self._left(address)
            if left is not None:
                self.exit = left
                self._interrupt(uc)
                if address not in self.continuation:
                    return self._stop()
                self._start_step(uc, address, size, continuation=True)
                return
        elif self.exit is not None:  # the continuation ran
            return self._stop()
        if len(self.steps) >= MAX_STEPS:
            self.limit = f"more than {MAX_STEPS} instructions"
            return self._stop()
        self._interrupt(uc)
        self._start_step(uc, address, size)

    def on_memory(self, uc, access: int, address: int, size: int, _value, _data) -> None:
        if self.done or self.pending is None:
            return
        write = access == UC_MEM_WRITE
        self.pending["accesses"].append(Access(address, size, write))
        if write:
            self.written.update((address + i) & MASK64 for i in range(size))
        if self.fault is None:
            fault = self._fault(uc, address, size, write)
            if fault is not None:
                self.fault = fault
                self._stop()

    def on_unmapped(self, uc, _access, address: int, size: int, _value, _data) -> bool:
        first = address & ~(PAGE - 1)
        for page in range(first, ((address + max(size, 1) - 1) & ~(PAGE - 1)) + PAGE, PAGE):
            self._map(page & MASK64)
        return True

    def on_interrupt(self, uc, intno: int, _data) -> None:
        if intno == 1 and self.pending is not None and self.pending["raw"][:1] != b"\xf1":
            return  # unicorn's own single-step trap (TF): the traps judge models TF itself
        if self.fault is None and not self.done:
            self.fault = Fault(VECTORS.get(intno, f"vector {intno}"), len(self.steps))
        self._stop()

    def on_syscall(self, uc, _data) -> None:
        self.limit = "a system call (unicorn does not model its entry)"
        self._stop()

    # -- helpers -------------------------------------------------------------------------------------------

    def _left(self, address: int) -> int | None:
        lo, n = self.side.region
        if address == self.side.entry and self.side.again is not None:
            return None if self.side.rep and self.steps[-1].address == address else self.side.again
        if lo <= address < lo + n:
            return None
        return address

    def _interrupt(self, uc) -> None:
        if self.interrupt is not None and self.interrupt[0] == len(self.steps):
            at, data = self.interrupt[1](uc.reg_read(X.UC_X86_REG_RSP))
            self._write(at, data)

    def _start_step(self, uc, address: int, size: int, continuation: bool = False) -> None:
        raw = bytes(uc.mem_read(address, size if 0 < size <= 15 else 1))  # unicorn passes a huge size for
        # an instruction it cannot decode (AVX-512): it then raises invalid-instruction
        self.pending = {"address": address, "raw": raw, "rflags": uc.reg_read(X.UC_X86_REG_RFLAGS),
                        "rsp": uc.reg_read(X.UC_X86_REG_RSP), "accesses": [], "continuation": continuation}

    def _finish_step(self) -> None:
        if self.pending is not None:
            p = self.pending
            self.steps.append(Step(p["address"], p["raw"], p["rflags"], p["rsp"], tuple(p["accesses"]),
                                   p["continuation"]))
            self.pending = None

    def _stop(self) -> None:
        self.done = True
        self.uc.emu_stop()

    def _map(self, page: int) -> None:
        try:
            self.uc.mem_map(page, PAGE)
        except UcError:
            return
        content = self.image.get(page)
        if content:
            self.uc.mem_write(page, content)

    def _write(self, at: int, data: bytes) -> None:
        for page in range(at & ~(PAGE - 1), at + len(data), PAGE):
            self._map(page)
        self.uc.mem_write(at, data)
        self.written.update(range(at, at + len(data)))

    def _fault(self, uc, address: int, size: int, write: bool) -> Fault | None:
        ins = iced.Decoder(64, self.pending["raw"], ip=self.pending["address"]).decode()
        used = _matching(uc, ins, address)
        if not canonical(address) or not canonical((address + size - 1) & MASK64):
            ss = used is not None and (used.base in _SS_BASES or (used.base == iced.Register.NONE and
                                                                  ins.is_stack_instruction))
            return Fault("#SS" if ss else "#GP", len(self.steps), address)
        for k in range(size):
            a = (address + k) & MASK64
            if a & ~(PAGE - 1) in self.absent:
                rmw = used is not None and used.access in _RMW
                return Fault("#PF", len(self.steps), a, write or rmw)
        return None


def _value(uc, reg: int) -> int:
    if reg == iced.Register.NONE:
        return 0
    full = iced.RegisterExt.full_register(reg)
    name = _GPR_OF.get(full)
    if name is None:
        return 0
    v = uc.reg_read(UC_REGISTERS[name])
    size = iced.RegisterExt.size(reg)
    return v & ((1 << (8 * size)) - 1) if size < 8 else v


def _matching(uc, ins: iced.Instruction, address: int):
    """The memory operand of ``ins`` (iced's list, implicit ones included) whose address is ``address``."""
    mems = [m for m in _INFO.info(ins).used_memory() if m.access != iced.OpAccess.NO_MEM_ACCESS]
    for m in mems:
        if m.base == iced.Register.RIP:
            at = m.displacement
        else:
            at = m.displacement + _value(uc, m.base) + _value(uc, m.index) * m.scale
            if m.segment == iced.Register.FS:
                at += uc.reg_read(X.UC_X86_REG_FS_BASE)
            elif m.segment == iced.Register.GS:
                at += uc.reg_read(X.UC_X86_REG_GS_BASE)
        if at & MASK64 == address:
            return m
    return mems[0] if len(mems) == 1 else None


def _fill_tlb(uc, vaddr: int, _access, entry, _data) -> bool:
    entry.paddr = vaddr & ~(PAGE - 1)
    entry.perms = UC_PROT_ALL
    return True


def _image(state: MachineState, side: Side) -> dict[int, bytes]:
    pages: dict[int, bytearray] = {}
    for address, b in state.memory.items():
        pages.setdefault(address & ~(PAGE - 1) & MASK64, bytearray(PAGE))[address & (PAGE - 1)] = b & 0xFF
    for at, code in side.code:
        for k, b in enumerate(code):
            a = (at + k) & MASK64
            pages.setdefault(a & ~(PAGE - 1), bytearray(PAGE))[a & (PAGE - 1)] = b
    return {p: bytes(v) for p, v in pages.items()}


def _final_bytes(uc, written: set[int]) -> dict[int, int]:
    """The bytes at ``written`` now, read a run of consecutive addresses at a time."""
    out: dict[int, int] = {}
    addresses = sorted(written)
    k = 0
    while k < len(addresses):
        end = k
        while end + 1 < len(addresses) and addresses[end + 1] == addresses[end] + 1 and \
                addresses[end + 1] & (PAGE - 1):
            end += 1
        data = uc.mem_read(addresses[k], end - k + 1)
        out.update(zip(addresses[k:end + 1], data))
        k = end + 1
    return out


def _registers(uc) -> dict[str, int]:
    return {name: uc.reg_read(UC_REGISTERS[name]) for name in COMPARED}


def run_trace(side: Side, state: MachineState, *, absent: frozenset[int] = frozenset(),
              interrupt: tuple[int, Callable[[int], tuple[int, bytes]]] | None = None,
              continuation: frozenset[int] = frozenset()) -> Trace:
    """Run ``side`` from ``state`` and record it (see the module doc).  ``absent``: pages whose access
    raises #PF; ``interrupt``: (k, frame) writes frame(rsp) at the boundary before the k-th instruction;
    ``continuation``: exit addresses at which one more instruction runs (the caller put code there)."""
    code = b"".join(c for a, c in side.code if a == side.region[0])
    defect = unicorn_defect(code, side.region[0])
    if defect is not None:
        return Trace((), None, None, {}, {}, defect)
    run = _Run(side, absent, interrupt, continuation, _image(state, side))
    uc = run.uc = Uc(UC_ARCH_X86, UC_MODE_64)
    uc.ctl_set_tcg_buffer_size(TCG_BUFFER)
    uc.ctl_set_tlb_mode(UC_TLB_VIRTUAL)
    hooks = [uc.hook_add(UC_HOOK_TLB_FILL, _fill_tlb), uc.hook_add(UC_HOOK_MEM_UNMAPPED, run.on_unmapped),
             uc.hook_add(UC_HOOK_MEM_READ | UC_HOOK_MEM_WRITE, run.on_memory), uc.hook_add(UC_HOOK_CODE, run.on_code),
             uc.hook_add(UC_HOOK_INTR, run.on_interrupt)]
    hooks += [uc.hook_add(UC_HOOK_INSN, run.on_syscall, aux1=insn) for insn in (X.UC_X86_INS_SYSCALL,
                                                                              X.UC_X86_INS_SYSENTER)]
    for page in sorted({(a + k) & ~(PAGE - 1) & MASK64 for a, c in side.code for k in (0, len(c) - 1)}):
        run._map(page)
    regs = state.registers
    for name in GPR64 + tuple(f"xmm{i}" for i in range(16)) + ("fs_base", "gs_base", "mxcsr"):
        if name in regs:
            uc.reg_write(UC_REGISTERS[name], regs[name] & ((1 << 128) - 1 if name.startswith("xmm") else MASK64))
    uc.reg_write(UC_REGISTERS["rflags"], (regs.get("rflags", 0) & ~TF) | 2)
    try:
        uc.emu_start(side.entry, 0, count=MAX_STEPS + 4)
    except UcError as e:
        run.done = True
        if run.fault is None and run.limit is None:
            run.fault, run.limit = _unicorn_error(e, run)
    run._finish_step()
    if run.exit is None and run.fault is None and run.limit is None:
        run.limit = "stopped inside the code"
    memory = _final_bytes(uc, run.written)
    trace = Trace(tuple(run.steps), run.exit, run.fault, _registers(uc), memory, run.limit)
    for h in hooks:  # the binding keeps its hooks in a cycle with the engine: without them it is freed now
        uc.hook_del(h)
    run.uc = None
    return trace


def _unicorn_error(e: UcError, run: _Run) -> tuple[Fault | None, str | None]:
    if e.errno == UC_ERR_INSN_INVALID:
        rip = run.uc.reg_read(X.UC_X86_REG_RIP)
        try:
            ins = iced.Decoder(64, bytes(run.uc.mem_read(rip, 15)), ip=rip).decode()
        except UcError:
            ins = None
        if ins is None or ins.is_invalid or ins.mnemonic in _UD:
            return Fault("#UD", len(run.steps)), None
        return None, f"unicorn cannot run the instruction at {rip:#x}"
    return None, f"unicorn: {e}"


# ---------------------------------------------------------------------------
# A candidate's two sides
# ---------------------------------------------------------------------------

NOP = b"\x90"


def exits(orig: bytes, at: int) -> tuple[int, ...]:
    """Where the original can go: A+len, its branch target, the pad the states send indirect transfers to."""
    ins = iced.Decoder(64, orig, ip=at).decode()
    out = {(at + len(orig)) & MASK64, PAD}
    if ins.op_count and ins.op0_kind in (iced.OpKind.NEAR_BRANCH16, iced.OpKind.NEAR_BRANCH32,
                                         iced.OpKind.NEAR_BRANCH64):
        out.add(ins.near_branch_target)
    return tuple(sorted(out))


def sides(orig: bytes, at: int, reloc: bytes, tramp: int, continuation: bool = False) -> tuple[Side, Side]:
    """The original at A and the relocation at T (with the probe's int3 at A), and with ``continuation`` a
    NOP at each exit outside the code, the instruction after A+len that a deferred trap or shadow acts on."""
    after = tuple((e, NOP) for e in exits(orig, at) if continuation and not at <= e < at + len(orig)
                  and not tramp <= e < tramp + len(reloc))
    original = Side(((at, orig),) + after, (at, len(orig)), at, at, is_rep_string(orig))
    relocated = Side(((tramp, reloc), (at, b"\xcc" + orig[1:])) + after, (tramp, len(reloc)), tramp, at,
                     is_rep_string(reloc))
    return original, relocated
