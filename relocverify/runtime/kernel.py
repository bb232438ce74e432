"""A kernel image in unicorn, boot-patched as Linux 6.1 x86-64 patches itself.

``KernelMachine(image, sites, cpu_features)`` maps every allocated section of
the image at its link-time address (text, rodata, data; ``SHT_NOBITS``
sections such as bss as zeros), and per execution context (``Context``) a
copy of ``.data..percpu`` at the context's gs base, a stack, an argument
heap and a trampoline page.  Address translation is ``UC_TLB_VIRTUAL`` with
the identity TLB fill of ``concrete.machine`` (kernel addresses would
otherwise be cut to 52 bits).

Boot patches (``BootPatch``), each written with its kernel's byte recipe:

  fentry        ``call __fentry__`` -> the 5-byte NOP (ftrace_init, ftrace off)
  return_thunk  ``jmp __x86_return_thunk`` -> ``ret; int3...`` (apply_returns),
                unless RETHUNK is in the feature set
  retpoline     ``call/jmp __x86_indirect_thunk_REG`` -> ``call/jmp *%REG`` and
                a NOP (apply_retpolines), unless RETPOLINE is in the feature
                set; the conditional form keeps its thunk call
  alternative   the replacement (its first call/jmp re-targeted, as
                ``kernel.variants`` computes it) and a NOP pad, when the
                feature bit is set (or clear, for ALT_NOT)

Not patched (the bytes on disk run): paravirt calls, static calls, jump
labels (their on-disk state), SMP lock prefixes (an SMP kernel), and the
NOP padding of alternatives that are not applied (optimize_nops is not
modelled).  Every patch records the variant name ``kernel.variants`` gives
the bytes it wrote, so a probe can say which variant is live.

Machine model: unicorn 2.1 (QEMU TCG) at CPL 0; every mapping is
read-write-execute (page protections, W^X and rodata are not modelled); an
access outside the mappings is a fault, not a page fault handled by the
kernel; no interrupts are delivered, exceptions stop the run with their
vector; writes to text are
followed by ``uc.ctl_remove_cache`` over the bytes written so that no stale
translation runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import iced_x86
from unicorn import (UC_ARCH_X86, UC_HOOK_TLB_FILL, UC_MODE_64, UC_PROT_ALL, UC_TLB_VIRTUAL, Uc, UcError)

from ..errors import InputError
from ..image.image import Image
from ..kernel.sites import SiteIndex, find_sites
from ..kernel.variants import NOP5, NoVariants, VariantFinder
from ..plan.plan import DEFAULT_TRAMP
from ..x86.registers import GPR64, MASK64

PAGE = 0x1000

#: Linux 6.1 arch/x86/include/asm/cpufeatures.h: name -> word * 32 + bit.
CPU_FEATURES: dict[str, int] = {
    "FPU": 0 * 32 + 0, "CX8": 0 * 32 + 8, "CMOV": 0 * 32 + 15, "CLFLUSH": 0 * 32 + 19, "MMX": 0 * 32 + 23,
    "FXSR": 0 * 32 + 24, "XMM": 0 * 32 + 25, "XMM2": 0 * 32 + 26,
    "SYSCALL": 1 * 32 + 11, "NX": 1 * 32 + 20, "RDTSCP": 1 * 32 + 27, "LM": 1 * 32 + 29,
    "CONSTANT_TSC": 3 * 32 + 8, "REP_GOOD": 3 * 32 + 16, "LFENCE_RDTSC": 3 * 32 + 18, "NOPL": 3 * 32 + 20,
    "ALWAYS": 3 * 32 + 21, "NONSTOP_TSC": 3 * 32 + 24,
    "XMM3": 4 * 32 + 0, "PCLMULQDQ": 4 * 32 + 1, "SSSE3": 4 * 32 + 9, "FMA": 4 * 32 + 12, "CX16": 4 * 32 + 13,
    "XMM4_1": 4 * 32 + 19, "XMM4_2": 4 * 32 + 20, "X2APIC": 4 * 32 + 21, "MOVBE": 4 * 32 + 22,
    "POPCNT": 4 * 32 + 23, "XSAVE": 4 * 32 + 26, "AVX": 4 * 32 + 28, "RDRAND": 4 * 32 + 30,
    "HYPERVISOR": 4 * 32 + 31,
    "RETPOLINE": 7 * 32 + 12, "RETPOLINE_LFENCE": 7 * 32 + 13,
    "FSGSBASE": 9 * 32 + 0, "BMI1": 9 * 32 + 3, "AVX2": 9 * 32 + 5, "SMEP": 9 * 32 + 7, "BMI2": 9 * 32 + 8,
    "ERMS": 9 * 32 + 9, "INVPCID": 9 * 32 + 10, "RTM": 9 * 32 + 11, "RDSEED": 9 * 32 + 18, "ADX": 9 * 32 + 19,
    "SMAP": 9 * 32 + 20, "CLFLUSHOPT": 9 * 32 + 23, "CLWB": 9 * 32 + 24,
    "XSAVEOPT": 10 * 32 + 0, "XSAVEC": 10 * 32 + 1, "XGETBV1": 10 * 32 + 2, "XSAVES": 10 * 32 + 3,
    "RETHUNK": 11 * 32 + 14, "UNRET": 11 * 32 + 15,
    "FSRM": 18 * 32 + 4,
}

#: A Skylake-class CPU with the return and retpoline mitigations off.
DEFAULT_CPU_FEATURES: tuple[str, ...] = (
    "FPU", "CX8", "CMOV", "CLFLUSH", "MMX", "FXSR", "XMM", "XMM2", "SYSCALL", "NX", "RDTSCP", "LM",
    "CONSTANT_TSC", "REP_GOOD", "NOPL", "ALWAYS", "NONSTOP_TSC", "XMM3", "PCLMULQDQ", "SSSE3", "FMA", "CX16",
    "XMM4_1", "XMM4_2", "MOVBE", "POPCNT", "XSAVE", "AVX", "RDRAND", "FSGSBASE", "BMI1", "AVX2", "SMEP", "BMI2",
    "ERMS", "INVPCID", "RDSEED", "ADX", "SMAP", "CLFLUSHOPT", "XSAVEOPT", "XSAVEC", "XGETBV1", "FSRM")

ALT_NOT = 0x8000  # 6.1: bit 15 of alt_instr.cpuid inverts the test

#: arch/x86/include/asm/nops.h (x86_nops), by length.
NOPS = {1: b"\x90", 2: b"\x66\x90", 3: b"\x0f\x1f\x00", 4: b"\x0f\x1f\x40\x00", 5: NOP5,
        6: b"\x66\x0f\x1f\x44\x00\x00", 7: b"\x0f\x1f\x80\x00\x00\x00\x00",
        8: b"\x0f\x1f\x84\x00\x00\x00\x00\x00"}

# Per-context regions, outside the image: direct-map, vmalloc and module addresses as the kernel uses them.
PERCPU_BASE = 0xFFFF888100000000
STACK_BASE = 0xFFFFC90000000000
HEAP_BASE = 0xFFFFC90010000000
TRAMP_BASE = DEFAULT_TRAMP  # module space, within rel32 reach of text
STRIDE = 0x100000  # between two contexts' regions
STACK_SIZE = 0x8000
HEAP_SIZE = 0x10000
RETURN_SENTINEL = 0xFFFFFFFFC00F0000  # the return address of a call into the kernel: running stops there


def parse_cpu_features(text: str | None) -> frozenset[str]:
    """``--cpu-features``: comma-separated names, ``default`` for the default set, ``-NAME`` to drop one."""
    names = set(DEFAULT_CPU_FEATURES) if text is None else set()
    for word in (text or "").split(","):
        word = word.strip().upper()
        if not word:
            continue
        if word == "DEFAULT":
            names |= set(DEFAULT_CPU_FEATURES)
            continue
        drop = word.startswith("-")
        name = word.lstrip("-+")
        if name not in CPU_FEATURES:
            raise InputError(f"--cpu-features: unknown feature {name!r}; choose from "
                             f"{', '.join(sorted(CPU_FEATURES))} (or 'default')")
        (names.discard if drop else names.add)(name)
    return frozenset(names)


@dataclass(frozen=True)
class Context:
    """An execution context (a thread, or a CPU for interrupts-off code): its own regions."""

    index: int
    tramp: int
    stack_top: int
    heap: int
    gs_base: int


@dataclass(frozen=True)
class BootPatch:
    kind: str
    address: int
    old: bytes
    new: bytes
    variant: str  # the name kernel.variants gives the instruction now at ``address``


def _fill_tlb(uc, vaddr: int, _access, entry, _data) -> bool:
    entry.paddr = vaddr & ~(PAGE - 1)
    entry.perms = UC_PROT_ALL
    return True


def _page_ranges(spans) -> list[tuple[int, int]]:
    """Merge (start, end) spans into page-aligned, non-overlapping ranges."""
    out: list[list[int]] = []
    for start, end in sorted((s & ~(PAGE - 1), (e + PAGE - 1) & ~(PAGE - 1)) for s, e in spans):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def nop_pad(size: int) -> bytes:
    out = b""
    while size > 0:
        n = min(size, 8)
        out += NOPS[n]
        size -= n
    return out


def _indirect(call: bool, reg: str) -> bytes:
    n = GPR64.index(reg)
    return (b"\x41" if n >= 8 else b"") + bytes([0xFF, (0xD0 if call else 0xE0) | (n & 7)])


@dataclass
class KernelMachine:
    """One unicorn instance holding the boot-patched kernel and ``contexts`` execution contexts."""

    image: Image
    cpu_features: frozenset[str] = frozenset(DEFAULT_CPU_FEATURES)
    contexts_wanted: int = 2
    sites: SiteIndex | None = None
    uc: Uc = field(init=False)
    contexts: tuple[Context, ...] = field(init=False)
    patches: dict[int, BootPatch] = field(init=False)

    def __post_init__(self) -> None:
        if self.sites is None:
            self.sites = find_sites(self.image)
        self.variants = VariantFinder(self.image)
        uc = self.uc = Uc(UC_ARCH_X86, UC_MODE_64)
        uc.ctl_set_tlb_mode(UC_TLB_VIRTUAL)
        uc.hook_add(UC_HOOK_TLB_FILL, _fill_tlb)
        self._map_image()
        self.contexts = tuple(self._map_context(i) for i in range(self.contexts_wanted))
        uc.mem_map(RETURN_SENTINEL, PAGE)
        uc.mem_write(RETURN_SENTINEL, b"\xcc" * PAGE)
        self.patches = {}
        self._boot_patch()

    # -- memory ---------------------------------------------------------------
    def _map_image(self) -> None:
        sections = [s for s in self.image.iter_sections() if s.alloc and s.size and s.address >= 1 << 63]
        for start, end in _page_ranges((s.address, s.end) for s in sections):
            self.uc.mem_map(start, end - start, UC_PROT_ALL)
        for s in sections:
            if s.data:
                self.uc.mem_write(s.address, bytes(s.data))

    def _map_context(self, i: int) -> Context:
        percpu = self.image.get_section(".data..percpu")
        gs = PERCPU_BASE + i * STRIDE * 4
        size = percpu.size if percpu is not None else PAGE
        self.uc.mem_map(gs, (size + PAGE - 1) & ~(PAGE - 1))
        if percpu is not None and percpu.data:
            self.uc.mem_write(gs, bytes(percpu.data))
        stack = STACK_BASE + i * STRIDE
        self.uc.mem_map(stack, STACK_SIZE)
        heap = HEAP_BASE + i * STRIDE
        self.uc.mem_map(heap, HEAP_SIZE)
        tramp = TRAMP_BASE + i * 2 * PAGE
        self.uc.mem_map(tramp & ~(PAGE - 1), PAGE)
        return Context(i, tramp, stack + STACK_SIZE - 64, heap, gs)

    def is_mapped(self, address: int, size: int = 1) -> bool:
        try:
            self.uc.mem_read(address, size)
            return True
        except UcError:
            return False

    def read(self, address: int, size: int) -> bytes:
        return bytes(self.uc.mem_read(address & MASK64, size))

    def write_code(self, address: int, data: bytes) -> None:
        """Write bytes that may have been translated, and drop their stale translations."""
        self.uc.mem_write(address, data)
        self.uc.ctl_remove_cache(address, address + len(data))

    def instruction_length(self, address: int) -> int:
        """The length of the live instruction at ``address`` (0: undecodable or unmapped)."""
        try:
            raw = self.read(address, 15)
        except UcError:
            return 0
        ins = iced_x86.Decoder(64, raw, ip=address).decode()
        return 0 if ins.is_invalid else ins.len

    # -- boot patching ----------------------------------------------------------
    def _feature_set(self, tag: int) -> bool:
        number = tag & ~ALT_NOT & 0xFFFF
        enabled = any(CPU_FEATURES[n] == number for n in self.cpu_features)
        return enabled != bool(tag & ALT_NOT)

    def _patch(self, kind: str, address: int, new: bytes, variant: str) -> None:
        old = self.read(address, len(new))
        if old != new:
            self.write_code(address, new)
            self.patches[address] = BootPatch(kind, address, old, new, variant)

    def _boot_patch(self) -> None:
        for site in self.sites.iter_sites("alternative"):
            if site.tag is not None and self._feature_set(site.tag):
                self._apply_alternative(site)
        if "RETPOLINE" not in self.cpu_features:
            for site in self.sites.iter_sites("retpoline"):
                self._apply_retpoline(site)
        if "RETHUNK" not in self.cpu_features:
            for site in self.sites.iter_sites("return_thunk"):
                if self.read(site.address, 1) == b"\xe9":
                    self._patch("return_thunk", site.address, b"\xc3" + b"\xcc" * (site.length - 1),
                                "ret (apply_returns)")
        for site in self.sites.iter_sites("fentry"):
            if self.read(site.address, 1) == b"\xe8":
                self._patch("fentry", site.address, NOP5, "nop5 (ftrace off)")

    def _apply_alternative(self, site) -> None:
        insns = self.variants.replacement_instructions(site)
        if isinstance(insns, NoVariants):
            return  # the kernel would copy bytes we cannot decode; leave the original
        repl = b"".join(raw for _, raw in insns)
        if len(repl) > site.length:
            return
        self._patch("alternative", site.address, repl + nop_pad(site.length - len(repl)),
                    f"replacement (cpuid {site.tag:#x})")

    def _apply_retpoline(self, site) -> None:
        raw = self.read(site.address, site.length)
        body = raw[1:] if raw[:1] == b"\x2e" else raw
        if len(body) != 5 or body[0] not in (0xE8, 0xE9):
            return  # the jcc form: patch_retpoline's jncc-over-jmp is not modelled; the thunk call runs
        target = (site.address + len(raw) + int.from_bytes(body[1:5], "little", signed=True)) & MASK64
        reg = self.variants.thunk_reg.get(target)
        if reg is None:
            return
        call = body[0] == 0xE8
        ind = _indirect(call, reg)
        self._patch("retpoline", site.address, ind + nop_pad(len(raw) - len(ind)),
                    f"{'call' if call else 'jmp'} *%{reg}")
