"""Run one instruction on this machine's CPU: the third concrete oracle, beside unicorn and VEX.

* ``refusal(decoded)`` says whether an instruction is safe to run here in
  user mode: ``None``, or the reason of the first row of ``REFUSED`` that
  matches it;
* ``sample_states(decoded, rng, n)`` draws input states whose memory
  accesses (explicit ones, and the stack of push/pop, rsi/rdi of string
  instructions) all fall inside ``ARENA``;
* ``run_native(raw, states, at)`` runs the instruction once per state and
  returns ``Outcome`` values that compare field by field with
  ``machine.run_original(raw, at, state)``.

Machine model (what a native outcome assumes):

* The instruction runs in a forked child process, in user mode, at
  ``native_address(raw)`` inside a hand-written harness
  (``native_harness``) that loads the 16 GPRs, RFLAGS (CF PF AF ZF SF OF
  DF; bit 1), MXCSR and xmm0-15 from the state and stores them back.
  That address is ``NATIVE_AT``, except for a RIP-relative instruction,
  whose harness page is placed so that its target lands in the middle of
  the arena (refused when no user-space page does that).  Compare with
  unicorn at that same address.
* Direct branches and calls (jcc, jmp, call, loop, jrcxz with a
  displacement) run too: their target holds a landing pad that jumps to
  the harness's "taken" epilogue, so ``next_rip`` is the target or the
  fall-through, whichever the CPU took.  Indirect transfers and returns
  are refused.
* Memory: ``ARENA_SIZE`` bytes at ``ARENA``, mapped fresh in the child,
  hold the state's bytes there and 0 elsewhere (as unicorn's unnamed bytes
  read 0).  State bytes outside the arena are ignored; an access outside
  it faults.  ``Outcome.writes`` are the arena bytes whose value changed:
  a store of the value already there is invisible here (unicorn reports
  it), so compare writes with ``changed_writes``.
* A fault is the signal that killed the child: ``"signal SIGSEGV"``,
  ``SIGILL``, ``SIGFPE``, ``SIGBUS``, ``SIGTRAP``.  The remaining states run in a
  new child.  ``FAULT_VECTORS`` lists the unicorn vectors each signal stands for.
* Not modelled: x87, MMX, mask registers, ymm upper halves, segment
  registers and their bases, PKRU, XCR0 (instructions reading them are
  refused), and whatever else the kernel does between two instructions.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import pickle
import random
import signal
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import iced_x86 as iced

from ..x86.instruction import Instruction
from ..x86.registers import GPR64, MASK64, reg_family
from . import native_harness as H
from ..processes import REFUSED_EXIT, refused, refused_worker
from .cpu_identity import current_mask
from .outcome import CF, DF, OF, PF, SF, ZF, AF, RFLAGS_FIXED, MachineState, Outcome

ARENA = 0x10000000
ARENA_SIZE = 0x10000
CODE = 0x10100000
CODE_SIZE = 0x1000
CTX = 0x10200000
NATIVE_AT = CODE + H.harness(b"", CTX)[1]
MXCSR_DEFAULT = 0x1F80  # all exceptions masked, round to nearest
RFLAGS_INPUT = CF | PF | AF | ZF | SF | OF | DF
FAULT_VECTORS = {"SIGSEGV": ("#GP", "#PF", "#SS"), "SIGBUS": ("#AC", "#GP"), "SIGILL": ("#UD",),
                 "SIGFPE": ("#DE", "#XM", "#MF"), "SIGTRAP": ("#BP", "#DB")}

# ---------------------------------------------------------------------------
# What may run here
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """What the refusal rows look at: our decode and iced's."""

    decoded: Instruction
    ins: iced.Instruction

    def registers(self) -> list[int]:
        return [self.ins.op_register(i) for i in range(self.ins.op_count)
                if self.ins.op_kind(i) == iced.OpKind.REGISTER]

    def features(self) -> list[str]:
        return [_FEATURE_NAMES[f] for f in self.ins.cpuid_features()]


@dataclass(frozen=True)
class RefusedClass:
    """One class of instruction this oracle does not run, and why."""

    name: str
    matches: Callable[[Facts], bool]
    reason: str
    runnable: bool = False  # True: it would run, but its result is not a function of the inputs


def _ops(*names: str) -> Callable[[Facts], bool]:
    s = frozenset(names)
    return lambda f: f.decoded.opname in s


_PRIVILEGED = ("cli", "sti", "hlt", "in", "out", "insb", "insw", "insd", "outsb", "outsw", "outsd", "lgdt",
               "lidt", "lldt", "ltr", "wrmsr", "rdmsr", "swapgs", "sysret", "sysretq", "sysexit", "sysexitq",
               "iret", "iretd", "iretq", "invlpg", "wbinvd", "invd", "clts", "lmsw", "rdpmc", "xsetbv",
               "monitor", "mwait", "stac", "clac", "invpcid", "wrfsbase", "wrgsbase", "wrpkru")
_SYSTEM_READS = ("sgdt", "sidt", "sldt", "str", "smsw", "lar", "lsl", "verr", "verw", "xgetbv")
_NONDETERMINISTIC = ("rdtsc", "rdtscp", "rdrand", "rdseed", "rdpid", "cpuid", "rdfsbase", "rdgsbase", "rdpkru")
_XSTATE = ("fxsave", "fxsave64", "fxrstor", "fxrstor64", "xsave", "xsave64", "xsaveopt", "xsaveopt64", "xsavec",
           "xsavec64", "xsaves", "xsaves64", "xrstor", "xrstor64", "xrstors", "xrstors64", "vzeroall",
           "vzeroupper", "emms", "femms")
_KERNEL_ENTRY = ("syscall", "sysenter", "int", "int3", "into", "int1")
_X87_FEATURES = ("FPU", "FPU287", "FPU387", "MMX", "MMXEXT", "D3NOW", "D3NOWEXT")
_DIRECT_REGISTERS = {"cr": iced.RegisterExt.is_cr, "dr": iced.RegisterExt.is_dr, "tr": iced.RegisterExt.is_tr,
                     "segment": iced.RegisterExt.is_segment_register, "st": iced.RegisterExt.is_st,
                     "mm": iced.RegisterExt.is_mm, "k": iced.RegisterExt.is_k,
                     "ymm": iced.RegisterExt.is_ymm, "zmm": iced.RegisterExt.is_zmm}


def _uses(*kinds: str) -> Callable[[Facts], bool]:
    return lambda f: any(_DIRECT_REGISTERS[k](r) for r in f.registers() for k in kinds)


def _memory_outside_arena(f: Facts) -> bool:
    return not f.ins.is_ip_rel_memory_operand and any(m.base == iced.Register.NONE and m.index == iced.Register.NONE
               and not ARENA <= m.displacement < ARENA + ARENA_SIZE for m in _accesses(f.ins))


REFUSED: tuple[RefusedClass, ...] = (
    RefusedClass("privileged", lambda f: f.decoded.privileged or f.ins.is_privileged or _ops(*_PRIVILEGED)(f),
                 "privileged or system-changing (CPL 0 only, I/O ports, MSRs, fs/gs base, PKRU): #GP or worse in "
                 "user mode, where it would not run the instruction's semantics"),
    RefusedClass("control register", _uses("cr", "dr", "tr"), "mov to/from cr/dr/tr: privileged"),
    RefusedClass("kernel entry", _ops(*_KERNEL_ENTRY), "enters the kernel (syscall, sysenter, int n, int3, "
                 "int1, into): the kernel, not the instruction, decides what happens next"),
    RefusedClass("far transfer", lambda f: f.decoded.far, "far call/jmp/ret: loads CS"),
    RefusedClass("indirect transfer", lambda f: f.decoded.flow not in ("next", "exception", *_DIRECT_FLOWS),
                 "indirect branch, call or return: its target is data, which would have to land on a pad "
                 "(not built)"),
    RefusedClass("branch target unpadded", lambda f: f.decoded.flow in _DIRECT_FLOWS and _pad(f.decoded.raw) is None,
                 "a direct branch whose target cannot hold a landing pad: inside the instruction or the harness, "
                 "in the arena, or outside user space"),
    RefusedClass("fs/gs override", lambda f: f.decoded.segment in ("fs", "gs"),
                 "fs/gs segment override: fs is the host's thread pointer (Python's TLS), gs base is not modelled"),
    RefusedClass("segment register", _uses("segment"),
                 "reads or loads a segment register: selectors and descriptors are host state, and loading fs "
                 "breaks the host's TLS"),
    RefusedClass("rip-relative out of reach", lambda f: f.decoded.rip_relative and native_address(f.decoded.raw) is None,
                 "RIP-relative access whose target no user-space harness page can put in the arena "
                 "(displacement beyond the user address space, or within a page or two of the instruction, "
                 "where the harness's own code lies)"),
    RefusedClass("absolute address", _memory_outside_arena,
                 "an absolute memory address outside the arena: no register choice can move it"),
    RefusedClass("cpu lacks", lambda f: bool(_missing_features(f)),
                 "needs a CPUID feature this CPU does not have (/proc/cpuinfo flags, less those "
                 "RELOCVERIFY_CPU_FEATURES hides)"),
    RefusedClass("x87/mmx", lambda f: _uses("st", "mm")(f) or any(n in _X87_FEATURES for n in f.features()),
                 "x87 or MMX: the harness neither loads nor reads back the x87 stack or the mm registers"),
    RefusedClass("wide vector", _uses("ymm", "zmm", "k"),
                 "ymm/zmm/mask registers: the harness loads and reads back only xmm0-15 (upper halves are host "
                 "state)"),
    RefusedClass("xstate", _ops(*_XSTATE),
                 "saves, restores or clears state beyond the modelled registers (x87, ymm upper halves, "
                 "XSTATE_BV)"),
    RefusedClass("system read", _ops(*_SYSTEM_READS),
                 "reads descriptor tables, segment limits, CR0 or XCR0: host state, not an input (UMIP faults "
                 "sgdt/sidt/sldt/str/smsw)"),
    RefusedClass("nondeterministic", _ops(*_NONDETERMINISTIC),
                 "runs in user mode, but its result is not a function of the inputs (time stamp counter, "
                 "random numbers, processor id, CPUID leaves, fs/gs base, PKRU)", runnable=True),
)


def refusal(decoded: Instruction) -> str | None:
    """None if ``decoded`` is safe to run natively here and comparable; else '<class>: <reason>'."""
    facts = Facts(decoded, _iced(decoded.raw))
    row = next((r for r in REFUSED if r.matches(facts)), None)
    return None if row is None else f"{row.name}: {row.reason}"


@lru_cache(maxsize=4096)
def _iced(raw: bytes, ip: int = NATIVE_AT) -> iced.Instruction:
    return iced.Decoder(64, raw, ip=ip).decode()


_RESERVED = ((ARENA, ARENA_SIZE), (CTX, 0x1000))
_DIRECT_FLOWS = ("conditional_branch", "unconditional_branch", "call")
_PAD_SIZE = 14  # the far pad: jmp *0(%rip); .quad target


@lru_cache(maxsize=4096)
def _pad(raw: bytes) -> tuple[int, bytes] | None:
    """Where a direct branch at NATIVE_AT lands and its pad bytes; (target, b"") when the fall-through
    already is the target; None if no pad can go there."""
    ins = _iced(raw)
    target, end = ins.near_branch_target, NATIVE_AT + ins.len
    if target == end:
        return target, b""
    pad = H.landing_pad(target, CODE)
    low, high = CODE + H.PAD_WINDOW[0], CODE + H.PAD_WINDOW[1]
    if CODE - _PAD_SIZE < target < CODE + CODE_SIZE:
        ok = low <= target and target + len(pad) <= high and (target + len(pad) <= NATIVE_AT or end + 5 <= target)
        return (target, pad) if ok else None
    if not USER_SPACE[0] <= target < USER_SPACE[1] - CODE_SIZE or any(
            lo < target + _PAD_SIZE and target < lo + n for lo, n in _RESERVED):
        return None
    return target, pad
USER_SPACE = (0x100000, 0x7FFF_FFFF_0000)


@lru_cache(maxsize=4096)
def native_address(raw: bytes) -> int | None:
    """Where ``run_native`` runs ``raw``: NATIVE_AT, or for RIP-relative bytes an address putting the target
    in the arena's middle (None if no user-space harness page can)."""
    ins = _iced(raw)
    if not ins.is_ip_rel_memory_operand or not _accesses(ins):  # lea, nop: the address is only computed
        return NATIVE_AT
    offset = NATIVE_AT - CODE
    delta = (ins.ip_rel_memory_address - NATIVE_AT + 2**63) % 2**64 - 2**63
    page = (ARENA + ARENA_SIZE // 2 - offset - delta) & ~(CODE_SIZE - 1)
    if not USER_SPACE[0] <= page < USER_SPACE[1] or any(lo < page + CODE_SIZE and page < lo + n
                                                         for lo, n in _RESERVED):
        return None
    return page + offset


# --- CPU features ------------------------------------------------------------

_FEATURE_NAMES = {v: k for k, v in vars(iced.CpuidFeature).items() if k.isupper()}
_ALWAYS = frozenset({"INTEL8086", "INTEL186", "INTEL286", "INTEL386", "INTEL486", "X64", "CPUID", "MULTIBYTENOP",
                     "PAUSE", "INTEL8086_ONLY"})
_FLAG_OF = {"SSE3": "pni", "LZCNT": "abm", "CMPXCHG16B": "cx16", "CX8": "cx8", "CLFSH": "clflush",
            "SHA": "sha_ni", "PREFETCHW": "3dnowprefetch", "RDTSC": "tsc", "FXSR": "fxsr", "MONITOR": "monitor",
            "LAHFSAHF": "lahf_lm", "SYSCALL": "syscall", "D3NOW": "3dnow", "MMXEXT": "mmxext",
            "FPU": "fpu", "FPU287": "fpu", "FPU387": "fpu", "SSE4_1": "sse4_1", "SSE4_2": "sse4_2",
            "AVX512F": "avx512f", "VMX": "vmx", "SMX": "smx", "SVM": "svm", "PCLMULQDQ": "pclmulqdq",
            "AVX512_IFMA": "avx512ifma", "AVX512_VBMI": "avx512vbmi"}


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags, as /proc/cpuinfo spells them."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def missing_features(names) -> list[str]:
    """The iced CPUID feature names among ``names`` that this CPU lacks, or that the feature mask
    (``RELOCVERIFY_CPU_FEATURES``, ``cpu_identity``) hides."""
    flags = current_mask().flags(cpu_flags())
    return [n for n in names if n not in _ALWAYS and _FLAG_OF.get(n, n.lower()) not in flags]


def _missing_features(f: Facts) -> list[str]:
    return missing_features(f.features())


# ---------------------------------------------------------------------------
# Input states
# ---------------------------------------------------------------------------

EDGE_VALUES = (0, 1, MASK64, 1 << 63, (1 << 63) - 1, 1 << 31, (1 << 31) - 1, 0xFFFFFFFF, 0x80, 0xFF, 0x7F, 0x8000)
EDGE_DOUBLES = (0.0, -0.0, 1.0, -1.0, 0.5, 2.5, -2.5, 3.5, 1e308, 5e-324, float("inf"), float("-inf"),
                float("nan"))
_STRING_OPS = frozenset("movsb movsw movsd movsq stosb stosw stosd stosq lodsb lodsw lodsd lodsq scasb scasw "
                        "scasd scasq cmpsb cmpsw cmpsd cmpsq".split())
_POPF = frozenset({"popf", "popfd", "popfq"})
_MARGIN = 128  # bytes of random content either side of an access


def _accesses(ins: iced.Instruction) -> list:
    info = iced.InstructionInfoFactory().info(ins)
    return [m for m in info.used_memory() if m.access != iced.OpAccess.NO_MEM_ACCESS]


def _reg_name(reg: int) -> str | None:
    if reg == iced.Register.NONE:
        return None
    return reg_family(_REGISTER_NAMES[iced.RegisterExt.full_register(reg)])


_REGISTER_NAMES = {v: k.lower() for k, v in vars(iced.Register).items() if k.isupper()}


def _random_gpr(rng: random.Random) -> int:
    return rng.choice(EDGE_VALUES) if rng.random() < 0.3 else rng.getrandbits(64)


def _random_lane(rng: random.Random) -> int:
    pick = rng.random()
    if pick < 0.4:
        return struct.unpack("<Q", struct.pack("<d", rng.choice(EDGE_DOUBLES + (rng.uniform(-1e3, 1e3),))))[0]
    if pick < 0.6:
        return struct.unpack("<Q", struct.pack("<ff", rng.uniform(-100, 100), rng.choice((2.5, -0.0, 1.5))))[0]
    return rng.getrandbits(64)


def _random_mxcsr(rng: random.Random) -> int:
    return MXCSR_DEFAULT | (rng.randrange(4) << 13) | (rng.choice((0, 0x8040)) if rng.random() < 0.2 else 0)


def sample_states(decoded: Instruction, rng: random.Random, n: int, vary_mxcsr: bool = True) -> list[MachineState]:
    """Up to ``n`` input states whose every memory access falls inside the arena.

    GPRs are random 64-bit values or edge values; the registers that form
    an address are then chosen so that the address lands in the middle of
    the arena (index registers small, base = target - disp - index*scale).
    A rep-prefixed string instruction gets rcx in 0..7; popf pops a value
    with TF and AC clear.  xmm lanes are random bits, edge doubles or
    floats.  MXCSR has every exception masked, a random rounding mode and
    sometimes FTZ+DAZ (``vary_mxcsr=False``: 0x1f80, the power-on value).
    The memory around each access is random bytes.  States whose accesses
    cannot all be placed are dropped.
    """
    ins = _iced(decoded.raw, native_address(decoded.raw) or NATIVE_AT)
    accesses = _accesses(ins)
    states = []
    for _ in range(n * 4):
        if len(states) == n:
            break
        state = _sample_one(decoded, ins, accesses, rng, vary_mxcsr)
        if state is not None:
            states.append(state)
    return states


def _sample_one(decoded, ins, accesses, rng, vary_mxcsr) -> MachineState | None:
    regs = {r: _random_gpr(rng) for r in GPR64}
    regs["rflags"] = RFLAGS_FIXED | (rng.getrandbits(16) & RFLAGS_INPUT)
    regs["mxcsr"] = _random_mxcsr(rng) if vary_mxcsr else MXCSR_DEFAULT
    for i in range(16):
        regs[f"xmm{i}"] = _random_lane(rng) | (_random_lane(rng) << 64)
    fixed: set[str] = set()  # registers already chosen for an address or a count
    if decoded.opname in _STRING_OPS and (decoded.rep or decoded.repne):
        regs["rcx"] = rng.randrange(8)
        fixed.add("rcx")
    memory: dict[int, int] = {}
    for m in accesses:
        base, index = _reg_name(m.base), _reg_name(m.index)
        mask = MASK64 if m.address_size == iced.CodeSize.CODE64 or m.address_size == 3 else 0xFFFFFFFF
        target = ARENA + ARENA_SIZE // 4 + rng.randrange(ARENA_SIZE // 2)
        if rng.random() < 0.8:
            target &= ~63
        if index and index not in fixed and index != base:
            regs[index] = rng.randrange(8)
            fixed.add(index)
        if base and base not in fixed:
            idx = regs[index] if index else 0
            regs[base] = (target - m.displacement - idx * m.scale) & MASK64
            fixed.add(base)
        address = _address(m, regs) & mask
        size = max(iced.MemorySizeExt.size(m.memory_size), 1)
        if not (ARENA + _MARGIN <= address and address + size + _MARGIN <= ARENA + ARENA_SIZE):
            return None
        span = 8 * 8 if decoded.opname in _STRING_OPS else 0
        for a in range(address - _MARGIN - span, address + size + _MARGIN + span):
            if ARENA <= a < ARENA + ARENA_SIZE:
                memory[a] = rng.getrandbits(8)
    if decoded.opname in _POPF:  # TF would single-step into SIGTRAP; AC would turn on alignment checks
        rsp = regs["rsp"]
        memory[rsp + 1] = memory.get(rsp + 1, 0) & ~0x01
        memory[rsp + 2] = memory.get(rsp + 2, 0) & ~0x04
    return MachineState(regs, memory)


def _address(m, regs: dict[str, int]) -> int:
    base, index = _reg_name(m.base), _reg_name(m.index)
    value = m.displacement + (regs[base] if base else 0) + (regs[index] * m.scale if index else 0)
    return value & MASK64


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4
MAP_PRIVATE, MAP_ANONYMOUS, MAP_FIXED_NOREPLACE = 0x02, 0x20, 0x100000
_FAULT_SIGNALS = (signal.SIGSEGV, signal.SIGILL, signal.SIGFPE, signal.SIGBUS, signal.SIGTRAP)


def changed_writes(outcome: Outcome, state: MachineState) -> dict[int, int]:
    """``outcome.writes`` without the bytes that kept their input value (what a native run can see)."""
    return {a: v for a, v in outcome.writes.items() if state.memory.get(a, 0) != v}


def run_native(raw: bytes, states: list[MachineState], at: int | None = None) -> list[Outcome]:
    """Run ``raw`` once per state on this CPU; one ``Outcome`` per state, in order.

    ``at`` is the address the outcome reports the instruction at
    (``next_rip = at + len(raw)``); it defaults to, and for a RIP-relative
    instruction must be, ``native_address(raw)``, where it runs.  The
    caller should have checked ``refusal``: this runs whatever it is
    given, in a child process, so a crash or a fault costs only that child.
    """
    where = native_address(raw)
    if where is None:
        raise ValueError(f"{raw.hex()}: RIP-relative target out of the arena's reach; see refusal()")
    if at is not None and where != NATIVE_AT and at & MASK64 != where:
        raise ValueError(f"{raw.hex()} is RIP-relative: it runs at {where:#x}, not {at:#x} (native_address)")
    at = where if at is None else at & MASK64
    outcomes: list[Outcome] = []
    while len(outcomes) < len(states):
        start = len(outcomes)
        results, status = in_child(lambda w: _child(raw, states[start:], w, where - (NATIVE_AT - CODE)))
        for regs, writes, taken in results:
            next_rip = (at + len(raw)) if not taken else at + _pad(raw)[0] - NATIVE_AT
            outcomes.append(Outcome(regs, next_rip & MASK64, writes))
        if len(outcomes) < len(states):
            outcomes.append(Outcome(dict(states[len(outcomes)].registers), at, {}, child_fault(status)))
    return outcomes


def child_fault(status: int) -> str:
    """What a child's wait status says about how it ended early (``SIGALRM``: its time limit)."""
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status))
        return "timeout" if sig is signal.SIGALRM else f"signal {sig.name}"
    return f"child exited with status {os.WEXITSTATUS(status)}"


def send(w: int, value) -> None:
    """In a child of ``in_child``: one result to the parent (a length-framed pickle)."""
    blob = pickle.dumps(value)
    os.write(w, struct.pack("<I", len(blob)) + blob)


def in_child(work: Callable[[int], None]) -> tuple[list, int]:
    """Run ``work(w)`` in a forked child, which ``send``s its results to the pipe ``w``: the results that
    arrived whole, in order, and the child's wait status.  A child that faults mid-way has sent the
    results before the fault; the caller reads the cause from the status (``child_fault``)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(r)
        code = 0
        try:
            work(w)
        except BaseException as exc:  # noqa: BLE001 - the parent sees the exit status
            code = REFUSED_EXIT if refused(exc) is not None else 3
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == REFUSED_EXIT:
        raise refused_worker()
    results, offset = [], 0
    while offset + 4 <= len(data):
        (size,) = struct.unpack_from("<I", data, offset)
        if offset + 4 + size > len(data):
            break
        results.append(pickle.loads(data[offset + 4:offset + 4 + size]))
        offset += 4 + size
    return results, status


def _map(address: int, size: int) -> None:
    got = _libc.mmap(address, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0)
    if got != address:
        raise OSError(ctypes.get_errno(), f"cannot map {size:#x} bytes at {address:#x}")


def _child(raw: bytes, states: list[MachineState], w: int, code_page: int) -> None:
    faulthandler.disable()
    for sig in _FAULT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    _map(ARENA, ARENA_SIZE)
    _map(code_page, CODE_SIZE)
    _map(CTX, 0x1000)
    code, offset = H.harness(raw, CTX)
    assert CODE + offset == NATIVE_AT
    ctypes.memmove(code_page, code, len(code))
    pad = _pad(raw) if _iced(raw).flow_control != iced.FlowControl.NEXT else None
    if pad and pad[1]:
        target, stub = pad
        far = not code_page <= target < code_page + CODE_SIZE
        first = target & ~(CODE_SIZE - 1)
        size = ((target + len(stub) - 1 - first) // CODE_SIZE + 1) * CODE_SIZE
        if far:
            _map(first, size)
        ctypes.memmove(target, stub, len(stub))
        if far and _libc.mprotect(first, size, PROT_READ | PROT_EXEC) != 0:
            raise OSError(ctypes.get_errno(), "mprotect")
    if _libc.mprotect(code_page, CODE_SIZE, PROT_READ | PROT_EXEC) != 0:
        raise OSError(ctypes.get_errno(), "mprotect")
    run = ctypes.CFUNCTYPE(None)(code_page)
    for state in states:
        image = bytearray(ARENA_SIZE)
        for a, b in state.memory.items():
            if ARENA <= a < ARENA + ARENA_SIZE:
                image[a - ARENA] = b & 0xFF
        before = bytes(image)
        ctypes.memmove(ARENA, before, ARENA_SIZE)
        regs = dict(state.registers)
        regs["rflags"] = (regs.get("rflags", 0) & RFLAGS_INPUT) | RFLAGS_FIXED
        regs.setdefault("mxcsr", MXCSR_DEFAULT)
        ctypes.memmove(CTX, H.pack_inputs(regs) + bytes(H.CONTEXT_SIZE - H.OUT_GPR), H.CONTEXT_SIZE)
        run()
        block = ctypes.string_at(CTX, H.CONTEXT_SIZE)
        out = H.unpack_outputs(block)
        taken = struct.unpack_from("<I", block, H.TAKEN)[0]
        after = ctypes.string_at(ARENA, ARENA_SIZE)
        writes = {} if after == before else _diff(before, after)
        send(w, (out, writes, taken))


def _diff(before: bytes, after: bytes) -> dict[int, int]:
    writes = {}
    for chunk in range(0, len(before), 256):
        if before[chunk:chunk + 256] != after[chunk:chunk + 256]:
            writes.update({ARENA + i: after[i] for i in range(chunk, chunk + 256) if before[i] != after[i]})
    return writes
