"""Replay a relocation concretely: the original at A and its relocation, side by side.

This is the independent check behind a ``refuted`` verdict: the SMT checker's
counterexample is an input state, and a relocation is refuted only when
running both sides on that state also gives different outcomes here.

* ``run_original`` runs the original bytes at A on unicorn (QEMU's TCG);
* ``run_relocated`` runs the trampoline bytes at T on unicorn;
* ``run_effects`` interprets an emulate plan's effect program (``effects.py``)
  in plain Python, without unicorn;
* ``compare`` lists the differences between two ``Outcome`` values, and
  ``replay`` does all of it for one original and one relocation;
* ``replay_command`` is ``relocverify replay``: exit 0 equal, 1 different,
  2 bad input, 3 inconclusive (a limit of the replay, below).

Machine model (what a replay assumes):

* Memory is flat and 64-bit, as in the checker: every address from 0 to
  2**64-1 is backed, non-canonical ones included (unicorn raises no #GP for
  them; hardware would).  Pages are mapped when first touched
  (``UC_HOOK_MEM_UNMAPPED``) and filled from ``MachineState.memory``; every
  other byte reads as 0.  Both sides start from the same image: the input
  memory with the original bytes at A laid over it (``with_code``); the
  relocated side also holds the trampoline at T.  The int3 a kprobe writes
  at A is not modelled.
* Address translation is ``UC_TLB_VIRTUAL`` with a ``UC_HOOK_TLB_FILL`` hook
  that maps each virtual page to the same physical address.  This is needed:
  in unicorn's default mode (``UC_TLB_CPU``, paging off) linear addresses are
  cut to 52 physical-address bits, so a fetch at 0xffffffff81234560 goes to
  0xfffff81234560 and fails as unmapped although the page 0xffffffff81234000
  is mapped, and addresses that differ only in their top 12 bits would
  alias.  With the identity fill every 64-bit address is its own page.
* Control leaves a side when the next instruction lies outside its code
  ([A, A+len) or [T, T+len(reloc))); that address is ``next_rip``.  A code
  hook stops the run before that instruction executes.  A ``rep`` string
  instruction looping on itself is still running; any other arrival at A
  from A (``jmp .``) has left.  For the relocation, a transfer back to T
  (other than a rep iteration at T) means "run the probed instruction
  again" and is reported as ``next_rip = A``.
* The end of the code is also emu_start's ``until`` address, which ends
  unicorn's translation block there.  Otherwise the block runs on into the
  bytes after the code, and a store to them (a RIP-relative store just past
  the instruction) makes QEMU retranslate and restart the instruction
  without the store landing.  A store into the code's own bytes still does
  that, so it is reported as not replayable.
* At most ``MAX_STEPS`` instructions run on the original (each rep
  iteration counts) and ``RELOCATION_MARGIN`` more on the relocation; more
  is the fault ``"timeout: ..."``.  An original that times out (a huge rcx
  under ``rep``) is not replayable; a relocation that times out where the
  original finished is a difference.
* Compared outputs: the 16 GPRs, the arithmetic flags and DF
  (``RFLAGS_COMPARED``), fs/gs base, xmm0-15, ``next_rip``, and the bytes
  written (final values, tracer memory excluded).  A store of the value
  already there still counts as a write.  If either side faults, only the
  faults are compared: two equal faults are equal outcomes.
* Faults that are limits of the replay start with ``NOT_REPLAYABLE``.
  ``Replay.differ``, what confirms a counterexample, is False for a replay
  that is not ``replayable``: a limit never confirms a refutation.
* Only CF PF AF ZF SF OF DF (and the fixed bit 1) of the input rflags reach
  unicorn: TF would single-step, and IF/IOPL/AC have no model here.

Not replayable, or run with unicorn's own semantics and not compared:
system state (control registers, MSRs, IF, segment selectors, descriptor
tables), the upper halves of ymm/zmm, x87 and mask registers, I/O ports
(unicorn reads 0), ``syscall``/``sysenter`` (not replayable: unicorn does
not model their MSR-defined entry), self-modifying code (not replayable),
``hlt`` (unicorn stops; control counts as having reached the next
instruction), and interrupts and exceptions, which are reported as faults by
vector (``"exception #DE (vector 0)"``) rather than delivered.  unicorn runs
at CPL 0, so privileged instructions such as ``mov %cr3``, ``wrmsr`` or
``cli`` execute instead of raising #GP.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, TextIO

from unicorn import (UC_ARCH_X86, UC_ERR_EXCEPTION, UC_ERR_INSN_INVALID, UC_HOOK_CODE, UC_HOOK_INSN,
                     UC_HOOK_INTR, UC_HOOK_MEM_UNMAPPED, UC_HOOK_MEM_WRITE, UC_HOOK_TLB_FILL, UC_MODE_64,
                     UC_PROT_ALL, UC_TLB_VIRTUAL, Uc, UcError)
from unicorn import x86_const as X

from . import effects as fx
from .decoders import layout
from .errors import InputError
from .verdict import Counterexample, Difference

MASK64 = 0xFFFFFFFFFFFFFFFF
PAGE = 0x1000
MAX_STEPS = 1024  # per side; the relocation gets RELOCATION_MARGIN more for its extra instructions
RELOCATION_MARGIN = 64
NOT_REPLAYABLE = "not replayable: "  # the prefix of faults that are limits of the replay, not outcomes
TIMEOUT = "timeout"

GPRS = ("rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
        "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")
XMMS = tuple(f"xmm{i}" for i in range(16))
REGISTERS = GPRS + ("rflags", "fs_base", "gs_base") + XMMS
REGISTER_BITS = {**{r: 64 for r in GPRS + ("rflags", "fs_base", "gs_base")}, **{x: 128 for x in XMMS}}
# Other names a counterexample may use (VEX calls the vector registers ymm0..): the low 128 bits of ymmN are xmmN.
REGISTER_ALIASES = {**{f"ymm{i}": f"xmm{i}" for i in range(16)}, "fs": "fs_base", "gs": "gs_base"}

CF, PF, AF, ZF, SF, DF, OF = 1 << 0, 1 << 2, 1 << 4, 1 << 6, 1 << 7, 1 << 10, 1 << 11
RFLAGS_COMPARED = CF | PF | AF | ZF | SF | OF | DF
RFLAGS_FIXED = 1 << 1  # reads as 1 on every x86
_STRING_OPCODES = frozenset(range(0x6C, 0x70)) | frozenset(range(0xA4, 0xA8)) | frozenset(range(0xAA, 0xB0))

# Vector names for the faults the interrupt hook reports (SDM Vol. 3, Table 6-1).
VECTORS = {0: "#DE", 1: "#DB", 3: "#BP", 4: "#OF", 5: "#BR", 6: "#UD", 7: "#NM", 8: "#DF", 10: "#TS",
           11: "#NP", 12: "#SS", 13: "#GP", 14: "#PF", 16: "#MF", 17: "#AC", 18: "#MC", 19: "#XM"}


@dataclass(frozen=True)
class MachineState:
    """Concrete inputs.  Registers not named are 0 (rflags: only bit 1 set).

    ``registers`` may also hold names the replay does not model (see
    ``initial_registers``): a counterexample names every register of its model.
    """

    registers: dict[str, int]
    memory: dict[int, int]  # byte address -> byte; every other byte reads as 0


@dataclass(frozen=True)
class Outcome:
    """Concrete outputs of one side."""

    registers: dict[str, int]
    next_rip: int
    writes: dict[int, int]  # byte address -> final value, tracer memory excluded
    fault: str | None = None


@dataclass(frozen=True)
class Replay:
    """Both outcomes of one replay and their differences.

    ``replayable`` is False when an outcome says nothing about the machine:
    a limit of the replay (self-modifying code, syscall), or an original
    that did not finish within ``MAX_STEPS``.  A relocation that times out
    where the original finished is a difference, not a limit.
    """

    original: Outcome
    relocated: Outcome
    differences: tuple[Difference, ...]

    @property
    def replayable(self) -> bool:
        return not self.limit

    @property
    def limit(self) -> str:
        """Why the replay is not conclusive ('' if it is)."""
        o, r = self.original.fault or "", self.relocated.fault or ""
        if o.startswith(NOT_REPLAYABLE) or o.startswith(TIMEOUT):
            return f"original: {o}"
        return f"relocation: {r}" if r.startswith(NOT_REPLAYABLE) else ""

    @property
    def differ(self) -> bool:
        """A conclusive difference: what confirms a counterexample."""
        return self.replayable and bool(self.differences)


# ---------------------------------------------------------------------------
# States and memory images
# ---------------------------------------------------------------------------


def unmodelled_registers(state: MachineState) -> tuple[str, ...]:
    """The input registers a replay ignores (x87 state, VEX guest offsets, ...), by name."""
    return tuple(sorted(n for n in state.registers if n not in REGISTER_BITS and n not in REGISTER_ALIASES))


def initial_registers(state: MachineState) -> dict[str, int]:
    """The modelled input registers; unnamed ones are 0, rflags has bit 1 set.

    ymmN gives its low 128 bits to xmmN (an explicit xmmN wins).  Names in
    ``unmodelled_registers`` are ignored.  That is safe for confirming a
    counterexample: any difference the replay shows is still a difference on
    a concrete state; a counterexample that depends on an ignored register
    just may not replay.
    """
    regs = {r: 0 for r in REGISTERS}
    regs["rflags"] = RFLAGS_FIXED
    named = sorted(state.registers.items(), key=lambda kv: kv[0] in REGISTER_BITS)  # aliases first
    for name, value in named:
        name = REGISTER_ALIASES.get(name, name)
        if name in REGISTER_BITS:
            regs[name] = value & ((1 << REGISTER_BITS[name]) - 1)
    return regs


def with_code(state: MachineState, at: int, code: bytes) -> MachineState:
    """``state`` with ``code`` laid over its memory at ``at``."""
    memory = dict(state.memory)
    memory.update({(at + i) & MASK64: b for i, b in enumerate(code)})
    return MachineState(dict(state.registers), memory)


def state_from_counterexample(cx: Counterexample) -> MachineState:
    return MachineState(dict(cx.registers), dict(cx.memory))


def _in_ranges(addr: int, ranges: Iterable[tuple[int, int]]) -> bool:
    return any((addr - start) & MASK64 < size for start, size in ranges)


def _pages(addr: int, size: int) -> list[int]:
    first = addr & ~(PAGE - 1) & MASK64
    count = ((addr & (PAGE - 1)) + max(size, 1) + PAGE - 1) // PAGE
    return [(first + i * PAGE) & MASK64 for i in range(count)]


def is_rep_string(raw: bytes) -> bool:
    """A rep/repne-prefixed string instruction: it runs at the same rip once per iteration."""
    lay = layout(raw)
    return (lay is not None and lay.encoding == "legacy" and len(lay.opcode) == 1
            and lay.opcode[0] in _STRING_OPCODES and any(p in (0xF2, 0xF3) for p in lay.prefixes))


# ---------------------------------------------------------------------------
# unicorn
# ---------------------------------------------------------------------------


UC_REGISTERS = {**{r: getattr(X, f"UC_X86_REG_{r.upper()}") for r in GPRS + XMMS},
                "rflags": X.UC_X86_REG_RFLAGS, "fs_base": X.UC_X86_REG_FS_BASE, "gs_base": X.UC_X86_REG_GS_BASE,
                "rip": X.UC_X86_REG_RIP}


@dataclass
class _Machine:
    """One unicorn instance running one side, and what its hooks observed."""

    image: dict[int, dict[int, int]]  # page -> {offset: byte}
    region: tuple[int, int]  # the side's code: (start, size)
    leave: Callable[[int, int | None], int | None]  # (address, previous) -> next_rip if control left
    max_steps: int
    uc: Uc | None = None
    steps: int = 0
    previous: int | None = None
    left_at: int | None = None  # next_rip, once control has left the code
    fault: str | None = None
    written: set[int] = field(default_factory=set)

    def stop(self, fault: str | None = None, left_at: int | None = None) -> None:
        self.fault = self.fault or fault
        self.left_at = left_at
        self.uc.emu_stop()

    def on_code(self, uc, address: int, size: int, _data) -> None:
        if self.steps:
            left = self.leave(address, self.previous)
            if left is not None:
                return self.stop(left_at=left)
        if self.steps >= self.max_steps:
            return self.stop(f"{TIMEOUT}: more than {self.max_steps} instructions")
        self.steps += 1
        self.previous = address

    def on_unmapped(self, uc, _access, address: int, size: int, _value, _data) -> bool:
        try:
            for page in _pages(address, size):
                self.map_page(page)
        except UcError as e:  # never let it escape a callback
            self.fault = f"cannot map the page at {address:#x}: {e}"
            return False
        return True

    def map_page(self, page: int) -> None:
        try:
            self.uc.mem_map(page, PAGE)
        except UcError:
            return  # already mapped: a page touched twice by one unaligned access
        content = self.image.get(page)
        if content:
            buf = bytearray(PAGE)
            for off, b in content.items():
                buf[off] = b
            self.uc.mem_write(page, bytes(buf))

    def on_write(self, uc, _access, address: int, size: int, _value, _data) -> None:
        addresses = [(address + i) & MASK64 for i in range(size)]
        self.written.update(addresses)
        if any(_in_ranges(a, (self.region,)) for a in addresses):
            # QEMU would retranslate and restart the instruction; the store never lands.
            self.stop(f"{NOT_REPLAYABLE}the code writes its own bytes at {address:#x} (self-modifying code)")

    def on_interrupt(self, uc, intno: int, _data) -> None:
        self.stop(f"exception {VECTORS.get(intno, 'interrupt')} (vector {intno})")

    def on_syscall(self, uc, _data) -> None:
        self.stop(f"{NOT_REPLAYABLE}syscall/sysenter (unicorn does not model the MSR-defined entry point)")


def _fill_tlb(uc, vaddr: int, _access, entry, _data) -> bool:
    entry.paddr = vaddr & ~(PAGE - 1)
    entry.perms = UC_PROT_ALL
    return True


def _page_image(memory: dict[int, int]) -> dict[int, dict[int, int]]:
    image: dict[int, dict[int, int]] = {}
    for addr, b in memory.items():
        image.setdefault(addr & ~(PAGE - 1) & MASK64, {})[addr & (PAGE - 1)] = b & 0xFF
    return image


def _start(m: _Machine, state: MachineState) -> None:
    uc = m.uc = Uc(UC_ARCH_X86, UC_MODE_64)
    uc.ctl_set_tlb_mode(UC_TLB_VIRTUAL)
    uc.hook_add(UC_HOOK_TLB_FILL, _fill_tlb)
    uc.hook_add(UC_HOOK_MEM_UNMAPPED, m.on_unmapped)
    uc.hook_add(UC_HOOK_MEM_WRITE, m.on_write)
    uc.hook_add(UC_HOOK_CODE, m.on_code)
    uc.hook_add(UC_HOOK_INTR, m.on_interrupt)
    for insn in (X.UC_X86_INS_SYSCALL, X.UC_X86_INS_SYSENTER):
        uc.hook_add(UC_HOOK_INSN, m.on_syscall, aux1=insn)
    for page in _pages(*m.region):
        m.map_page(page)
    for name, value in initial_registers(state).items():
        if name == "rflags":
            value = (value & RFLAGS_COMPARED) | RFLAGS_FIXED
        uc.reg_write(UC_REGISTERS[name], value)


def _unicorn_fault(e: UcError) -> str:
    return {UC_ERR_INSN_INVALID: "invalid instruction",
            UC_ERR_EXCEPTION: "cpu exception"}.get(e.errno, f"unicorn: {e}")


def _execute(m: _Machine, state: MachineState, tracer_memory: Iterable[tuple[int, int]]) -> Outcome:
    start, size = m.region
    try:
        _start(m, state)
        m.uc.emu_start(start, (start + size) & MASK64, count=m.max_steps + 2)
    except UcError as e:
        m.fault = m.fault or _unicorn_fault(e)
    return _outcome(m, tuple(tracer_memory))


def _outcome(m: _Machine, tracer_memory: tuple[tuple[int, int], ...]) -> Outcome:
    regs = {name: m.uc.reg_read(UC_REGISTERS[name]) for name in REGISTERS}
    rip = m.uc.reg_read(UC_REGISTERS["rip"])
    fault, next_rip = m.fault, m.left_at
    if fault is None and next_rip is None:
        if _in_ranges(rip, (m.region,)):
            fault = f"emulation stopped inside the code at {rip:#x}"
        else:  # stopped by `until`, by the step count, or by hlt, with rip already outside
            next_rip = m.leave(rip, m.previous) if m.steps else rip
    writes = {a: m.uc.mem_read(a, 1)[0] for a in sorted(m.written) if not _in_ranges(a, tracer_memory)}
    return Outcome(regs, rip if next_rip is None else next_rip, writes, fault)


def run_original(orig: bytes, at: int, state: MachineState, max_steps: int = MAX_STEPS) -> Outcome:
    """Run the original instruction at A until control leaves [A, A+len(orig))."""
    at &= MASK64
    rep = is_rep_string(orig)

    def leave(address: int, previous: int | None) -> int | None:
        return None if rep and address == at else address  # one instruction: every later fetch has left

    image = _page_image(with_code(state, at, orig).memory)
    return _execute(_Machine(image, (at, len(orig)), leave, max_steps), state, ())


def run_relocated(reloc: bytes, tramp: int, at: int, orig_len: int, state: MachineState,
                  tracer_memory: Iterable[tuple[int, int]] = (), max_steps: int = MAX_STEPS) -> Outcome:
    """Run the relocation at T until control leaves [T, T+len(reloc)); an exit to T is reported as A.

    ``orig_len`` is the length of the original instruction (1..15), checked
    here so that a caller cannot pass the trampoline's length by mistake.
    Writes into ``tracer_memory`` are left out of ``Outcome.writes``.
    """
    if not 1 <= orig_len <= 15:
        raise ValueError(f"orig_len {orig_len} is not the length of an x86 instruction (1..15)")
    tramp, at = tramp & MASK64, at & MASK64
    rep_at_t = is_rep_string(reloc)

    def leave(address: int, previous: int | None) -> int | None:
        if address == tramp:
            return None if rep_at_t and previous == tramp else at
        return None if _in_ranges(address, ((tramp, len(reloc)),)) else address

    image = _page_image(with_code(state, tramp, reloc).memory)
    return _execute(_Machine(image, (tramp, len(reloc)), leave, max_steps), state, tracer_memory)


# ---------------------------------------------------------------------------
# The effect language, concretely
# ---------------------------------------------------------------------------


class _EffectFault(Exception):
    """Internal: an effect program that cannot run; becomes ``Outcome.fault``."""


@dataclass
class _EffectMachine:
    regs: dict[str, int]
    memory: dict[int, int]
    writes: dict[int, int] = field(default_factory=dict)
    temps: dict[str, int] = field(default_factory=dict)

    def read(self, addr: int, size: int) -> int:
        data = [self.writes.get(a, self.memory.get(a, 0)) for a in ((addr + i) & MASK64 for i in range(size))]
        return int.from_bytes(bytes(data), "little")

    def write(self, addr: int, value: int, size: int) -> None:
        for i, b in enumerate((value & ((1 << 8 * size) - 1)).to_bytes(size, "little")):
            self.writes[(addr + i) & MASK64] = b

    def register(self, name: str) -> int:
        if name not in GPRS:
            raise _EffectFault(f"effect reads %{name}, which is not a 64-bit GPR")
        return self.regs[name]

    def address(self, a: fx.Address) -> int:
        ea = (self.register(a.base) if a.base else 0) + (self.register(a.index) * a.scale if a.index else 0)
        ea = (ea + a.disp) & (MASK64 if a.address_size == 64 else 0xFFFFFFFF)
        seg = self.regs[f"{a.segment}_base"] if a.segment in ("fs", "gs") else 0
        return (ea + seg) & MASK64

    def value(self, v: fx.Value) -> int:
        if isinstance(v, fx.Const):
            return v.value & MASK64
        if isinstance(v, fx.Reg):
            return self.register(v.name)
        if isinstance(v, fx.Temp):
            if v.name not in self.temps:
                raise _EffectFault(f"effect reads {v.name} before it is set")
            return self.temps[v.name]
        return self.read(self.address(v.address), v.size)

    def flag_bits(self) -> tuple[int, int, int, int, int]:
        f = self.regs["rflags"]
        return tuple(int(bool(f & bit)) for bit in (CF, PF, ZF, SF, OF))

    def step(self, e: fx.Effect) -> int | None:
        """Perform one effect; the next rip if it was the final Jump or Branch."""
        if isinstance(e, fx.Let):
            self.temps[e.name] = self.value(e.value)
        elif isinstance(e, fx.Push):
            value = self.value(e.value)  # read before rsp moves: push (%rsp) pushes the old top
            self.regs["rsp"] = (self.regs["rsp"] - 8) & MASK64
            self.write(self.regs["rsp"], value, 8)
        elif isinstance(e, fx.AddRsp):
            self.regs["rsp"] = (self.regs["rsp"] + e.delta) & MASK64
        elif isinstance(e, fx.Jump):
            return self.value(e.to)
        elif isinstance(e, fx.Branch):
            if e.cond not in fx.CONDITIONS:
                raise _EffectFault(f"unknown condition {e.cond!r}")
            return (e.taken if fx.CONDITIONS[e.cond].test(*self.flag_bits()) else e.fallthrough) & MASK64
        else:
            raise _EffectFault(f"not an effect: {e!r}")
        return None


def run_effects(effects: tuple[fx.Effect, ...], at: int, state: MachineState) -> Outcome:
    """Interpret an emulate plan's effect program on ``state``.

    The program must end in its only Jump or Branch; otherwise the outcome
    is a fault.  ``at`` is the probed address: a program that ends without
    a jump leaves rip there.
    """
    m = _EffectMachine(initial_registers(state), {a & MASK64: b & 0xFF for a, b in state.memory.items()})
    next_rip, fault = at & MASK64, None
    try:
        ends = [i for i, e in enumerate(effects) if isinstance(e, (fx.Jump, fx.Branch))]
        if ends != [len(effects) - 1]:
            raise _EffectFault("the effect program does not end in exactly one jump or branch")
        for e in effects:
            result = m.step(e)
            next_rip = next_rip if result is None else result
    except _EffectFault as e:
        fault = str(e)
    return Outcome(m.regs, next_rip, dict(sorted(m.writes.items())), fault)


# ---------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------


def _show(name: str, value: int) -> str:
    return f"{value:#x}" if name != "rflags" else f"{value & RFLAGS_COMPARED:#x}"


def _register_differences(a: Outcome, b: Outcome) -> list[Difference]:
    out = []
    for name in REGISTERS:
        va, vb = a.registers.get(name, 0), b.registers.get(name, 0)
        if name == "rflags":
            va, vb = va & RFLAGS_COMPARED, vb & RFLAGS_COMPARED
        if va != vb:
            out.append(Difference(name, _show(name, va), _show(name, vb)))
    return out


def _runs(addresses: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for addr in addresses:
        if runs and runs[-1][-1] + 1 == addr:
            runs[-1].append(addr)
        else:
            runs.append([addr])
    return runs


def _memory_differences(a: Outcome, b: Outcome, tracer_memory) -> list[Difference]:
    differing = sorted(addr for addr in set(a.writes) | set(b.writes)
                       if a.writes.get(addr) != b.writes.get(addr) and not _in_ranges(addr, tracer_memory))

    def show(writes: dict[int, int], run: list[int]) -> str:
        return " ".join("--" if addr not in writes else f"{writes[addr]:02x}" for addr in run) \
            if any(addr in writes for addr in run) else "not written"

    return [Difference(f"mem[{run[0]:#x}]", show(a.writes, run), show(b.writes, run)) for run in _runs(differing)]


def compare(a: Outcome, b: Outcome, tracer_memory: Iterable[tuple[int, int]] = ()) -> list[Difference]:
    """The differences between the original's outcome ``a`` and the relocation's ``b``.

    Memory differences are grouped into runs of consecutive bytes, named by
    their first address ('mem[0x...]') and shown as bytes in address order
    ('--' where that side did not write the byte).
    """
    if a.fault or b.fault:
        return [] if a.fault == b.fault else [Difference("fault", a.fault or "none", b.fault or "none")]
    diffs = [] if a.next_rip == b.next_rip else [Difference("rip", f"{a.next_rip:#x}", f"{b.next_rip:#x}")]
    return diffs + _register_differences(a, b) + _memory_differences(a, b, tuple(tracer_memory))


def replay(orig: bytes, at: int, tramp: int, state: MachineState, reloc: bytes | None = None,
           effects: tuple[fx.Effect, ...] | None = None, tracer_memory: Iterable[tuple[int, int]] = ()) -> Replay:
    """Run the original and one relocation (``reloc`` bytes at T, or an ``effects`` program) on ``state``."""
    if (reloc is None) == (effects is None):
        raise ValueError("replay needs exactly one of reloc and effects")
    tracer_memory = tuple(tracer_memory)
    image = with_code(state, at, orig)
    original = run_original(orig, at, image)
    if reloc is not None:
        relocated = run_relocated(reloc, tramp, at, len(orig), image, tracer_memory, MAX_STEPS + RELOCATION_MARGIN)
    else:
        relocated = run_effects(tuple(effects), at, image)
    return Replay(original, relocated, tuple(compare(original, relocated, tracer_memory)))


# ---------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------


def _int(text: object, what: str) -> int:
    if isinstance(text, bool):
        raise InputError(f"{what} must be a hex string like '0x1f' or an integer, not {text!r}")
    if isinstance(text, int):
        return text
    try:
        return int(str(text), 16) if str(text).lower().startswith("0x") else int(str(text), 10)
    except ValueError:
        raise InputError(f"{what} must be a hex string like '0x1f' or an integer, not {text!r}") from None


def _value_from_json(doc: object) -> fx.Value:
    if isinstance(doc, (str, int)) and not isinstance(doc, bool):
        return fx.Const(_int(doc, "a constant") & MASK64)
    if isinstance(doc, dict) and "reg" in doc:
        return fx.Reg(str(doc["reg"]))
    if isinstance(doc, dict) and "temp" in doc:
        return fx.Temp(str(doc["temp"]))
    if isinstance(doc, dict) and isinstance(doc.get("load"), dict):
        a = doc["load"]
        address = fx.Address(base=a.get("base"), index=a.get("index"), scale=_int(a.get("scale", 1), "scale"),
                             disp=_int(a.get("disp", 0), "disp"), segment=a.get("segment"),
                             address_size=_int(a.get("address_size", 64), "address_size"))
        return fx.Load(address, _int(doc.get("size", 8), "load size"))
    raise InputError(f"not an effect value: {json.dumps(doc)} (expected '0x..', {{'reg': ..}}, "
                     f"{{'temp': ..}} or {{'load': {{..}}, 'size': n}})")


def _effect_from_json(doc: object) -> fx.Effect:
    if not isinstance(doc, dict):
        raise InputError(f"an effect must be a JSON object, not {json.dumps(doc)}")
    op = doc.get("op")
    try:
        if op == "let":
            return fx.Let(str(doc["name"]), _value_from_json(doc["value"]))
        if op == "push":
            return fx.Push(_value_from_json(doc["value"]))
        if op == "add_rsp":
            return fx.AddRsp(_int(doc["delta"], "add_rsp delta"))
        if op == "jump":
            return fx.Jump(_value_from_json(doc["to"]))
        if op == "branch":
            cond = str(doc["cond"])
            if cond not in fx.CONDITIONS:
                raise InputError(f"unknown branch condition {cond!r}; one of {', '.join(fx.CONDITIONS)}")
            return fx.Branch(cond, _int(doc["taken"], "taken") & MASK64,
                             _int(doc["fallthrough"], "fallthrough") & MASK64)
    except KeyError as e:
        raise InputError(f"effect {op!r} lacks the key {e.args[0]!r}") from None
    raise InputError(f"unknown effect op {op!r}; one of let, push, add_rsp, jump, branch")


def effects_from_json(doc: object) -> tuple[fx.Effect, ...]:
    """The inverse of ``effects.effect_json`` over a list; the "text" keys are ignored."""
    if not isinstance(doc, list):
        raise InputError("effects must be a JSON list of effect objects, as in a plan's \"effects\"")
    return tuple(_effect_from_json(e) for e in doc)


_REGISTER_NAME = re.compile(r"[a-z][a-z0-9_]*")


def state_from_json(doc: object) -> MachineState:
    """{"registers": {"rax": "0x..", ...}, "memory": {"0xaddr": "ab", ...}} -> MachineState.

    A memory value of several bytes ("abcd") fills consecutive addresses.
    Register names the replay does not model are kept (a counterexample
    names every register of its model) and listed by ``unmodelled_registers``.
    """
    if not isinstance(doc, dict) or not set(doc) <= {"registers", "memory"} \
            or not all(isinstance(doc.get(k) or {}, dict) for k in ("registers", "memory")):
        raise InputError('the state must be a JSON object {"registers": {...}, "memory": {...}}')
    registers = {}
    for name, value in (doc.get("registers") or {}).items():
        if not _REGISTER_NAME.fullmatch(name):
            raise InputError(f"{name!r} is not a register name; the replay models rax..r15, rflags, fs_base, "
                             f"gs_base, xmm0..xmm15 (ymmN: its low half)")
        registers[name] = _int(value, f"register {name}")
    memory = {}
    for addr, data in (doc.get("memory") or {}).items():
        base = _int(addr, "a memory address")
        try:
            raw = bytes.fromhex(data) if isinstance(data, str) else bytes([data])
        except (ValueError, TypeError):
            raise InputError(f"memory at {addr} must be hex bytes like 'ab', not {data!r}") from None
        memory.update({(base + i) & MASK64: b for i, b in enumerate(raw)})
    return MachineState(registers, memory)


def _load_json(text: str, what: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{what} is not valid JSON: {e}") from None


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def _describe(label: str, o: Outcome) -> str:
    return f"{label:<10} " + (f"fault: {o.fault}" if o.fault else f"next rip {o.next_rip:#x}, "
                                                              f"{len(o.writes)} byte(s) written")


def _planned_tracer_memory(orig: bytes, at: int, tramp: int, reloc: bytes) -> tuple[tuple[int, int], ...]:
    """Our planner's tracer memory if ``reloc`` is its trampoline (save slot included), else the trampoline."""
    from .decoders import decode
    from .plan import make_plan

    plan = make_plan(decode(orig, at), tramp)
    return plan.tracer_memory if plan.trampoline == reloc else ((tramp, len(reloc)),)


def replay_command(args, out: TextIO) -> int:
    """``relocverify replay``: 0 equal, 1 different, 2 bad input (raised as InputError), 3 not replayable."""
    from .cli import parse_hex_bytes

    if (args.reloc is None) == (args.effects is None):
        raise InputError("give exactly one of --reloc HEX and --effects JSON")
    orig = parse_hex_bytes(args.orig, "--orig")
    if len(orig) > 15:
        raise InputError(f"--orig has {len(orig)} bytes; an x86 instruction has at most 15")
    state = state_from_json(_load_json(args.state, "--state"))
    if args.reloc is not None:
        reloc = parse_hex_bytes(args.reloc, "--reloc")
        result = replay(orig, args.at, args.tramp, state, reloc=reloc,
                        tracer_memory=_planned_tracer_memory(orig, args.at, args.tramp, reloc))
    else:
        effects = effects_from_json(_load_json(args.effects, "--effects"))
        result = replay(orig, args.at, args.tramp, state, effects=effects)
    if unmodelled_registers(state):
        out.write(f"note: not modelled by the replay, ignored: {', '.join(unmodelled_registers(state))}\n")
    out.write(_describe("original:", result.original) + "\n")
    out.write(_describe("relocated:", result.relocated) + "\n")
    for d in result.differences:
        out.write(f"differs: {d.what}: original {d.original}, relocated {d.relocated}\n")
    if not result.replayable:
        out.write(f"inconclusive: {result.limit}\n")
        return 3
    out.write("equal\n" if not result.differ else f"{len(result.differences)} difference(s)\n")
    return 1 if result.differ else 0
