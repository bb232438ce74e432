"""Register names and the 64-bit arithmetic every stage shares."""

from __future__ import annotations

MASK64 = 0xFFFFFFFFFFFFFFFF
#: Where x86-64 kernels are linked: the upper canonical half.
KERNEL_HALF = 0xFFFF800000000000
MASK32 = 0xFFFFFFFF

#: The general-purpose registers in encoding order (ModRM/REX number 0..15).
GPR64 = ("rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
         "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")

#: Segment-override prefix bytes and the segment each selects.
SEGMENT_PREFIXES = {0x2E: "cs", 0x36: "ss", 0x3E: "ds", 0x26: "es", 0x64: "fs", 0x65: "gs"}

_GPR_FAMILY: dict[str, str] = {}
for _fam, _names in {
    "rax": "al ah ax eax rax", "rbx": "bl bh bx ebx rbx", "rcx": "cl ch cx ecx rcx", "rdx": "dl dh dx edx rdx",
    "rsi": "sil si esi rsi", "rdi": "dil di edi rdi", "rsp": "spl sp esp rsp", "rbp": "bpl bp ebp rbp",
    "rip": "ip eip rip",
}.items():
    for _nm in _names.split():
        _GPR_FAMILY[_nm] = _fam
for _k in range(8, 16):
    for _suf in ("b", "w", "d", "", "l"):
        _GPR_FAMILY[f"r{_k}{_suf}"] = f"r{_k}"


def reg_family(name: str) -> str:
    """'eax' -> 'rax', 'r11d' -> 'r11'; other registers keep their name."""
    return _GPR_FAMILY.get(name, name)


def signed64(v: int) -> int:
    """``v`` mod 2^64 as a signed 64-bit value."""
    v &= MASK64
    return v - (1 << 64) if v >> 63 else v


def fits_s32(v: int) -> bool:
    return -(1 << 31) <= v < (1 << 31)


def is_canonical(address: int) -> bool:
    """True if bits 63..47 of ``address`` are all equal (48-bit virtual addresses)."""
    top = (address & MASK64) >> 47
    return top == 0 or top == (1 << 17) - 1
