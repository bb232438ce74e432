"""The kernel's own decoder (``x86.decoders.linux_insn``) as the Linux tracer models see it.

kprobes, optprobes and uprobes branch on ``struct insn`` as ``insn_decode()`` fills it:
the opcode bytes, ModRM, the immediate's size and value, ``addr_bytes``, the REX prefix,
``insn_rip_relative()`` and ``insn_has_emulate_prefix()``.  ``insn_of`` gives exactly those
facts (``linux_insn.Decoded``) for the bytes at an address, from the decoder built out of the
same kernel's source as the model (``linux-insn@6.1`` for the 6.1 models).

``boundaries`` is kprobes' ``can_probe`` walk over a whole function: the offsets
``insn_decode_kernel`` reaches from the function's start, decoded in one batch.
"""

from __future__ import annotations

from functools import lru_cache

from ..x86.decoders import linux_insn

MAX_INSN = 15
#: What Linux's decoder takes as an emulate prefix (arch/x86/lib/insn.c, ``insn_get_emulate_prefix``, called first
#: by ``insn_get_prefixes``: Xen's ``__XEN_EMULATE_PREFIX``, "ud2; .ascii \"xen\"", and KVM's, "ud2; .ascii
#: \"kvm\""): at these five bytes it skips them and reads the instruction after them as one instruction with the
#: prefix (``ud2; 'xen'; cpuid``, 7 bytes, a cpuid).  So its reading of a ud2 depends on the bytes after it.
EMULATE_PREFIXES = (b"\x0f\x0bxen", b"\x0f\x0bkvm")


def emulate_prefixed(stream: bytes) -> bool:
    """Whether Linux's decoder reads ``stream`` from an emulate prefix (``EMULATE_PREFIXES``)."""
    return bytes(stream[:5]) in EMULATE_PREFIXES


@lru_cache(maxsize=4)
def _adapter(spec: str):
    return linux_insn.cached_adapter(linux_insn.PREFIX + spec)


@lru_cache(maxsize=200_000)
def insn_of(spec: str, stream: bytes) -> linux_insn.Decoded:
    """``insn_decode(stream, 64-bit)`` of the kernel ``spec`` ('6.1', '6.12')."""
    return _adapter(spec).decode_detail([stream[:MAX_INSN]])[0]


def opcode_table(rows: list[str]) -> frozenset[int]:
    """A 256-bit opcode table of the kernel's sources (``W(0x00, 1, 1, ...)`` rows, as in
    ``good_insns_64`` or ``twobyte_is_boostable``), written row by row as "1 0 1 ...": the opcodes
    whose bit is set."""
    return frozenset(16 * r + c for r, row in enumerate(rows) for c, bit in enumerate(row.split()) if bit == "1")


def legacy_prefixes(d: linux_insn.Decoded, stream: bytes) -> bytes:
    start = d.emulate_prefix
    return stream[start:start + d.prefixes]


def rex_byte(d: linux_insn.Decoded, stream: bytes) -> int:
    return stream[d.emulate_prefix + d.prefixes] if d.rex == 1 else 0


def boundaries(spec: str, data: bytes, offsets: list[int]) -> frozenset[int]:
    """The offsets of ``data`` (a function's bytes) that kprobes' ``can_probe`` walk reaches:
    ``addr += insn.length`` from the start, stopping where ``insn_decode_kernel`` fails.

    ``offsets`` are where our decode puts the instructions; they are asked in one batch, and the
    walk follows them while the kernel's lengths agree, decoding on its own after the first
    disagreement."""
    ad = _adapter(spec)
    facts = ad.decode_many([(o, data[o:o + MAX_INSN]) for o in offsets])
    reached: set[int] = set()
    pos = 0
    index = {o: i for i, o in enumerate(offsets)}
    while pos < len(data):
        i = index.get(pos)
        f = facts[i] if i is not None else ad.decode_many([(pos, data[pos:pos + MAX_INSN])])[0]
        if not f.ok or not f.length:
            break
        reached.add(pos)
        pos += f.length
    return frozenset(reached)


def walk(spec: str, data: bytes, offsets: list[int]) -> list[tuple[int, linux_insn.Decoded]]:
    """``insn_decode_kernel``'s walk over ``data`` (a function's bytes) from its start, as optprobes'
    ``can_optimize`` makes it: ``addr += insn.length`` while inside, each position with the full
    ``struct insn`` facts.  A position where the decode fails ends the walk as its last entry.

    ``offsets`` (our decode's instructions) are decoded in one batch; the walk follows them while
    the kernel's lengths agree and decodes on its own after the first disagreement."""
    ad = _adapter(spec)
    facts = ad.decode_detail([data[o:o + MAX_INSN] for o in offsets])
    index = {o: i for i, o in enumerate(offsets)}
    out: list[tuple[int, linux_insn.Decoded]] = []
    pos = 0
    while pos < len(data):
        i = index.get(pos)
        f = facts[i] if i is not None else ad.decode_detail([data[pos:pos + MAX_INSN]])[0]
        out.append((pos, f))
        if not f.ok or not f.length:
            break
        pos += f.length
    return out
