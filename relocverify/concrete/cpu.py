"""Run code on this machine's own CPU with the whole user-visible state in and out: the judge.

``run_on_cpu(program, states)`` places a ``Program`` (code regions at fixed
user-space addresses, landing pads at its exit addresses, data ranges) in a
forked child process and runs it once per ``CpuState``.  Each run

1. saves the host's extended state (``xsave``), fs and gs bases;
2. loads the state's x87, SSE, AVX, AVX-512 opmask and ZMM state with one
   ``xrstor`` (so FCW, FSW, the x87 tag word and stack, MXCSR, zmm0-31 and
   k0-7 are inputs), its fs and gs bases (``wrfsbase``/``wrgsbase``), RFLAGS
   (``popfq``) and the 16 GPRs;
3. jumps to the program's entry, and runs until control reaches a landing pad
   (``jmp *0(%rip)`` to a stub that records which exit it was);
4. stores the GPRs, RFLAGS, fs/gs bases and the whole extended state
   (``xsave``), then restores the host's.

An outcome is ``concrete.outcome.Outcome``: ``registers`` holds every GPR,
``rflags``, ``fs_base``, ``gs_base``, ``fcw``, ``fsw``, ``ftw`` (the
abridged tag byte), ``st0``-``st7`` (80 bits each), ``mxcsr``,
``zmm0``-``zmm31`` (512 bits, the low 128 of which are xmmN) and
``k0``-``k7``; ``next_rip`` is the exit address reached; ``writes`` are the
data bytes whose value changed; ``fault`` is the signal that killed the
child ("signal SIGSEGV", ...) or "timeout" (the program ran past
``STEP_SECONDS``).  After a fault the remaining states run in a new child.

Only the state this CPU has is loaded, stored and reported (``state_names``):
the judge reads XCR0 and CPUID (``identity``).  Without AVX-512 an outcome
has no ``zmm16``-``zmm31`` and no ``k0``-``k7`` (absent, not 0), and
``zmm0``-``zmm15`` hold ``XsaveLayout.vector_bits`` = 256 bits (128 without
AVX); a state's bits beyond these are not loaded (``trim_state``).  The
feature mask ``RELOCVERIFY_CPU_FEATURES`` (``concrete.cpu_identity``) makes
the judge behave so on a CPU that has the hidden features: xsave and xrstor
get a requested-feature bitmap without their components, so the CPU neither
loads nor stores that state, and ``Program.check`` refuses a program that
can reach an instruction needing a hidden feature (or one the CPU lacks)
rather than run it.

What this judge cannot see (say so wherever its answer is used): the order and
width of memory accesses (only final bytes), other CPUs, the instruction
pointer at a fault, the x87 FIP/FDP/FOP fields, and state no user-mode
instruction can read or load (control registers, MSRs, the TSC).
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import re
import signal
import struct
from dataclasses import dataclass, field
from functools import lru_cache

import iced_x86 as iced

from ..x86.registers import GPR64, MASK64
from .cpu_identity import (AVX512_STATE, AVX_STATE, FEATURE_MASK_ENV, CpuIdentity, current_mask, judge_flag,
                           unseen_state)
from .native import child_fault, cpu_flags, in_child, missing_features, send
from .outcome import MachineState, Outcome

PAGE = 0x1000
CTX = 0x7E000000  # the context block (in and out registers, three XSAVE areas); below 2^31 for disp32
CTX_SIZE = 0x4000
HARNESS = 0x7E010000  # the harness page: prologue, exit stubs, epilogue
MAX_EXITS = 48
STEP_SECONDS = 0.5
PAD = 14  # jmp *0(%rip); .quad stub

# Context block layout (bytes).
IN_GPR, IN_RFLAGS, IN_FS, IN_GS = 0x000, 0x080, 0x088, 0x090
OUT_GPR, OUT_RFLAGS, OUT_FS, OUT_GS = 0x0A0, 0x120, 0x128, 0x130
HOST_RSP, HOST_FS, HOST_GS, EXIT, ENTRY = 0x140, 0x148, 0x150, 0x158, 0x160
IN_XSAVE, OUT_XSAVE, HOST_XSAVE = 0x1000, 0x2000, 0x3000

#: RFLAGS bits a state may set: CF PF AF ZF SF DF OF, and AC (user mode may set it with popf).
RFLAGS_INPUT = 0x0CD5 | (1 << 18)
RFLAGS_FIXED = 0x2


# ---------------------------------------------------------------------------
# This CPU's extended-state layout
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class XsaveLayout:
    """The XSAVE components the judge loads and stores (XCR0 less a feature mask's: the requested-feature
    bitmap of its xsave/xrstor) and the standard-format offset of each (CPUID leaf 0Dh)."""

    xcr0: int
    size: int
    offsets: dict[int, int] = field(hash=False)

    @property
    def avx(self) -> bool:
        return bool(self.xcr0 & AVX_STATE)

    @property
    def avx512(self) -> bool:
        return self.xcr0 & AVX512_STATE == AVX512_STATE

    @property
    def vector_bits(self) -> int:
        """The width of zmm0-15 the judge loads and compares: 512, 256 (no AVX-512) or 128 (no AVX)."""
        return 512 if self.avx512 else 256 if self.avx else 128


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4
MAP_PRIVATE, MAP_ANONYMOUS, MAP_FIXED_NOREPLACE = 0x02, 0x20, 0x100000


def _run_snippet(code: bytes, argtypes, restype, *args):
    """Run a small position-independent System V function in this process (cpuid, xgetbv, rdgsbase)."""
    page = _libc.mmap(None, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    try:
        ctypes.memmove(page, code, len(code))
        _libc.mprotect(page, PAGE, PROT_READ | PROT_EXEC)
        return ctypes.CFUNCTYPE(restype, *argtypes)(page)(*args)
    finally:
        _libc.munmap(page, PAGE)


def cpuid(leaf: int, subleaf: int = 0) -> tuple[int, int, int, int]:
    """EAX, EBX, ECX, EDX of CPUID(leaf, subleaf) on this CPU."""
    out = (ctypes.c_uint32 * 4)()
    # push rbx; mov eax,edi; mov ecx,esi; mov r8,rdx; cpuid; mov [r8],eax; mov [r8+4],ebx;
    # mov [r8+8],ecx; mov [r8+12],edx; pop rbx; ret
    code = bytes.fromhex("53 89f8 89f1 4989d0 0fa2 418900 41895804 41894808 4189500c 5b c3")
    _run_snippet(code, (ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p), None, leaf, subleaf,
                 ctypes.addressof(out))
    return tuple(out)


def vendor() -> str:
    """'AMD', 'Intel' or the raw vendor string of this CPU."""
    raw = _signature()[0]
    return {"AuthenticAMD": "AMD", "GenuineIntel": "Intel"}.get(raw, raw)


@lru_cache(maxsize=1)
def xcr0() -> int:
    """XCR0 (xgetbv 0): the state components the OS enabled; requires XSAVE (every x86-64 CPU since 2011)."""
    out = (ctypes.c_uint32 * 2)()
    # mov ecx,edi; xgetbv; mov [rsi],eax; mov [rsi+4],edx; ret
    _run_snippet(bytes.fromhex("89f9 0f01d0 8906 895604 c3"), (ctypes.c_uint32, ctypes.c_void_p), None, 0,
                 ctypes.addressof(out))
    return out[0] | (out[1] << 32)


def xsave_layout() -> XsaveLayout:
    """The judge's XSAVE layout: XCR0 less the current feature mask's components (``cpu_identity``)."""
    return _layout(current_mask().xcr0(xcr0()))


@lru_cache(maxsize=8)
def _layout(enabled: int) -> XsaveLayout:
    offsets = {0: 0, 1: 160}
    for i in range(2, 10):
        if enabled & (1 << i):
            size, offset, _, _ = cpuid(0xD, i)
            offsets[i] = offset
    size = cpuid(0xD, 0)[1]
    return XsaveLayout(enabled, size, offsets)


@lru_cache(maxsize=1)
def _signature() -> tuple[str, int, int, int]:
    """CPUID's vendor string and display family, model and stepping (leaf 1, SDM Vol. 2A CPUID)."""
    _, b, c, d = cpuid(0)
    raw = struct.pack("<III", b, d, c).decode(errors="replace")
    eax = cpuid(1)[0]
    family, model, stepping = (eax >> 8) & 0xF, (eax >> 4) & 0xF, eax & 0xF
    if family in (0x6, 0xF):
        model |= ((eax >> 16) & 0xF) << 4
    if family == 0xF:
        family += (eax >> 20) & 0xFF
    return raw, family, model, stepping


def identity() -> CpuIdentity:
    """This CPU as the judge sees it now (the current feature mask applied); see ``cpu_identity``."""
    mask = current_mask()
    raw, family, model, stepping = _signature()
    flags = {f for f in cpu_flags() if judge_flag(f)}
    if has_fsgsbase():
        flags.add("fsgsbase")
    features = tuple(sorted(mask.flags(frozenset(flags))))
    return CpuIdentity(raw, family, model, stepping, features, mask.xcr0(xcr0()), mask.hidden)


def state_names() -> tuple[str, ...]:
    """The registers an outcome of ``run_on_cpu`` holds on this CPU, under the current mask."""
    layout = xsave_layout()
    names = GPR64 + ("rflags",) + (("fs_base", "gs_base") if has_fsgsbase() else ()) + X87_FIELDS + ("mxcsr",)
    names += VECTOR_NAMES if layout.avx512 else VECTOR_NAMES[:16]
    return names + (MASK_NAMES if layout.avx512 else ())


def unseen() -> tuple[str, ...]:
    """The register state this CPU (under the current mask) neither loads nor compares, in words."""
    return unseen_state(xsave_layout().xcr0)


def trim_state(state: MachineState) -> MachineState:
    """``state`` with only the vector and mask state this CPU loads: zmm0-15 (and their xmm/ymm names) cut
    to ``vector_bits`` and no zmm16-31 or k0-7 without AVX-512 (what an input means on this CPU); other
    names as they are."""
    layout = xsave_layout()
    if layout.avx512:
        return state
    keep = (1 << layout.vector_bits) - 1
    regs = {}
    for name, value in state.registers.items():
        vector_name = _VECTOR_NAME.match(name)
        if name in MASK_NAMES or vector_name and int(vector_name.group(1)) >= 16:
            continue
        regs[name] = value & keep if vector_name else value
    return MachineState(regs, state.memory)


@lru_cache(maxsize=1)
def has_fsgsbase() -> bool:
    """True if user mode may run rdfsbase/wrgsbase here (CPUID and the kernel's CR4.FSGSBASE)."""
    if not cpuid(7)[1] & 1:
        return False
    pid = os.fork()
    if pid == 0:
        try:
            _run_snippet(bytes.fromhex("f3480faec8 c3"), (), ctypes.c_uint64)  # rdgsbase rax; ret
            os._exit(0)
        except BaseException:  # noqa: BLE001 - the parent reads the exit status
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


# ---------------------------------------------------------------------------
# States and their XSAVE images
# ---------------------------------------------------------------------------

X87_FIELDS = ("fcw", "fsw", "ftw") + tuple(f"st{i}" for i in range(8))
VECTOR_NAMES = tuple(f"zmm{i}" for i in range(32))
MASK_NAMES = tuple(f"k{i}" for i in range(8))
_VECTOR_NAME = re.compile(r"[xyz]mm(\d+)$")
FCW_DEFAULT = 0x037F
MXCSR_DEFAULT = 0x1F80


@lru_cache(maxsize=1)
def mxcsr_mask() -> int:
    """The MXCSR bits this CPU allows (fxsave's MXCSR_MASK; 0xFFBF when the CPU reports 0)."""
    area = ctypes.create_string_buffer(512 + 16)
    base = (ctypes.addressof(area) + 15) & ~15
    # fxsave64 [rdi]; ret
    _run_snippet(bytes.fromhex("480fae07 c3"), (ctypes.c_void_p,), None, base)
    value = struct.unpack_from("<I", ctypes.string_at(base, 32), 28)[0]
    return value or 0xFFBF


def vector(registers: dict[str, int], i: int) -> int:
    """zmm_i of a register dict that may name it as zmmN, ymmN or xmmN (the widest name wins)."""
    for name, bits in ((f"zmm{i}", 512), (f"ymm{i}", 256), (f"xmm{i}", 128)):
        if name in registers:
            return registers[name] & ((1 << bits) - 1)
    return 0


def pack_xsave(registers: dict[str, int], layout: XsaveLayout) -> bytes:
    """The standard-format XSAVE image of a state (every enabled component present: XSTATE_BV = XCR0)."""
    area = bytearray(layout.size)
    struct.pack_into("<HHB", area, 0, registers.get("fcw", FCW_DEFAULT) & 0xFFFF, registers.get("fsw", 0) & 0xFFFF,
                     registers.get("ftw", 0) & 0xFF)
    struct.pack_into("<II", area, 24, registers.get("mxcsr", MXCSR_DEFAULT) & mxcsr_mask(), 0)
    for i in range(8):
        area[32 + 16 * i:32 + 16 * i + 10] = (registers.get(f"st{i}", 0) & ((1 << 80) - 1)).to_bytes(10, "little")
    for i in range(16):
        v = vector(registers, i)
        area[160 + 16 * i:176 + 16 * i] = (v & ((1 << 128) - 1)).to_bytes(16, "little")
        if 2 in layout.offsets:
            o = layout.offsets[2] + 16 * i
            area[o:o + 16] = ((v >> 128) & ((1 << 128) - 1)).to_bytes(16, "little")
        if 6 in layout.offsets:
            o = layout.offsets[6] + 32 * i
            area[o:o + 32] = (v >> 256).to_bytes(32, "little")
    if 7 in layout.offsets:
        for i in range(16, 32):
            o = layout.offsets[7] + 64 * (i - 16)
            area[o:o + 64] = vector(registers, i).to_bytes(64, "little")
    if 5 in layout.offsets:
        for i in range(8):
            struct.pack_into("<Q", area, layout.offsets[5] + 8 * i, registers.get(f"k{i}", 0) & MASK64)
    struct.pack_into("<QQ", area, 512, layout.xcr0, 0)
    return bytes(area)


def unpack_xsave(area: bytes, layout: XsaveLayout) -> dict[str, int]:
    """Registers from an XSAVE image; a component whose XSTATE_BV bit is clear reads as its initial state."""
    bv = struct.unpack_from("<Q", area, 512)[0]
    regs: dict[str, int] = {}
    if bv & 1:
        fcw, fsw, ftw = struct.unpack_from("<HHB", area, 0)
        regs.update(fcw=fcw, fsw=fsw, ftw=ftw)
        for i in range(8):
            regs[f"st{i}"] = int.from_bytes(area[32 + 16 * i:42 + 16 * i], "little")
    else:
        regs.update(fcw=FCW_DEFAULT, fsw=0, ftw=0, **{f"st{i}": 0 for i in range(8)})
    regs["mxcsr"] = struct.unpack_from("<I", area, 24)[0]
    for i in range(32):
        low = int.from_bytes(area[160 + 16 * i:176 + 16 * i], "little") if i < 16 and bv & 2 else 0
        mid = hi = 0
        if i < 16 and 2 in layout.offsets and bv & 4:
            o = layout.offsets[2] + 16 * i
            mid = int.from_bytes(area[o:o + 16], "little")
        if i < 16 and 6 in layout.offsets and bv & 0x40:
            o = layout.offsets[6] + 32 * i
            hi = int.from_bytes(area[o:o + 32], "little")
        if i >= 16:
            if 7 not in layout.offsets:
                continue
            o = layout.offsets[7] + 64 * (i - 16)
            regs[f"zmm{i}"] = int.from_bytes(area[o:o + 64], "little") if bv & 0x80 else 0
            continue
        regs[f"zmm{i}"] = low | (mid << 128) | (hi << 256)
    if 5 in layout.offsets:
        for i in range(8):
            regs[f"k{i}"] = struct.unpack_from("<Q", area, layout.offsets[5] + 8 * i)[0] if bv & 0x20 else 0
    return regs


# ---------------------------------------------------------------------------
# The harness page
# ---------------------------------------------------------------------------

_R = iced.Register
_GPR_REGS = (_R.RAX, _R.RCX, _R.RDX, _R.RBX, _R.RSP, _R.RBP, _R.RSI, _R.RDI,
             _R.R8, _R.R9, _R.R10, _R.R11, _R.R12, _R.R13, _R.R14, _R.R15)
_CALLEE_SAVED = (_R.RBX, _R.RBP, _R.R12, _R.R13, _R.R14, _R.R15)
_C = iced.Code
_FEATURE_NAMES = {v: k for k, v in vars(iced.CpuidFeature).items() if k.isupper()}
_NEAR_BRANCHES = (iced.OpKind.NEAR_BRANCH16, iced.OpKind.NEAR_BRANCH32, iced.OpKind.NEAR_BRANCH64)


def _mem(base, disp: int = 0, size: int = 8) -> iced.MemoryOperand:
    return iced.MemoryOperand(base, displ=disp, displ_size=size if disp else 0)


def _assemble(instructions: list[iced.Instruction], ip: int) -> bytes:
    encoder = iced.Encoder(64)
    out = b""
    for ins in instructions:
        encoder.encode(ins, ip + len(out))
        out += encoder.take_buffer()
    return out


def _xstate(code, base, rfbm: int = -1) -> list[iced.Instruction]:
    """``mov eax,rfbm; mov edx,rfbm>>32; <code> [base]``: xsave64/xrstor64 of the requested-feature bitmap's
    components (-1: every XCR0 component)."""
    low, high = (-1, -1) if rfbm == -1 else (rfbm & 0xFFFFFFFF, rfbm >> 32)
    return [iced.Instruction.create_reg_u32(_C.MOV_R32_IMM32, _R.EAX, low & 0xFFFFFFFF),
            iced.Instruction.create_reg_u32(_C.MOV_R32_IMM32, _R.EDX, high & 0xFFFFFFFF),
            iced.Instruction.create_mem(code, base)]


def _prologue(fsgs: bool, rfbm: int) -> list[iced.Instruction]:
    I = iced.Instruction
    out = [I.create_reg(_C.PUSH_R64, r) for r in _CALLEE_SAVED]
    out.append(I.create_reg_u64(_C.MOV_R64_IMM64, _R.RCX, CTX))
    out.append(I.create_mem_reg(_C.MOV_RM64_R64, _mem(_R.RCX, HOST_RSP), _R.RSP))
    if fsgs:
        out += [I.create_reg(_C.RDFSBASE_R64, _R.RAX), I.create_mem_reg(_C.MOV_RM64_R64, _mem(_R.RCX, HOST_FS), _R.RAX),
                I.create_reg(_C.RDGSBASE_R64, _R.RAX), I.create_mem_reg(_C.MOV_RM64_R64, _mem(_R.RCX, HOST_GS), _R.RAX)]
    out += _xstate(_C.XSAVE64_MEM, _mem(_R.RCX, HOST_XSAVE))
    out += _xstate(_C.XRSTOR64_MEM, _mem(_R.RCX, IN_XSAVE), rfbm)
    if fsgs:
        out += [I.create_reg_mem(_C.MOV_R64_RM64, _R.RAX, _mem(_R.RCX, IN_FS)), I.create_reg(_C.WRFSBASE_R64, _R.RAX),
                I.create_reg_mem(_C.MOV_R64_RM64, _R.RAX, _mem(_R.RCX, IN_GS)), I.create_reg(_C.WRGSBASE_R64, _R.RAX)]
    out.append(I.create_mem(_C.PUSH_RM64, _mem(_R.RCX, IN_RFLAGS)))
    out.append(I.create(_C.POPFQ))
    out.append(I.create_reg_reg(_C.MOV_R64_RM64, _R.RAX, _R.RCX))
    for k, reg in enumerate(_GPR_REGS):
        if reg not in (_R.RAX, _R.RSP):
            out.append(I.create_reg_mem(_C.MOV_R64_RM64, reg, _mem(_R.RAX, IN_GPR + 8 * k)))
    out.append(I.create_reg_mem(_C.MOV_R64_RM64, _R.RSP, _mem(_R.RAX, IN_GPR + 8 * 4)))
    out.append(I.create_reg_mem(_C.MOV_R64_RM64, _R.RAX, _mem(_R.RAX, IN_GPR)))
    out.append(I.create_mem(_C.JMP_RM64, iced.MemoryOperand(displ=CTX + ENTRY, displ_size=4)))
    return out


def _epilogue(fsgs: bool, rfbm: int) -> list[iced.Instruction]:
    """Entered with rax saved and rax = CTX; the state's other registers still live."""
    I = iced.Instruction
    out = [I.create_mem_reg(_C.MOV_RM64_R64, _mem(_R.RAX, OUT_GPR + 8 * k), reg)
           for k, reg in enumerate(_GPR_REGS) if reg != _R.RAX]
    out.append(I.create_reg_mem(_C.MOV_R64_RM64, _R.RSP, _mem(_R.RAX, HOST_RSP)))
    out += [I.create(_C.PUSHFQ), I.create_reg(_C.POP_R64, _R.RCX),
            I.create_mem_reg(_C.MOV_RM64_R64, _mem(_R.RAX, OUT_RFLAGS), _R.RCX)]
    if fsgs:
        out += [I.create_reg(_C.RDFSBASE_R64, _R.RCX), I.create_mem_reg(_C.MOV_RM64_R64, _mem(_R.RAX, OUT_FS), _R.RCX),
                I.create_reg(_C.RDGSBASE_R64, _R.RCX), I.create_mem_reg(_C.MOV_RM64_R64, _mem(_R.RAX, OUT_GS), _R.RCX),
                I.create_reg_mem(_C.MOV_R64_RM64, _R.RCX, _mem(_R.RAX, HOST_FS)), I.create_reg(_C.WRFSBASE_R64, _R.RCX),
                I.create_reg_mem(_C.MOV_R64_RM64, _R.RCX, _mem(_R.RAX, HOST_GS)), I.create_reg(_C.WRGSBASE_R64, _R.RCX)]
    out.append(I.create_reg_reg(_C.MOV_R64_RM64, _R.RCX, _R.RAX))
    out += _xstate(_C.XSAVE64_MEM, _mem(_R.RCX, OUT_XSAVE), rfbm)
    out += _xstate(_C.XRSTOR64_MEM, _mem(_R.RCX, HOST_XSAVE))
    out += [I.create_i32(_C.PUSHQ_IMM8, 2), I.create(_C.POPFQ)]  # clean flags for the host (DF, AC clear)
    out += [I.create_reg(_C.POP_R64, r) for r in reversed(_CALLEE_SAVED)]
    out.append(I.create(_C.RETNQ))
    return out


STUB_SIZE = 40


@lru_cache(maxsize=8)
def harness_page(fsgs: bool, rfbm: int = -1) -> tuple[bytes, int, int]:
    """(page bytes, offset of the first exit stub, offset of the epilogue).  ``rfbm``: the components the
    state's xrstor loads and the outcome's xsave stores (the host's are saved and restored whole)."""
    page = bytearray(b"\xcc" * PAGE)
    prologue = _assemble(_prologue(fsgs, rfbm), HARNESS)
    page[:len(prologue)] = prologue
    stubs = (len(prologue) + 63) & ~63
    epilogue_at = stubs + STUB_SIZE * MAX_EXITS
    epilogue = _assemble(_epilogue(fsgs, rfbm), HARNESS + epilogue_at)
    if epilogue_at + len(epilogue) > PAGE:
        raise AssertionError("harness page overflow")
    page[epilogue_at:epilogue_at + len(epilogue)] = epilogue
    I = iced.Instruction
    for i in range(MAX_EXITS):
        at = stubs + STUB_SIZE * i
        stub = I.create_mem_reg(_C.MOV_MOFFS64_RAX, iced.MemoryOperand(displ=CTX + OUT_GPR, displ_size=8), _R.RAX)
        code = _assemble([stub, I.create_reg_u64(_C.MOV_R64_IMM64, _R.RAX, CTX),
                          I.create_mem_u32(_C.MOV_RM32_IMM32, _mem(_R.RAX, EXIT), i + 1),
                          I.create_branch(_C.JMP_REL32_64, HARNESS + epilogue_at)], HARNESS + at)
        assert len(code) <= STUB_SIZE
        page[at:at + len(code)] = code
    return bytes(page), stubs, epilogue_at


def landing_pad(stub_address: int) -> bytes:
    """The bytes put at an exit address: ``jmp *0(%rip); .quad stub`` (no register or flag touched)."""
    return b"\xff\x25\x00\x00\x00\x00" + struct.pack("<Q", stub_address)


# ---------------------------------------------------------------------------
# Programs
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Program:
    """What a child maps and runs.

    ``code``: (address, bytes) regions, mapped read+execute; ``entry``: where
    the run starts; ``exits``: addresses that end a run (each gets a landing
    pad, which must not overlap code); ``data``: (address, size) ranges
    mapped read+write, initialised from a state's memory (0 elsewhere), whose
    changed bytes are the outcome's writes.  Every address must be a
    canonical user-space address away from ``CTX``/``HARNESS``, and no
    instruction the program can reach may need a feature the judge lacks
    (``lacking``)."""

    code: tuple[tuple[int, bytes], ...]
    entry: int
    exits: tuple[int, ...]
    data: tuple[tuple[int, int], ...]

    def check(self) -> None:
        if len(self.exits) > MAX_EXITS:
            raise ValueError(f"at most {MAX_EXITS} exits")
        spans = [(a, a + len(b)) for a, b in self.code] + [(e, e + PAD) for e in self.exits]
        spans.sort()
        for (a0, e0), (a1, _) in zip(spans, spans[1:]):
            if a1 < e0:
                raise ValueError(f"code or landing pads overlap at {a1:#x}")
        code_pages = _pages(spans)
        data_pages = _pages([(a, a + n) for a, n in self.data])
        reserved = _pages([(CTX, CTX + CTX_SIZE), (HARNESS, HARNESS + PAGE)])
        if code_pages & data_pages or (code_pages | data_pages) & reserved:
            raise ValueError("code, data and the harness must lie on separate pages")
        for p in code_pages | data_pages:
            if not 0x10000 <= p < 0x7FFF_FFFF_0000:
                raise ValueError(f"page {p:#x} is not in user space")
        lacking = self.lacking()
        if lacking:
            raise ValueError(lacking)

    def lacking(self) -> str:
        """'' when this CPU, under the current feature mask, has every CPUID feature the instructions the
        program can reach need (``reachable``); else which instruction needs what.  (A CPU without the
        feature would raise #UD; a masked one would run it on state the judge does not load: neither is
        the behaviour asked about.)"""
        for ins in self.reachable():
            missing = missing_features(_FEATURE_NAMES[f] for f in ins.cpuid_features())
            if missing:
                mask = current_mask()
                why = f" (hidden by {FEATURE_MASK_ENV}={mask.describe()})" if mask.hidden else ""
                return f"{ins} at {ins.ip:#x} needs {', '.join(missing)}, which this CPU lacks{why}"
        return ""

    def reachable(self) -> list[iced.Instruction]:
        """The instructions of the code regions that control can reach from ``entry``: fall-through and direct
        branch targets, to the first int3, return, indirect or undecodable one (bytes after an
        unconditional jump are data until a branch lands there)."""
        seen: dict[int, iced.Instruction] = {}
        todo = [self.entry]
        while todo:
            at = todo.pop()
            region = next(((a, bytes(raw)) for a, raw in self.code if a <= at < a + len(raw)), None)
            while region is not None and at not in seen and at < region[0] + len(region[1]):
                ins = iced.Decoder(64, region[1][at - region[0]:], ip=at).decode()
                if ins.code == _C.INVALID or at + ins.len > region[0] + len(region[1]):
                    break
                seen[at] = ins
                flow = ins.flow_control
                if flow in (iced.FlowControl.UNCONDITIONAL_BRANCH, iced.FlowControl.CONDITIONAL_BRANCH,
                            iced.FlowControl.CALL) and ins.op_count and ins.op0_kind in _NEAR_BRANCHES:
                    todo.append(ins.near_branch_target)
                if flow not in (iced.FlowControl.NEXT, iced.FlowControl.CONDITIONAL_BRANCH, iced.FlowControl.CALL,
                                iced.FlowControl.INDIRECT_CALL):
                    break
                at += ins.len
        return [seen[a] for a in sorted(seen)]


def _pages(spans) -> set[int]:
    pages = set()
    for lo, hi in spans:
        p = lo & ~(PAGE - 1)
        while p < hi:
            pages.add(p)
            p += PAGE
    return pages


def _map(address: int, size: int) -> None:
    got = _libc.mmap(address, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0)
    if got != address:
        raise OSError(ctypes.get_errno(), f"cannot map {size:#x} bytes at {address:#x}")


def _child(program: Program, states: list[MachineState], w: int) -> None:
    faulthandler.disable()
    for sig in (signal.SIGSEGV, signal.SIGILL, signal.SIGFPE, signal.SIGBUS, signal.SIGTRAP, signal.SIGALRM):
        signal.signal(sig, signal.SIG_DFL)
    fsgs = has_fsgsbase()
    layout = xsave_layout()
    page, stubs, _ = harness_page(fsgs, layout.xcr0)
    _map(CTX, CTX_SIZE)
    _map(HARNESS, PAGE)
    ctypes.memmove(HARNESS, page, PAGE)
    _libc.mprotect(HARNESS, PAGE, PROT_READ | PROT_EXEC)
    code_pages = sorted(_pages([(a, a + len(b)) for a, b in program.code] + [(e, e + PAD) for e in program.exits]))
    for p in code_pages:
        _map(p, PAGE)
        ctypes.memset(p, 0xCC, PAGE)
    for address, raw in program.code:
        ctypes.memmove(address, bytes(raw), len(raw))
    for k, e in enumerate(program.exits):
        pad = landing_pad(HARNESS + stubs + STUB_SIZE * k)
        ctypes.memmove(e, pad, PAD)
    for p in code_pages:
        _libc.mprotect(p, PAGE, PROT_READ | PROT_EXEC)
    data_pages = sorted(_pages([(a, a + n) for a, n in program.data]))
    for p in data_pages:
        _map(p, PAGE)
    run = ctypes.CFUNCTYPE(None)(HARNESS)
    host_fs = _run_snippet(bytes.fromhex("f3480faec0 c3"), (), ctypes.c_uint64) if fsgs else 0
    for state in states:
        regs = state.registers
        for p in data_pages:
            ctypes.memset(p, 0, PAGE)
        for a, b in state.memory.items():
            if any(lo <= a < lo + n for lo, n in program.data):
                ctypes.memset(a, b & 0xFF, 1)
        before = {p: ctypes.string_at(p, PAGE) for p in data_pages}
        block = bytearray(CTX_SIZE)
        for k, name in enumerate(GPR64):
            struct.pack_into("<Q", block, IN_GPR + 8 * k, regs.get(name, 0) & MASK64)
        struct.pack_into("<Q", block, IN_RFLAGS, (regs.get("rflags", 0) & RFLAGS_INPUT) | RFLAGS_FIXED)
        struct.pack_into("<QQ", block, IN_FS, regs.get("fs_base", host_fs) & MASK64, regs.get("gs_base", 0) & MASK64)
        struct.pack_into("<Q", block, ENTRY, program.entry)
        block[IN_XSAVE:IN_XSAVE + layout.size] = pack_xsave(regs, layout)
        ctypes.memmove(CTX, bytes(block), CTX_SIZE)
        signal.setitimer(signal.ITIMER_REAL, STEP_SECONDS)
        run()
        signal.setitimer(signal.ITIMER_REAL, 0)
        out = ctypes.string_at(CTX, CTX_SIZE)
        result = {name: struct.unpack_from("<Q", out, OUT_GPR + 8 * k)[0] for k, name in enumerate(GPR64)}
        result["rflags"] = struct.unpack_from("<Q", out, OUT_RFLAGS)[0]
        if fsgs:
            result["fs_base"], result["gs_base"] = struct.unpack_from("<QQ", out, OUT_FS)
        result.update(unpack_xsave(out[OUT_XSAVE:OUT_XSAVE + layout.size], layout))
        exit_id = struct.unpack_from("<I", out, EXIT)[0] - 1
        writes = {}
        for p in data_pages:
            after = ctypes.string_at(p, PAGE)
            if after != before[p]:
                writes.update({p + i: after[i] for i in range(PAGE) if after[i] != before[p][i]})
        send(w, (result, program.exits[exit_id], writes))


def run_on_cpu(program: Program, states: list[MachineState]) -> list[Outcome]:
    """Run ``program`` once per state on this CPU; one ``Outcome`` per state, in order (see the module doc)."""
    program.check()
    has_fsgsbase(), xsave_layout()  # asked here, where the answers are kept, not in each child (a fork apiece)
    outcomes: list[Outcome] = []
    while len(outcomes) < len(states):
        results, status = in_child(lambda w: _child(program, states[len(outcomes):], w))
        for regs, exit_address, writes in results:
            outcomes.append(Outcome(regs, exit_address, writes))
        if len(outcomes) < len(states):
            if not results and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3:
                raise RuntimeError("the CPU judge's child could not set up its pages (see concrete.cpu)")
            outcomes.append(Outcome(dict(states[len(outcomes)].registers), 0, {}, child_fault(status)))
    return outcomes
