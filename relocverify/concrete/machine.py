"""Replay a relocation concretely: the original at A and its relocation, side by side.

This is the independent check behind a ``refuted`` verdict: the SMT checker's
counterexample is an input state, and a relocation is refuted only when
running both sides on that state also gives different outcomes here.

* ``run_original`` runs the original bytes at A on unicorn (QEMU's TCG);
* ``run_relocated`` runs the trampoline bytes at T on unicorn;
* ``run_effects`` interprets an emulate plan's effect program (``effects.py``)
  in plain Python, without unicorn;
* ``compare`` lists the differences between two ``Outcome`` values, and
  ``replay.replay`` does all of it for one original and one relocation;
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
* Compared outputs: the 16 GPRs, the arithmetic flags and DF, MXCSR
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

from dataclasses import dataclass, field
from typing import Callable, Iterable

from unicorn import (UC_ARCH_X86, UC_ERR_EXCEPTION, UC_ERR_INSN_INVALID, UC_HOOK_CODE, UC_HOOK_INSN,
                     UC_HOOK_INTR, UC_HOOK_MEM_UNMAPPED, UC_HOOK_MEM_WRITE, UC_HOOK_TLB_FILL, UC_MODE_64,
                     UC_PROT_ALL, UC_TLB_VIRTUAL, Uc, UcError)
from unicorn import x86_const as X

from ..x86.layout import layout
from ..x86.registers import MASK64
from .outcome import (GPRS, REGISTERS, RFLAGS_COMPARED, RFLAGS_FIXED, XMMS, MachineState, Outcome,
                      initial_registers, with_code)

PAGE = 0x1000
MAX_STEPS = 1024  # per side; the relocation gets RELOCATION_MARGIN more for its extra instructions
RELOCATION_MARGIN = 64
NOT_REPLAYABLE = "not replayable: "  # the prefix of faults that are limits of the replay, not outcomes
TIMEOUT = "timeout"
_STRING_OPCODES = frozenset(range(0x6C, 0x70)) | frozenset(range(0xA4, 0xA8)) | frozenset(range(0xAA, 0xB0))

# Vector names for the faults the interrupt hook reports (SDM Vol. 3, Table 6-1).
VECTORS = {0: "#DE", 1: "#DB", 3: "#BP", 4: "#OF", 5: "#BR", 6: "#UD", 7: "#NM", 8: "#DF", 10: "#TS",
           11: "#NP", 12: "#SS", 13: "#GP", 14: "#PF", 16: "#MF", 17: "#AC", 18: "#MC", 19: "#XM"}


def in_ranges(addr: int, ranges: Iterable[tuple[int, int]]) -> bool:
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
                "mxcsr": X.UC_X86_REG_MXCSR, "rip": X.UC_X86_REG_RIP}


@dataclass
class Machine:
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
        if any(in_ranges(a, (self.region,)) for a in addresses):
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


def page_image(memory: dict[int, int]) -> dict[int, dict[int, int]]:
    """A byte map (address -> byte) as the pages ``Machine`` maps on demand: page -> {offset: byte}."""
    image: dict[int, dict[int, int]] = {}
    for addr, b in memory.items():
        image.setdefault(addr & ~(PAGE - 1) & MASK64, {})[addr & (PAGE - 1)] = b & 0xFF
    return image


def _start(m: Machine, state: MachineState) -> None:
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


#: What #UD means on the CPU: the instructions that exist to raise it.
_UD = frozenset({"ud0", "ud1", "ud2"})


def _unicorn_fault(e: UcError, m: Machine | None = None) -> str:
    """The outcome a unicorn error stands for.  "Invalid instruction" is the CPU's #UD only for an
    instruction that raises it there (ud0/ud1/ud2, or bytes no decoder decodes); for anything
    iced-x86 decodes, it is QEMU that cannot run it (AVX and newer extensions in unicorn 2.1):
    a limit of the replay, so two equal such faults never count as agreement."""
    if e.errno == UC_ERR_INSN_INVALID:
        if m is not None and m.uc is not None:
            import iced_x86

            try:
                rip = m.uc.reg_read(UC_REGISTERS["rip"])
                ins = iced_x86.Decoder(64, bytes(m.uc.mem_read(rip, 15)), ip=rip).decode()
            except UcError:
                ins = None
            if ins is not None and not ins.is_invalid:
                name = iced_x86.Formatter(iced_x86.FormatterSyntax.GAS).format_mnemonic(ins).split()[-1]
                if name not in _UD:
                    return f"{NOT_REPLAYABLE}unicorn cannot execute {name} (it raises invalid-instruction for it)"
        return "invalid instruction"
    return {UC_ERR_EXCEPTION: "cpu exception"}.get(e.errno, f"unicorn: {e}")


#: Instructions unicorn 2.1.4 runs differently from the CPU, found by the native oracle
#: (``concrete.native``, ``benchmarks/bench_trust_base.py``): a replay through one of them
#: cannot confirm anything, so it is a limit of the replay.  (iced-x86 mnemonic, VEX-encoded
#: only?, why.)
UNICORN_DEFECTS = (
    ("VPXOR", True, "unicorn 2.1.4 computes vpxor from its destination instead of VEX.vvvv "
                    "(c5 d9 ef df with xmm4=0x100, xmm7=5: the CPU gives 0x105, unicorn 6)"),
    ("LDMXCSR", False, "unicorn 2.1.4 accepts reserved MXCSR bits that make the CPU raise #GP"),
    ("VLDMXCSR", True, "unicorn 2.1.4 accepts reserved MXCSR bits that make the CPU raise #GP"),
)


def unicorn_defect(code: bytes, at: int) -> str | None:
    """Why unicorn cannot be trusted to run ``code`` like the CPU, or None."""
    import iced_x86

    names = {getattr(iced_x86.Mnemonic, m): (vex, why) for m, vex, why in UNICORN_DEFECTS}
    for ins in iced_x86.Decoder(64, code, ip=at & MASK64):
        hit = names.get(ins.mnemonic)
        if hit is not None and (not hit[0] or ins.encoding != iced_x86.EncodingKind.LEGACY):
            return hit[1]
    return None


def execute(m: Machine, state: MachineState, tracer_memory: Iterable[tuple[int, int]]) -> Outcome:
    """Run ``m`` from ``state`` until its ``leave`` rule says the code was left (or a fault, or its
    step budget), and return what it did; ``tracer_memory`` is memory the relocated side may use
    as its own.  ``run_original``, ``run_relocated`` and the block replay share it."""
    start, size = m.region
    code = bytes(m.image.get(start & ~(PAGE - 1), {}).get((start & (PAGE - 1)) + k, 0) for k in range(min(size, 64)))
    defect = unicorn_defect(code, start)
    if defect is not None:
        return Outcome({}, start, {}, f"{NOT_REPLAYABLE}{defect}")
    try:
        _start(m, state)
        m.uc.emu_start(start, (start + size) & MASK64, count=m.max_steps + 2)
    except UcError as e:
        m.fault = m.fault or _unicorn_fault(e, m)
    return _outcome(m, tuple(tracer_memory))


def _outcome(m: Machine, tracer_memory: tuple[tuple[int, int], ...]) -> Outcome:
    regs = {name: m.uc.reg_read(UC_REGISTERS[name]) for name in REGISTERS}
    rip = m.uc.reg_read(UC_REGISTERS["rip"])
    fault, next_rip = m.fault, m.left_at
    if fault is None and next_rip is None:
        if in_ranges(rip, (m.region,)):
            fault = f"emulation stopped inside the code at {rip:#x}"
        else:  # stopped by `until`, by the step count, or by hlt, with rip already outside
            next_rip = m.leave(rip, m.previous) if m.steps else rip
    writes = {a: m.uc.mem_read(a, 1)[0] for a in sorted(m.written) if not in_ranges(a, tracer_memory)}
    return Outcome(regs, rip if next_rip is None else next_rip, writes, fault)


def run_original(orig: bytes, at: int, state: MachineState, max_steps: int = MAX_STEPS) -> Outcome:
    """Run the original instruction at A until control leaves [A, A+len(orig))."""
    at &= MASK64
    rep = is_rep_string(orig)

    def leave(address: int, previous: int | None) -> int | None:
        return None if rep and address == at else address  # one instruction: every later fetch has left

    image = page_image(with_code(state, at, orig).memory)
    return execute(Machine(image, (at, len(orig)), leave, max_steps), state, ())


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
        return None if in_ranges(address, ((tramp, len(reloc)),)) else address

    image = page_image(with_code(state, tramp, reloc).memory)
    return execute(Machine(image, (tramp, len(reloc)), leave, max_steps), state, tracer_memory)

