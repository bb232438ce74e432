"""The machine a relocation runs in, as data: every input and output of running relocated code that the
sequential semantics (``proof.semantics``) does not already compare, and what the checker does with it.

A proof from the semantics says that the relocated code computes what the original computes.  It runs in a
machine, though: a kernel thread at CPL 0 that an interrupt can stop between any two instructions, a user
process whose faults become signals, a CPU that enforces indirect-branch tracking (IBT) or keeps a shadow
stack, whose single-step traps and interrupt shadows act one instruction late.  ``MACHINE_MODEL`` has one row
per such input or output, and each row is one of

* ``obligation``: the checker compares it (the row names the mechanism); a relocation that differs is not
  ``proved``;
* ``precondition``: assumed, and printed with the verdict when the relocation depends on it
  (``ProofResult.assumes``);
* ``unknown``: the checker cannot decide it, and a relocation that depends on it is ``unknown``.

Default deny: ``check_machine`` looks at every instruction that can run on either side
(``proof.reachable``) and gives each one its machine classes (``machine_classes``); an instruction of a
class with no row cannot be proved.  Sources: Intel SDM Vol. 1 §6.4-6.5 and ch. 18 (CET), Vol. 2 per
instruction (Operation, Flags Affected, 64-Bit Mode Exceptions), Vol. 3 §4.7 (page-fault error code), §6.12-6.15
(interrupt frames at the same privilege level, #AC), §17.3.1 (TF, RF, MOV SS and STI shadows); AMD APM Vol. 2
§8.4-8.9 and §15; Linux ``arch/x86/entry/entry_64.S`` (a kernel-mode interrupt pushes its frame and
``pt_regs`` on the interrupted stack; NMI, #DB, #MC and #DF alone switch to an IST stack) and
``arch/x86/kernel/cet.c`` (kernel IBT: ``MSR_IA32_S_CET = CET_ENDBR_EN``, so ``notrack`` is not honoured);
docs/machine.md gives the table and how each row is checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

import iced_x86 as iced

from ..plan.effects import Address, Effect, Jump, Let, Load, Push
from ..x86.encoding import ABS_JUMP
from .forms import MNEMONIC_NAMES
from .reachable import reachable

#: The lowest kernel (upper-half canonical) address: code there runs at CPL 0.
KERNEL_HALF = 0xFFFF_8000_0000_0000
#: Bytes below RSP a signal frame leaves alone in user space: the System V red zone (ABI §3.2.2).
RED_ZONE = 128
#: Stack a relocation may use below the lower of the original's entry and exit RSP.  The tracer's own int3
#: already pushed an interrupt frame and ``pt_regs`` (168 bytes) below the entry RSP on the same stack, so
#: that much is known to be there.
STACK_ALLOWANCE = 128


class Context(str, Enum):
    """The privilege level the probed code runs at, from its address."""

    KERNEL = "CPL 0"
    USER = "CPL 3"

    @classmethod
    def of(cls, address: int) -> "Context":
        return cls.KERNEL if address >= KERNEL_HALF else cls.USER

    @property
    def stack_range(self) -> tuple[int, int]:
        """Where a stack of this context lies: its half of the canonical address space, a page from either end."""
        return (KERNEL_HALF, (1 << 64) - 0x1000) if self is Context.KERNEL else (0x1000, (1 << 47) - 0x1000)


@dataclass(frozen=True)
class Machine:
    """The machine a relocation runs in: its context, and at CPL 0 whether the kernel may enforce IBT (every
    Linux kernel may: Debian 6.12 does; FreeBSD, kinst's kernel, does not).  ``Machine.at(T)`` is the
    default: the context of the half of the address space the relocated code runs in (SMEP keeps CPL 0 from
    running user pages, and CPL 3 cannot run kernel ones, so T's half is the code's privilege level).  A tracer model says its own (uprobes and
    fasttrap run user code; kinst a kernel without IBT)."""

    context: Context
    kernel_ibt: bool = True

    @classmethod
    def at(cls, address: int) -> "Machine":
        """The machine code at ``address`` runs in: the context of its half (one value per context)."""
        return _AT[Context.of(address)]

    @property
    def key(self) -> bytes:
        """One byte for cache keys: k (CPL 0, IBT possible), K (CPL 0, no IBT), u (CPL 3)."""
        if self.context is Context.USER:
            return b"u"
        return b"k" if self.kernel_ibt else b"K"


USER = Machine(Context.USER)
KERNEL_WITHOUT_IBT = Machine(Context.KERNEL, kernel_ibt=False)
_AT = {Context.KERNEL: Machine(Context.KERNEL), Context.USER: USER}  # ``Machine.at``'s answers


class Treatment(str, Enum):
    OBLIGATION = "obligation"
    PRECONDITION = "precondition"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Row:
    """One input or output of running relocated code: where (``contexts``), how it is treated, by which
    mechanism, and why (``source``: the manual section or kernel file that says what the machine does)."""

    key: str
    what: str
    contexts: tuple[Context, ...]
    treatment: Treatment
    mechanism: str
    source: str
    reason: str


BOTH = (Context.KERNEL, Context.USER)
O, P, U = Treatment.OBLIGATION, Treatment.PRECONDITION, Treatment.UNKNOWN

MACHINE_MODEL: tuple[Row, ...] = (
    Row("registers", "general-purpose registers, rip, fs/gs bases", BOTH, O, "smt.items",
        "SDM Vol. 1 §3.4", "every register either side writes is compared"),
    Row("flags", "RFLAGS OF SF ZF AF CF PF, DF, AC, ID", BOTH, O, "smt.items (flags through angr's helpers)",
        "SDM Vol. 1 §3.4.3", "compared as flags; a form whose flags VEX gets wrong is loose (form table)"),
    Row("vector-state", "xmm/ymm/zmm and their upper bits, MXCSR control", BOTH, O,
        "smt.items; semantics.ZMM_HI; admission (loose forms)", "SDM Vol. 1 §15.5",
        "a VEX write zeroes zmm bits 511:256; MXCSR status is loose"),
    Row("x87-state", "x87 FSW, tags, stack; MMX", BOTH, U, "admission (x87 forms never validated)",
        "SDM Vol. 1 §8.1", "VEX does not model the x87 status and tag words"),
    Row("memory", "every byte of memory outside tracer memory", BOTH, O, "smt.items (memory at x)",
        "SDM Vol. 3 §9.2", "all addresses, symbolic"),
    Row("memory-events", "reads and writes in program order, with their widths; fences", BOTH, O,
        "smt.event_conditions", "SDM Vol. 3 §9.1-9.2", "a concurrent observer sees order, width and tearing"),
    Row("atomicity", "LOCK and implicitly locked operations", BOTH, O, "atomicity.check_atomicity",
        "SDM Vol. 3 §9.1.2", "a sequential semantics cannot see a lost update"),
    Row("features", "CPUID features the code needs", BOTH, O, "admission (extra_features)",
        "SDM Vol. 2 ch. 3 (CPUID feature flags)", "a feature the original does not need raises #UD on a CPU without it"),
    Row("vendor", "Intel and AMD decoding", BOTH, O, "admission (vendor_split)", "AMD APM Vol. 3 §1.2; SDM Vol. 2",
        "0x66 on a near branch, REX.W on far transfers decode differently"),
    Row("fault-vector", "which exception an instruction raises: #DE, #UD, #GP alignment", BOTH, O,
        "smt.items (fault)", "SDM Vol. 2, each instruction's 64-Bit Mode Exceptions",
        "the first fault on each side is compared by vector"),
    Row("fault-segment", "#SS(0) or #GP(0) for a non-canonical address: the access's segment", BOTH, O,
        "machine_model.compare_accesses", "SDM Vol. 3 §6.15 (#SS, #GP); Vol. 1 §3.3.7.1",
        "an access through SS (rsp or rbp base, push, pop, call, ret) raises #SS, any other #GP: a user "
        "process sees SIGBUS or SIGSEGV"),
    Row("fault-error-code", "the page-fault error code's W bit: a read-modify-write faults as a write", BOTH, O,
        "machine_model.compare_accesses", "SDM Vol. 3 §4.7",
        "a read-modify-write instruction checks write permission at its read; a load followed by a store "
        "faults as a read first"),
    Row("fault-at-t", "a fault raised at T instead of A", BOTH, P, "the tracer's fault handler",
        "Linux kprobe_fault_handler, uprobes arch_uprobe_xol_was_trapped",
        "the tracer maps T back to A and restores the registers it saved"),
    Row("alignment-check", "#AC at CPL 3 with RFLAGS.AC and CR0.AM set", (Context.USER,), O,
        "machine_model.tracer_alignment, smt.event_conditions", "SDM Vol. 3 §6.15 (Interrupt 17)",
        "the relocation's own accesses (save slots, an absolute jump's qword) must be naturally aligned; the "
        "original's keep their widths"),
    Row("alignment-check-kernel", "#AC at CPL 0", (Context.KERNEL,), O, "none needed",
        "SDM Vol. 3 §6.15", "alignment checking applies at CPL 3 only (RFLAGS.AC is SMAP's override at CPL 0)"),
    Row("single-step-entry", "RFLAGS.TF set when the relocation starts", BOTH, P, "the tracer",
        "SDM Vol. 3 §17.3.1.4; Linux uprobes (saved TF), kprobes (int3 handler)",
        "the tracer runs the relocation with TF clear, or steps it as one instruction"),
    Row("single-step-set", "TF set by popf or iret: the trap follows the next instruction", BOTH, O,
        "machine_model.check_machine", "SDM Vol. 3 §17.3.1.4; Vol. 2 POPF",
        "in the relocation the next instruction is its own, not A+len's: the trap fires one instruction early"),
    Row("interrupt-shadow", "sti, mov ss, pop ss: interrupts and debug traps held off for one instruction",
        BOTH, O, "machine_model.check_machine", "SDM Vol. 2 STI, MOV (MOV SS), Vol. 3 §6.8.3",
        "the shadow covers the relocation's next instruction instead of A+len's"),
    Row("data-breakpoints", "a data breakpoint (DR0-3) on an access the relocation makes", BOTH, P,
        "the tracer", "SDM Vol. 3 §17.2.4",
        "the #DB follows the accessing instruction; its handler sees the trampoline's rip and registers"),
    Row("interrupt-frame", "an interrupt or exception at CPL 0 between two instructions pushes its frame and "
        "pt_regs below RSP on the current stack", (Context.KERNEL,), O, "smt.stack_exposure",
        "SDM Vol. 3 §6.14.2; Linux arch/x86/entry/entry_64.S",
        "the kernel has no red zone: data below RSP at any boundary is lost, and RSP must point into the stack"),
    Row("signal-frame", "a signal at CPL 3 between two instructions writes its frame below RSP-128", (Context.USER,),
        O, "smt.stack_exposure (with the 128-byte red zone)", "System V ABI §3.2.2; Linux setup_rt_frame",
        "data more than 128 bytes below RSP at any boundary is lost"),
    Row("stack-room", "stack used below RSP by the relocation", BOTH, P, "smt.stack_exposure",
        "Linux: the int3 handler ran on the same stack",
        f"at most {STACK_ALLOWANCE} bytes below the original's lowest RSP, which the tracer's own trap frame used"),
    Row("ibt-kernel", "IBT at CPL 0: an indirect jmp or call must land on endbr64 (notrack not honoured)",
        (Context.KERNEL,), O, "machine_model.added_indirect_branches", "SDM Vol. 1 §18.3; Linux arch/x86/kernel/cet.c",
        "the Debian 6.12 kernel enforces IBT: an indirect branch the original does not make has a target the "
        "checker cannot show to be endbr64"),
    Row("ibt-emulated-target", "IBT and an emulated indirect call or jmp at CPL 0", (Context.KERNEL,), P,
        "machine_model.check_machine", "SDM Vol. 1 §18.3; Linux exc_control_protection (ibt=warn, ibt=fatal)",
        "the original's indirect branch lands on an endbr64, as every indirect-branch target of a kernel that "
        "runs with IBT does: the tracer's emulation sets rip without the check the CPU makes"),
    Row("ibt-kernel-off", "a kernel that enforces no IBT", (Context.KERNEL,), P, "machine_model.added_indirect_branches",
        "FreeBSD amd64 (kinst's kernel): no kernel IBT",
        "said by the caller (a tracer model of a kernel without IBT): an added indirect branch assumes IBT is off"),
    Row("ibt-user", "IBT at CPL 3", (Context.USER,), P, "machine_model.added_indirect_branches", "Linux 6.x: no user IBT",
        "Linux enables only shadow stacks for user space; an added indirect branch assumes user IBT is off"),
    Row("shadow-stack", "the shadow stack: near call pushes, near ret pops and compares", BOTH, O,
        "machine_model.compare_shadow_stacks", "SDM Vol. 1 §18.2; Linux arch/x86/kernel/shstk.c",
        "a call turned into push+jmp, or a ret into pop+jmp, leaves the shadow stack one entry off: the next "
        "ret raises #CP"),
    Row("shadow-stack-emulation", "an emulated call or ret and the shadow stack", BOTH, P, "the tracer",
        "Linux uprobes: shstk_push/shstk_pop in call and ret emulation",
        "the tracer's emulation pushes or pops the shadow stack too where one is enabled"),
    Row("kernel-vector-state", "vector, mask and x87 registers at CPL 0", (Context.KERNEL,), O,
        "machine_model.added_vector_writes", "Linux arch/x86/kernel/fpu/core.c (kernel_fpu_begin, irq_fpu_usable)",
        "outside kernel_fpu_begin/end they hold a task's user state: an interrupt that uses the FPU saves them "
        "as that state, so a relocation may write none the original does not write"),
    Row("cpl-change", "far transfers, interrupts, system calls, privileged and I/O instructions", BOTH, U,
        "policy (unclassified-flow) and the form table (never validated in user mode)", "SDM Vol. 2",
        "their effects on CS, SS, the IDT and the privilege level are outside the semantics"),
    Row("control-state", "control registers, MSRs, XINUSE, the TSC", BOTH, U,
        "the form table (no user-mode instruction reads or loads them)", "SDM Vol. 3 ch. 2",
        "state no user-mode judge can see; an instruction touching it has no validated form"),
)

ROWS = {r.key: r for r in MACHINE_MODEL}


# ---------------------------------------------------------------------------
# What each instruction does to the machine
# ---------------------------------------------------------------------------

_INFO = iced.InstructionInfoFactory()
_RSP_REGS = frozenset({iced.Register.RSP, iced.Register.ESP, iced.Register.SP, iced.Register.SPL})
_WRITE = frozenset({iced.OpAccess.WRITE, iced.OpAccess.COND_WRITE, iced.OpAccess.READ_WRITE,
                    iced.OpAccess.READ_COND_WRITE})
#: The segment classes a fault tells apart: a non-canonical address through SS raises #SS, through any other
#: segment (fs and gs included: their bases are added first) #GP.  In 64-bit mode the CS, DS, ES and SS
#: overrides are ignored (SDM Vol. 1 §3.3.7.1; measured on this CPU: ``ds:8(%rsp)`` still raises #SS): the
#: segment is SS exactly when the base is rsp or rbp (or the access is the stack's own), unless an fs or gs
#: override names another.
_STACK_BASES = frozenset({iced.Register.RSP, iced.Register.RBP, iced.Register.ESP, iced.Register.EBP})
_FS_GS = frozenset({iced.Register.FS, iced.Register.GS})
_KIND = {iced.OpAccess.READ: "r", iced.OpAccess.COND_READ: "r", iced.OpAccess.WRITE: "w",
         iced.OpAccess.COND_WRITE: "w", iced.OpAccess.READ_WRITE: "rw", iced.OpAccess.READ_COND_WRITE: "rw"}
#: Instructions whose effect lands on the next instruction (rows single-step-set, interrupt-shadow).
_DEFERRED = {"popf": "single-step-set", "popfq": "single-step-set", "popfd": "single-step-set",
             "popfw": "single-step-set", "iret": "single-step-set", "iretd": "single-step-set",
             "iretq": "single-step-set", "sti": "interrupt-shadow"}
_SHADOW_MANAGEMENT = frozenset("incsspd incsspq rdsspd rdsspq saveprevssp rstorssp wrssd wrssq wrussd wrussq "
                               "setssbsy clrssbsy".split())


@dataclass(frozen=True)
class Access:
    """One memory access as the fault it can raise sees it: the segment class (``ss`` or ``flat``: #SS against
    #GP for a non-canonical address), the kind (``r``, ``w``, ``rw``: the page-fault error code's W bit) and
    the width."""

    segment: str
    kind: str
    size: int


@dataclass(frozen=True)
class MachineClasses:
    """What one instruction does that the machine model compares: its memory accesses (tracer memory left
    out), the deferred effect it has on the next instruction, its shadow-stack operation, whether it is an
    indirect branch (and has ``notrack``)."""

    accesses: tuple[Access, ...]
    deferred: str | None
    shadow: str | None  # "push", "pop", "far", "manage"
    indirect: str | None  # "jmp" or "call", with " notrack" when 0x3e prefixes it
    tracer_accesses: tuple[tuple[int, int], ...]  # (address, size) of accesses at constant tracer addresses
    vector_writes: frozenset[str] = frozenset()  # vector, mask, MMX and x87 registers written (full names)


_RE = iced.RegisterExt
_REGISTER_NAMES = {v: k.lower() for k, v in vars(iced.Register).items() if k.isupper() and isinstance(v, int)}
#: Instructions that load x87 or SSE control and status state, which iced lists as no register.
_X87_CONTROL = frozenset("ldmxcsr vldmxcsr fldcw fldenv frstor fxrstor fxrstor64 xrstor xrstor64 xrstors "
                         "xrstors64 fninit finit fnclex fclex emms femms vzeroupper vzeroall".split())


@lru_cache(maxsize=65536)
def _decoded(raw: bytes, address: int):
    return iced.Decoder(64, raw, ip=address).decode()


def machine_classes(raw: bytes, address: int, tracer_ranges: tuple[tuple[int, int], ...] = ()) -> MachineClasses:
    """The classes of ``raw`` at ``address``.  Remembered (a ``MachineClasses`` is frozen): by the bytes alone
    when they access no memory at an absolute address (no base, no index: RIP-relative operands are such
    addresses, as iced-x86 reports them), since only such an address, through ``tracer_ranges``, depends on
    where the bytes are; else the last few by bytes, address and ranges (``check_machine`` and ``one_step``
    both read a relocation's)."""
    raw = bytes(raw)
    hit = _ADDRESS_FREE.get(raw)
    if hit is not None:
        return hit
    opcode = _direct_branch_opcode(raw)
    if opcode is not None:  # a jump back, a jcc, a call: the same classes whatever its offset
        hit = _BRANCHES.get(opcode)
        if hit is None:
            hit = _BRANCHES[opcode] = _machine_classes(raw, address, tuple(tracer_ranges))[0]
        return hit
    classes, free = _machine_classes(raw, address, tuple(tracer_ranges))
    if free:
        if len(_ADDRESS_FREE) >= ADDRESS_FREE_LIMIT:
            _ADDRESS_FREE.clear()
        _ADDRESS_FREE[raw] = classes
    return classes


#: ``machine_classes`` remembered by bytes, up to this many (a proof reads its original's and its copy's in turn:
#: few are asked again later, and a worker's peak memory is the run's).
ADDRESS_FREE_LIMIT = 4096
_ADDRESS_FREE: dict[bytes, MachineClasses] = {}
_BRANCHES: dict[bytes, MachineClasses] = {}  # by the opcode bytes of a direct branch (``_direct_branch_opcode``)
#: The unprefixed direct relative branches by their first byte, with their length: call, jmp rel32 and
#: rel8, jcc rel8 (jcc rel32 is 0f 80-8f, six bytes).  None reads memory or names a register beyond rip and,
#: for call, the stack: its offset changes only its target, which no class holds.
_DIRECT_BRANCHES = {0xE8: 5, 0xE9: 5, 0xEB: 2, **{0x70 + cc: 2 for cc in range(16)}}


def _direct_branch_opcode(raw: bytes) -> bytes | None:
    """The opcode bytes of ``raw`` when it is exactly one unprefixed direct relative branch, else None."""
    if len(raw) == _DIRECT_BRANCHES.get(raw[0] if raw else -1):
        return raw[:1]
    if len(raw) == 6 and raw[0] == 0x0F and 0x80 <= raw[1] <= 0x8F:
        return raw[:2]
    return None


def classes_of(raw: bytes, address: int, tracer_ranges: tuple[tuple[int, int], ...] = ()) -> MachineClasses:
    """``machine_classes`` made afresh, with nothing remembered: the reference its memos are tested against."""
    return _classes(bytes(raw), address, tuple(tracer_ranges))[0]


def _classes(raw: bytes, address: int, tracer_ranges: tuple[tuple[int, int], ...]) -> tuple[MachineClasses, bool]:
    """(the classes, whether no access is at an absolute address)."""
    ins = _decoded(raw, address)
    name = MNEMONIC_NAMES.get(ins.mnemonic, "")
    accesses, tracer = [], []
    free = True
    for m in _INFO.info(ins).used_memory():
        kind = _KIND.get(m.access)
        if kind is None:
            continue
        size = iced.MemorySizeExt.size(m.memory_size)
        if m.base == iced.Register.NONE and m.index == iced.Register.NONE:
            free = False
            addr = m.displacement & ((1 << 64) - 1)
            if any(lo <= addr < lo + n for lo, n in tracer_ranges):
                tracer.append((addr, size))
                continue
        stack = m.segment not in _FS_GS and m.base in _STACK_BASES
        accesses.append(Access("ss" if stack else "flat", kind, size))
    deferred = _DEFERRED.get(name)
    if name == "mov" and ins.op_count and ins.op0_kind == iced.OpKind.REGISTER and ins.op0_register == iced.Register.SS:
        deferred = "interrupt-shadow"
    if name == "pop" and ins.op_count and ins.op0_kind == iced.OpKind.REGISTER and ins.op0_register == iced.Register.SS:
        deferred = "interrupt-shadow"
    fc = ins.flow_control
    shadow = None
    if name in _SHADOW_MANAGEMENT:
        shadow = "manage"
    elif fc in (iced.FlowControl.CALL, iced.FlowControl.INDIRECT_CALL):
        shadow = "far" if ins.is_call_far or ins.is_call_far_indirect else "push"
    elif fc == iced.FlowControl.RETURN:
        shadow = "far" if name in ("retf", "iret", "iretd", "iretq") else "pop"
    indirect = None
    if fc in (iced.FlowControl.INDIRECT_BRANCH, iced.FlowControl.INDIRECT_CALL) and not (
            ins.is_jmp_far_indirect or ins.is_call_far_indirect):
        indirect = "call" if fc == iced.FlowControl.INDIRECT_CALL else "jmp"
        if ins.segment_prefix == iced.Register.DS:
            indirect += " notrack"
    return MachineClasses(tuple(sorted(accesses, key=lambda a: (a.segment, a.kind, a.size))), deferred, shadow,
                          indirect, tuple(tracer), _vector_writes(ins)), free


_machine_classes = lru_cache(maxsize=256)(_classes)


def _vector_writes(ins) -> frozenset[str]:
    out = set()
    for r in _INFO.info(ins).used_registers():
        reg = r.register
        if r.access in _WRITE and (_RE.is_vector_register(reg) or _RE.is_k(reg) or _RE.is_mm(reg) or _RE.is_st(reg)):
            full = _RE.full_register(reg) if _RE.is_vector_register(reg) else reg
            out.add(_REGISTER_NAMES.get(full, str(full)))
    if MNEMONIC_NAMES.get(ins.mnemonic, "") in _X87_CONTROL:
        out.add("x87/mxcsr control")
    return frozenset(out)


def effect_classes(effects: tuple[Effect, ...]) -> tuple[Access, ...]:
    """The accesses an emulation program makes (``plan.effects``): its loads and pushes."""
    out = []

    def address_segment(a: Address) -> str:
        return "ss" if not a.segment and a.base in ("rsp", "rbp") else "flat"

    def visit(v) -> None:
        if isinstance(v, Load):
            out.append(Access(address_segment(v.address), "r", v.size))

    for e in effects:
        if isinstance(e, Let):
            visit(e.value)
        elif isinstance(e, Push):
            visit(e.value)
            out.append(Access("ss", "w", 8))
        elif isinstance(e, Jump):
            visit(e.to)
    return tuple(sorted(out, key=lambda a: (a.segment, a.kind, a.size)))


# ---------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MachineCheck:
    """The machine model's answer for one relocation.  ``problem``: why it cannot be proved (None: the rows
    this module checks hold); ``refutes``: the problem is a difference the machine shows (a ``refuted``
    verdict, with ``what``/``original``/``relocated`` for its counterexample), else ``unknown``;
    ``assumes``: the preconditions the verdict depends on, printed with it."""

    problem: str | None = None
    refutes: bool = False
    what: str = ""
    original: str = ""
    relocated: str = ""
    assumes: tuple[str, ...] = ()


def _difference(problem: str, what: str, original: str, relocated: str, assumes=()) -> MachineCheck:
    return MachineCheck(problem, True, what, original, relocated, tuple(assumes))


def check_machine(raw: bytes, at: int, code: bytes | None, effects: tuple[Effect, ...], tramp: int,
                  tracer_ranges: tuple[tuple[int, int], ...] = (), machine: Machine | None = None) -> MachineCheck:
    """The rows of ``MACHINE_MODEL`` decided from the instructions alone (the one that needs the symbolic
    stack pointer at each boundary, ``interrupt-frame``, is ``smt.stack_exposure``).  ``machine``: where the
    code runs (default ``Machine.at(tramp)``)."""
    machine = machine or Machine.at(tramp)
    context, kernel_ibt = machine.context, machine.kernel_ibt
    orig = machine_classes(raw, at)
    if code is None:
        return _check_effects(orig, effects, machine)
    ranges = tuple(tracer_ranges) or ((tramp, len(code)),)
    walk = reachable(code, tramp).instructions
    reloc = [(a, machine_classes(r, a, ranges)) for a, r in walk]
    assumes = [ROWS["fault-at-t"].reason]
    if len(walk) > 1:
        assumes += [ROWS["single-step-entry"].reason, ROWS["data-breakpoints"].reason]
    if orig.deferred:  # its copy is followed by at least the jump back
        row = ROWS[orig.deferred]
        return _difference(f"{row.what}: {row.reason} ({row.source})", orig.deferred, "after A+len's instruction",
                           "after the relocation's next instruction")
    for address, c in reloc:
        if c.deferred:  # the relocation's own: whether its effect is armed (TF popped as 1) is not decided here
            row = ROWS[c.deferred]
            return MachineCheck(f"not proved: the relocation's instruction at T+{address - tramp:#x} has an effect on "
                                f"the next instruction ({row.what}); {row.reason} ({row.source})")
    found = (compare_shadow_stacks(orig, [c for _, c in reloc])
             or added_vector_writes(orig, [c for _, c in reloc], context)
             or added_indirect_branches(orig, reloc, tramp, context, assumes, kernel_ibt)
             or compare_accesses(orig.accesses, tuple(a for _, c in reloc for a in c.accesses))
             or tracer_alignment(reloc, context, tramp))
    if found is not None:
        return found
    if context is Context.KERNEL:
        assumes.append(ROWS["stack-room"].reason)
    return _holds(tuple(assumes))


@lru_cache(maxsize=64)
def _holds(assumes: tuple[str, ...]) -> MachineCheck:
    """The answer that every row holds, under ``assumes`` (each once, in order); a few lists recur."""
    return MachineCheck(assumes=tuple(dict.fromkeys(assumes)))


def _check_effects(orig: MachineClasses, effects, machine: Machine) -> MachineCheck:
    assumes = [ROWS["fault-at-t"].reason]
    if orig.shadow in ("push", "pop"):
        assumes.append(ROWS["shadow-stack-emulation"].reason)
    if orig.indirect and machine.context is Context.KERNEL and machine.kernel_ibt:
        assumes.append(ROWS["ibt-emulated-target"].reason)
    found = compare_accesses(orig.accesses, effect_classes(effects))
    return found if found is not None else MachineCheck(assumes=tuple(assumes))


def compare_shadow_stacks(orig: MachineClasses, reloc: list[MachineClasses]) -> MachineCheck | None:
    ops = [c.shadow for c in reloc if c.shadow]
    if "manage" in ops or "far" in ops:
        row = ROWS["cpl-change"] if "far" in ops else ROWS["shadow-stack"]
        return MachineCheck(f"not proved: the relocation manages the shadow stack or transfers far ({row.source})")
    want = [orig.shadow] if orig.shadow in ("push", "pop") else []
    if sorted(ops) == sorted(want) or (want and ops and set(ops) == set(want)):
        return None
    row = ROWS["shadow-stack"]
    show = {"push": "a shadow-stack push (near call)", "pop": "a shadow-stack pop (near ret)"}
    return _difference(f"shadow stack: {row.reason} ({row.source})", "shadow stack",
                       show.get(orig.shadow, "no shadow-stack operation"),
                       ", ".join(show[o] for o in ops) or "no shadow-stack operation")


def added_vector_writes(orig: MachineClasses, reloc: list[MachineClasses], context: Context) -> MachineCheck | None:
    """Row kernel-vector-state: at CPL 0 the relocation writes no vector, mask, MMX or x87 register (nor their
    control state) that the original does not write."""
    if context is not Context.KERNEL:
        return None
    extra = set().union(*(c.vector_writes for c in reloc)) - orig.vector_writes if reloc else set()
    if not extra:
        return None
    row = ROWS["kernel-vector-state"]
    return MachineCheck(f"not proved: the relocation writes {', '.join(sorted(extra))}, which the original does not; "
                        f"{row.reason} ({row.source})")


def added_indirect_branches(orig: MachineClasses, reloc, tramp: int, context: Context, assumes: list,
                            kernel_ibt: bool = True) -> MachineCheck | None:
    """Rows ibt-kernel, ibt-kernel-off and ibt-user: an indirect jmp or call of the relocation that the
    original does not make (another kind, or ``notrack`` added or dropped)."""
    for address, c in reloc:
        if c.indirect is None or c.indirect == orig.indirect:
            continue
        if context is Context.USER or not kernel_ibt:
            assumes.append(ROWS["ibt-user" if context is Context.USER else "ibt-kernel-off"].reason)
            continue
        row = ROWS["ibt-kernel"]
        return MachineCheck(f"not proved: the relocation's indirect {c.indirect} at T+{address - tramp:#x} is not "
                            f"the original's; {row.reason} ({row.source})")
    return None


def compare_accesses(orig: tuple[Access, ...], reloc: tuple[Access, ...]) -> MachineCheck | None:
    """Rows fault-segment and fault-error-code.  Accesses are compared as multisets of (segment, kind)
    when both sides make the same number; a different number of accesses is a difference in the memory
    events, which the semantics compares (``smt.event_conditions``), and a read-modify-write split into a
    load and a store is caught here by its width in the multiset."""
    if orig == reloc:
        return None
    o_kinds = sorted((a.segment, a.kind) for a in orig)
    r_kinds = sorted((a.segment, a.kind) for a in reloc)
    if o_kinds == r_kinds:
        return None
    o_seg = sorted(a.segment for a in orig)
    r_seg = sorted(a.segment for a in reloc)
    if len(orig) == len(reloc) and o_seg != r_seg:
        row = ROWS["fault-segment"]
        return _difference(f"the fault a non-canonical address raises: {row.reason} ({row.source})", "fault",
                           _fault_names(orig), _fault_names(reloc))
    rmw_o = sum(a.kind == "rw" for a in orig)
    rmw_r = sum(a.kind == "rw" for a in reloc)
    if rmw_o != rmw_r:
        row = ROWS["fault-error-code"]
        return _difference(f"the page-fault error code: {row.reason} ({row.source})", "page-fault error code",
                           f"W=1 at the first access ({rmw_o} read-modify-write)" if rmw_o else "W=0 at a read",
                           f"W=1 at the first access ({rmw_r} read-modify-write)" if rmw_r else
                           "W=0 at the first access (a load before the store)")
    return None


def _fault_names(accesses: tuple[Access, ...]) -> str:
    names = {"ss": "#SS(0)", "flat": "#GP(0)"}
    return ", ".join(names[a.segment] for a in accesses) or "none"


def tracer_alignment(reloc, context: Context, tramp: int) -> MachineCheck | None:
    if context is not Context.USER:
        return None
    for address, c in reloc:
        for addr, size in c.tracer_accesses:
            if size in (2, 4, 8, 16) and addr % size:
                row = ROWS["alignment-check"]
                return _difference(f"alignment check: the relocation's {size}-byte access at {addr:#x} (T+"
                                   f"{addr - tramp:#x}) is not aligned; {row.reason} ({row.source})", "fault",
                                   "none", "#AC(0) when RFLAGS.AC is set")
    return None


def one_step(code: bytes, tramp: int, tracer_ranges: tuple[tuple[int, int], ...] = ()) -> bool:
    """Whether at most one of the relocation's reachable instructions is a *step*: one that writes rsp or
    accesses memory outside tracer memory (``tracer_ranges``, else the code itself).  Then at every boundary
    before the step the stack pointer and every byte outside tracer memory are the entry's, and at every
    boundary after it they are the step's final ones: an interrupt or signal there sees what it would see
    just before or just after the original, and the rows that look between instructions
    (``interrupt-frame``, ``signal-frame``) hold by construction.  The other instructions touch only
    registers (which an interrupt handler saves and restores) and tracer memory.  The IR identity fast path
    is sound for the machine only then; other relocations go to the symbolic check, which computes the
    stack pointer at every boundary (``smt.stack_exposure``)."""
    walk = reachable(code, tramp)
    if walk.problem is not None:
        return False
    ranges = tuple(tracer_ranges) or ((tramp, len(code)),)
    steps = 0
    for address, raw in walk.instructions:
        if raw == ABS_JUMP:
            continue
        ins = _decoded(raw, address)
        if machine_classes(raw, address, ranges).accesses or _writes_rsp(ins):
            steps += 1
    return steps <= 1




def _writes_rsp(ins) -> bool:
    return any(r.register in _RSP_REGS and r.access in _WRITE for r in _INFO.info(ins).used_registers())
