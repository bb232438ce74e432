"""Fuzzed inputs: a mishegos-style sliding window over a maximal candidate.

Each candidate is the longest shape an x86-64 instruction can take, with
every part drawn at random:

    legacy prefixes (0-4, from the four groups) | REX, or VEX2/VEX3/EVEX |
    opcode (1-3 bytes: op, 0f op, 0f 38 op, 0f 3a op) | ModRM | SIB |
    displacement (0, 1 or 4 bytes) | immediate (0, 1, 2, 4 or 8 bytes)

and, as mishegos's sliding mutator does, the 15-byte windows starting at
each of the candidate's first few offsets are the inputs, so decoders see
every suffix of a well-formed instruction (a prefix read as an opcode, a
ModRM read as an opcode, ...).  ``fuzz_samples(n, seed)`` is deterministic
in ``seed``: a failure replays with the same ``--fuzz N --seed S``.
"""

from __future__ import annotations

import random

from .samples import Unit

WINDOW = 15
FUZZ_ADDRESS = 0xFFFFFFFF81000000  # where every window is decoded: kernel text
_PREFIX_GROUPS = (b"\xf0\xf2\xf3", b"\x2e\x36\x3e\x26\x64\x65", b"\x66", b"\x67")


def candidate(rng: random.Random) -> bytes:
    """One maximal candidate instruction (up to 26 bytes)."""
    out = bytearray()
    for group in rng.sample(_PREFIX_GROUPS, rng.randint(0, 4)):
        out.append(rng.choice(group))
    kind = rng.choice(("none", "rex", "rex", "vex2", "vex3", "evex"))
    if kind == "rex":
        out.append(0x40 | rng.randrange(16))
    elif kind == "vex2":
        out += bytes((0xC5, rng.randrange(256)))
    elif kind == "vex3":
        out += bytes((0xC4, rng.randrange(256) & 0xE3 | rng.choice((1, 2, 3)), rng.randrange(256)))
    elif kind == "evex":
        out += bytes((0x62, rng.randrange(256) & 0xF3 | rng.choice((1, 2, 3)), rng.randrange(256) | 0x04,
                      rng.randrange(256)))
    escape = rng.choice((b"", b"", b"\x0f", b"\x0f\x38", b"\x0f\x3a")) if kind in ("none", "rex") else b""
    out += escape + bytes((rng.randrange(256),))
    modrm = rng.randrange(256)
    out.append(modrm)
    if modrm >> 6 != 3 and modrm & 7 == 4:
        out.append(rng.randrange(256))
    out += rng.randbytes(rng.choice((0, 1, 4, 4)))
    out += rng.randbytes(rng.choice((0, 1, 2, 4, 8)))
    return bytes(out)


def windows(cand: bytes, rng: random.Random, slides: int = 4) -> list[bytes]:
    """The 15-byte windows at the candidate's first ``slides`` offsets (random bytes after its end)."""
    tail = cand + rng.randbytes(WINDOW)
    return [tail[i:i + WINDOW] for i in range(min(slides, len(cand)))]


def fuzz_unit(n: int, seed: int) -> Unit:
    """``n`` fuzzed 15-byte windows, all at ``FUZZ_ADDRESS``."""
    rng = random.Random(seed)
    unit = Unit(f"fuzz(n={n},seed={seed})")
    while unit.instructions < n:
        for w in windows(candidate(rng), rng):
            if unit.instructions < n:
                unit.add(FUZZ_ADDRESS, w)
    return unit
