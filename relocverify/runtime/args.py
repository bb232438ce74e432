"""``--args SPEC``: the arguments of a kernel function, drawn at random per trial.

SPEC is comma-separated, one item per argument register (rdi, rsi, rdx,
rcx, r8, r9, in the SysV order the kernel uses):

  u64         a random 64-bit value
  u64:LO-HI   a random value in [LO, HI] (decimal or 0x hex)
  buf:N       a pointer to N random bytes
  str:N       a pointer to a NUL-terminated string of at most N bytes, drawn
              from a small alphabet so that comparisons often match
              (the N+1 bytes are reserved; the rest after the NUL are 0)

Buffers are laid out one after another, 16-byte aligned, in the context's
argument heap (``kernel.HEAP_SIZE`` bytes).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..errors import InputError
from ..inputs import parse_int
from .kernel import HEAP_SIZE

ARGUMENT_REGISTERS = ("rdi", "rsi", "rdx", "rcx", "r8", "r9")
STRING_ALPHABET = b"abc"
MAX_BUFFER = 4096


@dataclass(frozen=True)
class ArgSpec:
    kind: str  # 'u64' | 'buf' | 'str'
    lo: int = 0
    hi: int = (1 << 64) - 1
    size: int = 0


def _int(text: str, item: str) -> int:
    return parse_int(text.strip(), f"--args: {item!r}: a number")


def _item(item: str) -> ArgSpec:
    kind, _, rest = item.strip().partition(":")
    if kind == "u64" and not rest:
        return ArgSpec("u64")
    if kind == "u64":
        lo, sep, hi = rest.partition("-")
        if not sep:
            raise InputError(f"--args: {item!r}: write a range as u64:LO-HI")
        lo_v, hi_v = _int(lo, item), _int(hi, item)
        if not 0 <= lo_v <= hi_v < 1 << 64:
            raise InputError(f"--args: {item!r}: need 0 <= LO <= HI < 2**64")
        return ArgSpec("u64", lo_v, hi_v)
    if kind in ("buf", "str"):
        size = _int(rest, item) if rest else -1
        if not 0 <= size <= MAX_BUFFER:
            raise InputError(f"--args: {item!r}: write {kind}:N with 0 <= N <= {MAX_BUFFER}")
        return ArgSpec(kind, size=size)
    raise InputError(f"--args: {item!r} is not u64, u64:LO-HI, buf:N or str:N")


def parse_spec(text: str) -> tuple[ArgSpec, ...]:
    items = [i for i in (text or "").split(",") if i.strip()]
    if len(items) > len(ARGUMENT_REGISTERS):
        raise InputError(f"--args: {len(items)} arguments; at most {len(ARGUMENT_REGISTERS)} go in registers")
    specs = tuple(_item(i) for i in items)
    need = sum((s.size + 1 + 15) & ~15 for s in specs if s.kind != "u64")
    if need > HEAP_SIZE:
        raise InputError(f"--args: the buffers need {need} bytes; the argument heap has {HEAP_SIZE}")
    return specs


def draw(specs: tuple[ArgSpec, ...], rng: random.Random, heap: int) -> tuple[dict[str, int], dict[int, bytes]]:
    """(argument registers, heap contents to write) for one trial."""
    regs: dict[str, int] = {}
    memory: dict[int, bytes] = {}
    at = heap
    for reg, s in zip(ARGUMENT_REGISTERS, specs):
        if s.kind == "u64":
            regs[reg] = rng.randint(s.lo, s.hi)
            continue
        if s.kind == "buf":
            data = rng.randbytes(s.size)
        else:
            n = rng.randint(0, s.size)
            data = bytes(rng.choice(STRING_ALPHABET) for _ in range(n)) + bytes(s.size + 1 - n)
        regs[reg] = at
        memory[at] = data
        at += (len(data) + 1 + 15) & ~15
    return regs, memory
