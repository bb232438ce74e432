"""Edge operands per instruction class: the states form validation draws beside the random ones.

A random state (``concrete.states``) meets the operand value where a VEX
flag helper or a lifter is wrong only by chance: ``rcl al, cl`` takes its
count masked to 5 bits and then mod 9: a helper wrong where the count
masks to 27 is met in about one random state in fifty, one wrong for CL = 27
alone in about one in 400.  This module says, for each
instruction class (``EDGE_CLASSES``: one row per class, chosen by
mnemonic, with what it draws and why), which operand values matter, and
draws every one of them in every validation of a form of that class:

* ``edge_cases(raw)``: the class's edge values by operand role (``op0``,
  ``op1``, ``op2``: the explicit operands; ``lo``/``hi``: the implicit
  ``al``/``ah`` or ``rax``/``rdx`` of mul and div; ``acc``: cmpxchg's
  accumulator; ``count``: the ``rcx`` of loop and jrcxz; ...) and the input
  arithmetic flags of each state;
* ``edge_states(raw, address, rng)``: one ``MachineState`` per case, every
  memory access placed by ``states.place``: a register operand gets its
  value at its width (``ah`` in bits 15:8; the register's other bits stay
  random), a memory operand is written after placing (``bt``'s bit string
  at the word its offset selects, so offsets past the operand reach other
  words of the arena), RFLAGS' arithmetic flags are the case's;
* ``edge_immediates(raw)``: copies of ``raw`` whose count or ALU immediate
  takes the class's edge values (beside such an immediate an operand takes
  the few ``core_values``).  Form validation runs the edge states once per
  immediate value of a form (``immediate_of``): its instances differ only in
  register numbers and displacements.  Only classes whose mnemonics' immediates
  the form leaves out (``proof.forms.IMMEDIATE_BLIND``; tests check it)
  have them: any other immediate is part of the form and is not varied.

The rest of each state is random.  An operand register that also
addresses memory keeps the value ``place`` gives it (the access must land
in the arena): such a case still runs, with that operand's edge value lost.
Not drawn here: non-canonical and misaligned addresses, TF in popped
flags, floating-point operands (``states.edge_vectors`` and ``place``'s
``fp_edge``).  docs/soundness.md ("Edge states per form") gives this table.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

import iced_x86 as iced

from ..x86.registers import MASK64, reg_family
from .outcome import AF, CF, DF, OF, PF, SF, ZF, MachineState
from .states import access_spans, place, random_registers

ARITHMETIC = CF | PF | AF | ZF | SF | OF
#: Two ways of every arithmetic input flag, alternated over a class's cases ("both ways").
BOTH_WAYS = (ARITHMETIC, 0)
#: Carry-in both ways with the other flags both ways too: rcl/rcr, adc/sbb.
CARRY_WAYS = (0, CF, ARITHMETIC & ~CF, ARITHMETIC)
#: adcx reads CF, adox OF: each both ways, with the other both ways.
CARRY_OVERFLOW_WAYS = (0, CF, OF, CF | OF)


@dataclass(frozen=True)
class Case:
    """One edge state: operand values by role (masked to each operand's width when written) and the
    input arithmetic flags."""

    values: tuple[tuple[str, int], ...]
    flags: int


@dataclass(frozen=True)
class Shape:
    """What a class's cases depend on: the mnemonic, the operand width in bits, the number of explicit
    operands, the roles this instance has as a register or memory operand (an immediate role is varied
    by ``edge_immediates``), and whether its first operand is in memory."""

    mnemonic: str
    width: int
    operands: int
    present: frozenset[str]
    memory: bool


@dataclass(frozen=True)
class Location:
    """Where a role's value goes: bits ``shift``..``shift+bits-1`` of a GPR family, or a memory operand."""

    family: str | None  # None: the instruction's memory operand
    shift: int
    bits: int


# ---------------------------------------------------------------------------
# Edge values by width
# ---------------------------------------------------------------------------


def values(w: int) -> tuple[int, ...]:
    """Operand values at width ``w``: zero, one, two, all-ones, the sign boundaries (0x7f.., 0x80..,
    0x80..01), a quarter, values whose low byte, word or dword is zero, the narrower widths' sign
    boundaries, and alternating bits."""
    m, top = (1 << w) - 1, 1 << (w - 1)
    out = [0, 1, 2, m, m - 1, top - 1, top, top + 1, top >> 1]
    for low in (8, 16, 32):
        if w > low:
            out += [m & ~((1 << low) - 1), 1 << low, (1 << (low - 1)) - 1, 1 << (low - 1), (1 << low) - 1]
    out.append(m // 3)  # 0x55..
    return tuple(dict.fromkeys(v & m for v in out))


def core_values(w: int) -> tuple[int, ...]:
    """The values an operand takes beside an immediate that is itself varied (``edge_immediates``: each
    of its edge values is a variant with these): 0, 1, all-ones, 0x7f.., 0x80.., 0x80..01, all-ones with
    the low byte zero (8 bits: 0xfe), 0x55.."""
    m, top = (1 << w) - 1, 1 << (w - 1)
    return tuple(dict.fromkeys((0, 1, m, top - 1, top, top + 1, m & ~0xFF if w > 8 else m - 1, m // 3)))


def counts(w: int, through_carry: bool = False) -> tuple[int, ...]:
    """Shift and rotate counts for an operand of ``w`` bits, as CL or an imm8 holds them: 0, 1, 2,
    w-1, w, w+1, 2w, 3w, 31, 32, 63, 64, 65, 127, 128, 255, every multiple of w up to 31 (an 8/16-bit
    rotate takes the count masked to 5 bits mod w), and for rcl/rcr every multiple of w+1 up to 31
    (their count is taken mod 9 or 17)."""
    out = [0, 1, 2, w - 1, w, w + 1, 2 * w, 3 * w, 31, 32, 63, 64, 65, 127, 128, 255]
    out += list(range(w, 32, w))
    if through_carry:
        out += list(range(w + 1, 32, w + 1))
    return tuple(sorted({c & 0xFF for c in out}))


def pairs(w: int) -> tuple[tuple[int, int], ...]:
    """Two operands at the carry, overflow, auxiliary-carry and zero boundaries of add, sub, cmp and
    the logic operations, then each value against itself."""
    m, top = (1 << w) - 1, 1 << (w - 1)
    special = [(top - 1, 1), (top, m), (m, 1), (0, 1), (top, 1), (0x0F, 1), (0x10, 1), (top, top), (m, m),
               (0, m), (top - 1, top), (top + 1, top - 1), (0x7F, 1), (0x80, 0x80), (0xFF, 1), (m & ~0xFF, 0x100)]
    return tuple(dict.fromkeys([(a & m, b & m) for a, b in special] + [(v, v) for v in values(w)[:6]]))


def products(w: int) -> tuple[tuple[int, int], ...]:
    """Factors at the unsigned and signed overflow boundaries of a ``w``-bit multiply: 2^(w/2) squared
    (the first unsigned overflow), (2^(w/2)-1)(2^(w/2)+1) (the largest that fits), MIN*-1, MIN*1,
    0x40..*2 and 0x7f..*2 (signed overflow), -1*-1, zero."""
    m, top, h = (1 << w) - 1, 1 << (w - 1), 1 << (w // 2)
    special = [(h, h), (h - 1, h + 1), (h - 1, h - 1), (m, m), (m, 1), (top, 2), (top, m), (top, 1), (top - 1, 2),
               (top >> 1, 2), (top >> 1, m), (h, h >> 1), (0, m), (m, 0), (1, 1), (top - 1, top - 1), (m, 2)]
    return tuple(dict.fromkeys((a & m, b & m) for a, b in special))


def quotients(w: int) -> tuple[tuple[int, int, int], ...]:
    """(high half, low half, divisor) of a ``w``-bit div/idiv at its #DE boundaries: a zero divisor, the
    largest quotient that fits and the first that does not (unsigned and signed), MIN/-1 (#DE for idiv),
    MIN/1, -1/-1, and remainders at their limits."""
    m, top = (1 << w) - 1, 1 << (w - 1)
    return ((0, 0, 0), (0, 5, 0), (0, m, 1), (1, 0, 1), (top - 1, m, top), (top, 0, top), (0, m, m), (m, m, m),
            (m - 1, m, m), (m, top, m), (m, top, 1), (0, top, 1), (0, top - 1, 1), (m, 0, 2), (1, 0, 2),
            (0, m, 2), (0, 1, m), (top >> 1, 0, top), (m, m - 1, 2))


def _bit_offsets(w: int, memory: bool) -> tuple[int, ...]:
    """bt/bts/btr/btc bit offsets: at and past the width; for a bit string in memory negative offsets and
    offsets up to 4 KiB away too (the arena holds them)."""
    m = (1 << w) - 1
    out = [0, 1, w - 1, w, w + 1, 2 * w - 1, 2 * w, 255, 256, m, m - w + 1, 1 << (w - 1)]
    if memory:
        out = [0, 1, w - 1, w, w + 1, 2 * w - 1, 2 * w, -1, -w, -w - 1, 8 * 64, -8 * 64 - 1, 0x7FFF, -0x8000]
    return tuple(dict.fromkeys(v & m for v in out))


def _immediate_edges(size: int) -> tuple[int, ...]:
    """An ALU immediate's sign boundaries in its own size (sign-extended by the CPU)."""
    bits = 8 * size
    return tuple(dict.fromkeys(v & ((1 << bits) - 1) for v in (
        0x7F, 0x80, 0xFF, (1 << (bits - 1)) - 1, 1 << (bits - 1), (1 << bits) - 1)))


# ---------------------------------------------------------------------------
# Cases per class
# ---------------------------------------------------------------------------


def _alternate(role: str, vs, ways=BOTH_WAYS) -> list[Case]:
    """Each value once, the flag ways in turn."""
    return [Case(((role, v),), ways[i % len(ways)]) for i, v in enumerate(vs)]


def _every_way(role: str, vs, ways) -> list[Case]:
    return [Case(((role, v),), f) for v in vs for f in ways]


def _shift_cases(s: Shape) -> list[Case]:
    carry = s.mnemonic in ("rcl", "rcr")
    ways = CARRY_WAYS if carry else BOTH_WAYS
    vs = values(s.width)
    count = "op2" if s.mnemonic in ("shld", "shrd") else "op1"
    if count not in s.present and s.mnemonic in ("shld", "shrd"):  # an imm8 count is part of the form
        return _alternate("op0", vs) + [Case((("op1", v),), BOTH_WAYS[i % 2]) for i, v in enumerate(vs)]
    if count not in s.present:  # an imm8 or the constant 1: edge_immediates varies it
        core = core_values(s.width)
        return [Case((("op0", v),), ways[(2 * i + j) % len(ways)]) for i, v in enumerate(core) for j in (0, 1)] \
            if carry else _alternate("op0", core)
    out = []
    for i, c in enumerate(counts(s.width, carry)):
        for j, f in enumerate(ways):
            k = i * len(ways) + j
            assigned = (("op0", vs[k % len(vs)]), (count, c))
            if count == "op2":
                assigned += (("op1", vs[(k + len(vs) // 2) % len(vs)]),)
            out.append(Case(assigned, f))
    return out


def _bit_test_cases(s: Shape) -> list[Case]:
    vs = values(s.width)
    if "op1" not in s.present:  # an imm8 offset: edge_immediates
        return _alternate("op0", core_values(s.width))
    offsets = _bit_offsets(s.width, s.memory)
    return [Case((("op0", vs[i % len(vs)]), ("op1", o)), BOTH_WAYS[i % 2]) for i, o in enumerate(offsets)]


def _alu_cases(s: Shape, ways=BOTH_WAYS) -> list[Case]:
    """Pairs, or with an immediate second operand the first operand's values; for adc/sbb (``ways``
    CARRY_WAYS) each with the carry in both ways."""
    if "op1" not in s.present:  # neg, or an immediate edge_immediates varies
        vs = values(s.width) if s.operands == 1 else core_values(s.width)
        if ways is BOTH_WAYS:
            return _alternate("op0", vs)
        return [Case((("op0", v),), ways[(2 * i + j) % len(ways)]) for i, v in enumerate(vs) for j in (0, 1)]
    if ways is BOTH_WAYS:
        return [Case((("op0", a), ("op1", b)), ways[i % 2]) for i, (a, b) in enumerate(pairs(s.width))]
    # both carry-ins for every pair; the other flags set in one pair, clear in the next
    return [Case((("op0", a), ("op1", b)), ways[(2 * i + j) % len(ways)]) for i, (a, b) in enumerate(pairs(s.width))
            for j in (0, 1)]


def _carry_cases(s: Shape) -> list[Case]:
    if s.mnemonic in ("adcx", "adox"):  # CF and OF in all four ways for every pair, the other flags in turn
        return [Case((("op0", a), ("op1", b)), f | (ARITHMETIC & ~(CF | OF) if i % 2 else 0))
                for i, (a, b) in enumerate(pairs(s.width)) for f in CARRY_OVERFLOW_WAYS]
    return _alu_cases(s, CARRY_WAYS)


def _multiply_cases(s: Shape) -> list[Case]:
    if s.mnemonic == "mulx":
        roles = ("rdx", "op2")
    elif s.operands == 1:
        roles = ("lo", "op0")  # al/ax/eax/rax times the operand
    elif s.operands == 3:  # imul r, r/m, imm: the immediate is edge_immediates'
        return _alternate("op1", core_values(s.width))
    else:
        roles = ("op0", "op1")
    return [Case(((roles[0], a), (roles[1], b)), BOTH_WAYS[i % 2]) for i, (a, b) in enumerate(products(s.width))]


def _divide_cases(s: Shape) -> list[Case]:
    return [Case((("hi", h), ("lo", lo), ("op0", d)), BOTH_WAYS[i % 2])
            for i, (h, lo, d) in enumerate(quotients(s.width))]


def _scan_cases(s: Shape) -> list[Case]:
    """The source: every value and every single bit at a byte or word boundary; a zero source with the
    destination all-ones and zero (bsf/bsr leave it unchanged)."""
    w, m = s.width, (1 << s.width) - 1
    bits = [1 << k for k in (0, 7, 8, 15, 16, 31, 32, 63) if k < w]
    out = _alternate("op1", tuple(dict.fromkeys(values(w) + tuple(bits))))
    return out + [Case((("op1", 0), ("op0", m)), ARITHMETIC), Case((("op1", 0), ("op0", 0)), 0)]


def _unary_cases(s: Shape) -> list[Case]:
    return _every_way("op0", values(s.width), BOTH_WAYS)


def _exchange_cases(s: Shape) -> list[Case]:
    """cmpxchg: the accumulator equal to the destination and not, at the edge values; xadd: pairs."""
    if s.mnemonic == "xadd":
        return _alu_cases(s)
    vs = values(s.width)
    out = []
    for i, v in enumerate(vs):
        new = vs[(i + len(vs) // 2) % len(vs)]
        out.append(Case((("acc", v), ("op0", v), ("op1", new)), BOTH_WAYS[i % 2]))
        out.append(Case((("acc", v), ("op0", vs[(i + 1) % len(vs)]), ("op1", new)), BOTH_WAYS[(i + 1) % 2]))
    return out


def _wide_exchange_cases(s: Shape) -> list[Case]:
    """cmpxchg8b/16b: edx:eax (rdx:rax) equal to the memory operand, or differing in one half only."""
    half = s.width // 2
    vs = values(half)
    out = []
    for i, v in enumerate(vs):
        u = vs[(i + 3) % len(vs)]
        new = (("newhi", vs[(i + 5) % len(vs)]), ("newlo", vs[(i + 7) % len(vs)]))
        out.append(Case((("hi", u), ("lo", v), ("op0", u << half | v)) + new, BOTH_WAYS[i % 2]))
        out.append(Case((("hi", u ^ 1), ("lo", v), ("op0", u << half | v)) + new, BOTH_WAYS[(i + 1) % 2]))
        out.append(Case((("hi", u), ("lo", v ^ 1 << (half - 1)), ("op0", u << half | v)) + new, BOTH_WAYS[i % 2]))
    return out


def _swap_cases(s: Shape) -> list[Case]:
    return _alternate("op0", values(s.width))


def _bmi_count_cases(s: Shape) -> list[Case]:
    """shlx/shrx/sarx: the count register; bzhi: the index in bits 7:0; bextr: start in bits 7:0 and
    length in bits 15:8; each at 0, 1, w-1, w, w+1 and 255 (bits above ignored: 0x100 too)."""
    w = s.width
    vs = values(w)
    edge = (0, 1, w - 1, w, w + 1, 255)
    if s.mnemonic == "bextr":
        controls = [length << 8 | start for start in edge for length in edge]
    else:
        controls = list(edge) + [0x100, 0x100 | (w - 1), 2 * w - 1, (1 << w) - 1]
    return [Case((("op1", vs[i % len(vs)]), ("op2", c)), BOTH_WAYS[i % 2]) for i, c in enumerate(controls)]


def _bmi_logic_cases(s: Shape) -> list[Case]:
    if "op2" in s.present:
        return [Case((("op1", a), ("op2", b)), BOTH_WAYS[i % 2]) for i, (a, b) in enumerate(pairs(s.width))]
    return _alternate("op1", values(s.width))


#: RFLAGS inputs of a condition: every combination of CF PF ZF SF OF (AF both ways in turn).
CONDITION_FLAGS = tuple(((k & 1) * CF | (k >> 1 & 1) * PF | (k >> 2 & 1) * ZF | (k >> 3 & 1) * SF | (k >> 4 & 1) * OF
                         | (k & 1) * AF) for k in range(32))


def _condition_cases(s: Shape) -> list[Case]:
    return [Case((), f) for f in CONDITION_FLAGS]


#: rcx of loop/jrcxz: zero, one, two, 2^32 (ecx zero, rcx not), 2^32+1, 0xffffffff, all-ones.
RCX_COUNTS = (0, 1, 2, 1 << 32, (1 << 32) + 1, 0xFFFFFFFF, MASK64)


def _loop_cases(s: Shape) -> list[Case]:
    return [Case((("count", c),), f) for c in RCX_COUNTS for f in (0, ZF)]


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EdgeClass:
    """One class of instructions: its mnemonics, what is drawn (as docs/soundness.md says), the cases,
    the edge values of a blind immediate (by width and immediate size; None: no immediate is varied),
    and why these values matter."""

    name: str
    mnemonics: frozenset[str]
    drawn: str
    cases: Callable[[Shape], list[Case]]
    immediates: Callable[[int, int], tuple[int, ...]] | None
    reason: str


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_CC = "o no b ae e ne be a s ns p np l ge le g"
_CONDITIONS = _words(" ".join(f"j{c} cmov{c} set{c}" for c in _CC.split()))

EDGE_CLASSES = (
    EdgeClass("shift", _words("shl sal shr sar"),
              "counts(w): in CL each twice (two of values(w) in the operand, the flags set and clear); as an "
              "imm8 a variant each, with core(w) in the operand (the flags set and clear in turn)",
              _shift_cases, lambda w, size: counts(w),
              "VEX masks the count and keeps the flags for a masked count of 0; the helpers compute CF/OF from "
              "the count-1 shift: wrong at one count, right on random ones"),
    EdgeClass("rotate", _words("rol ror"),
              "as shift; counts(w) holds every multiple of w up to 31 (8, 16, 24; 16): such a count rotates by 0 "
              "yet writes CF",
              _shift_cases, lambda w, size: counts(w),
              "the count is masked to 5/6 bits, then taken mod w: a nonzero masked count that rotates by 0 "
              "still writes CF and OF"),
    EdgeClass("rotate through carry", _words("rcl rcr"),
              "as rotate, and every multiple of w+1 up to 31 (9, 18, 27; 17); in CL each count four times (CF in "
              "and the other flags, each set and clear); beside an imm8 each of core(w) with CF set and clear",
              _shift_cases, lambda w, size: counts(w, True),
              "the count is taken mod 9 or 17 (amd64g_calculate_RCL/RCR): CF in and the count's residue "
              "decide every output"),
    EdgeClass("double shift", _words("shld shrd"),
              "counts(w) in CL, each twice (values(w) in both operands, the flags set and clear); an imm8 "
              "count is part of the form: values(w) in each operand",
              _shift_cases, None,
              "a count at or past the width leaves the result undefined for 16 bits and masks for 32/64"),
    EdgeClass("bit test", _words("bt bts btr btc"),
              "register offsets 0, 1, w-1, w, w+1, 2w-1, 2w, 255, 256, -1, -w, MIN; a bit string in memory: "
              "0, 1, w-1, w, w+1, 2w-1, 2w, -1, -w, -w-1, 512, -513, 0x7fff, -0x8000 (the word it selects "
              "written); imm8 0, 1, w-1, w, w+1, 2w-1, 127, 128, 255; values(w) in the operand (core(w) "
              "beside an imm8)",
              _bit_test_cases, lambda w, size: tuple(dict.fromkeys(
                  (0, 1, w - 1, w, w + 1, 2 * w - 1, 127, 128, 255))),
              "a register offset is taken mod w, a memory one selects another word (signed): both at and past "
              "the width"),
    EdgeClass("carry arithmetic", _words("adc sbb"),
              "pairs(w), each with CF set and clear (the other flags set for one pair, clear for the next); "
              "with an immediate core(w) so, and the immediate at its sign boundaries",
              _carry_cases, lambda w, size: _immediate_edges(size),
              "the carry in is an input of every output; a helper wrong for all-ones + CF shows only there"),
    EdgeClass("carry chain", _words("adcx adox"),
              "pairs(w) with CF and OF in all four ways (adcx reads and writes CF, adox OF; the other flags "
              "set for one pair, clear for the next)",
              _carry_cases, None,
              "each keeps every flag but its own: the other carry must come out as it went in"),
    EdgeClass("add and logic", _words("add sub cmp and or xor test neg"),
              "pairs(w) (the flags set and clear in turn); with an immediate core(w), and the immediate at its "
              "sign boundaries (0x7f, 0x80, 0xff and 0x7fff.., 0x80.., 0xff.. of its size); neg: values(w)",
              _alu_cases, lambda w, size: _immediate_edges(size),
              "OF, CF and AF differ from a wrong helper only at the sign and nibble boundaries"),
    EdgeClass("increment and not", _words("inc dec not"),
              "values(w), each with every flag set and clear (inc/dec keep CF, not keeps every flag)",
              _unary_cases, None,
              "a flag the instruction keeps must come out as it went in, both ways"),
    EdgeClass("multiply", _words("mul imul mulx"),
              "products(w) in al/ax/eax/rax and the operand, both operands of imul r, r/m, or rdx and the "
              "source of mulx; imul r, r/m, imm: core(w), and the immediate at its sign boundaries",
              _multiply_cases, lambda w, size: _immediate_edges(size),
              "CF and OF say whether the high half is significant: only at those boundaries does a wrong "
              "helper show"),
    EdgeClass("divide", _words("div idiv"),
              "quotients(w) in ah:al, dx:ax, edx:eax or rdx:rax and the divisor (#DE compared with the fault "
              "model's: SIGFPE)",
              _divide_cases, None,
              "#DE (SIGFPE) for a zero divisor or a quotient that does not fit: the fault model's boundary"),
    EdgeClass("bit scan and count", _words("bsf bsr lzcnt tzcnt popcnt"),
              "values(w) and the single bits 0, 7, 8, 15, 16, 31, 32, 63 below w in the source; a zero source "
              "with the destination all-ones and zero",
              _scan_cases, None,
              "a zero source sets ZF (CF for lzcnt/tzcnt) and leaves bsf/bsr's destination as it was"),
    EdgeClass("exchange", _words("cmpxchg xadd"),
              "cmpxchg: each of values(w) in the accumulator, the destination equal to it and not; xadd: "
              "pairs(w)",
              _exchange_cases, None,
              "the comparison's two ways write different registers and memory"),
    EdgeClass("wide exchange", _words("cmpxchg8b cmpxchg16b"),
              "each of values(w/2): edx:eax (rdx:rax) equal to the memory operand, or differing in one half "
              "only; ecx:ebx (rcx:rbx) from values(w/2)",
              _wide_exchange_cases, None,
              "ZF and the write-back depend on both halves"),
    EdgeClass("byte swap", _words("bswap"),
              "values(w)", _swap_cases, None,
              "bswap r16 is undefined: its values at the byte boundaries show it"),
    EdgeClass("bmi count", _words("shlx shrx sarx bzhi bextr"),
              "the count (shlx/shrx/sarx) or index (bzhi) at 0, 1, w-1, w, w+1, 255, 0x100, 0x100+w-1, "
              "2w-1, all-ones; bextr's start and length each at 0, 1, w-1, w, w+1, 255; values(w) in the source",
              _bmi_count_cases, None,
              "the count is masked (shlx) or saturated (bzhi, bextr) past the width"),
    EdgeClass("bmi logic", _words("andn blsi blsmsk blsr pdep pext rorx"),
              "values(w) in the source; pairs(w) in andn's, pdep's and pext's two sources",
              _bmi_logic_cases, None,
              "CF and ZF of blsi/blsr/blsmsk depend on a zero source"),
    EdgeClass("condition", _CONDITIONS,
              "every combination of CF, PF, ZF, SF and OF (32 states)",
              _condition_cases, None,
              "amd64g_calculate_condition reads up to three flags: a condition wrong for one combination "
              "shows only there"),
    EdgeClass("count register", _words("loop loope loopne jrcxz jecxz"),
              "rcx 0, 1, 2, 2^32, 2^32+1, 0xffffffff, all-ones, each with ZF both ways",
              _loop_cases, None,
              "loop decrements rcx (ecx under 0x67) and tests it for zero: 2^32 is zero only as ecx"),
)
_BY_MNEMONIC = {m: c for c in EDGE_CLASSES for m in c.mnemonics}


def edge_class(mnemonic: str) -> EdgeClass | None:
    """The class whose edge operands instances of ``mnemonic`` get (None: random states only)."""
    return _BY_MNEMONIC.get(mnemonic)


# ---------------------------------------------------------------------------
# Operands located
# ---------------------------------------------------------------------------

_MNEMONIC = {v: k.lower() for k, v in vars(iced.Mnemonic).items() if k.isupper()}
_REGISTER_NAMES = {v: k.lower() for k, v in vars(iced.Register).items() if k.isupper()}
_HIGH_BYTES = frozenset({iced.Register.AH, iced.Register.CH, iced.Register.DH, iced.Register.BH})
_IMPLICIT = {  # role -> (family, shift, bits) by width
    "div": lambda w: {"lo": ("rax", 0, w), "hi": ("rax", 8, 8) if w == 8 else ("rdx", 0, w)},
    "mul": lambda w: {"lo": ("rax", 0, w)},
    "mulx": lambda w: {"rdx": ("rdx", 0, w)},
    "cmpxchg": lambda w: {"acc": ("rax", 0, w)},
    "cmpxchg8b": lambda w: {"hi": ("rdx", 0, w // 2), "lo": ("rax", 0, w // 2), "newhi": ("rcx", 0, w // 2),
                            "newlo": ("rbx", 0, w // 2)},
    "loop": lambda w: {"count": ("rcx", 0, 64)},
}
_IMPLICIT_OF = {"div": "div", "idiv": "div", "mul": "mul", "imul": "mul", "mulx": "mulx", "cmpxchg": "cmpxchg",
                "cmpxchg8b": "cmpxchg8b", "cmpxchg16b": "cmpxchg8b", "loop": "loop", "loope": "loop",
                "loopne": "loop", "jrcxz": "loop", "jecxz": "loop"}


def _decode(raw: bytes, address: int = 0) -> iced.Instruction:
    return iced.Decoder(64, raw, ip=address).decode()


def width(ins: iced.Instruction) -> int:
    """The operand width in bits: the first operand's (register or memory), else 64."""
    if ins.op_count and ins.op0_kind == iced.OpKind.MEMORY:
        return 8 * max(iced.MemorySizeExt.size(ins.memory_size), 1)
    if ins.op_count and ins.op0_kind == iced.OpKind.REGISTER:
        return 8 * iced.RegisterExt.size(ins.op0_register)
    return 64


def _register_location(reg: int) -> Location:
    family = reg_family(_REGISTER_NAMES[iced.RegisterExt.full_register(reg)])
    return Location(family, 8 if reg in _HIGH_BYTES else 0, 8 * iced.RegisterExt.size(reg))


def locations(ins: iced.Instruction) -> dict[str, Location]:
    """Each role's place for this instruction: ``op0``..: its register and memory operands; the
    implicit roles of its class (``_IMPLICIT``)."""
    out: dict[str, Location] = {}
    for i in range(ins.op_count):
        kind = ins.op_kind(i)
        if kind == iced.OpKind.REGISTER:
            out[f"op{i}"] = _register_location(ins.op_register(i))
        elif kind == iced.OpKind.MEMORY:
            out[f"op{i}"] = Location(None, 0, 8 * max(iced.MemorySizeExt.size(ins.memory_size), 1))
    mnemonic = _MNEMONIC[ins.mnemonic]
    implicit = _IMPLICIT_OF.get(mnemonic)
    if implicit == "mul" and ins.op_count > 1:
        implicit = None  # imul r, r/m (, imm): explicit operands only
    if implicit:
        for role, (family, shift, bits) in _IMPLICIT[implicit](width(ins)).items():
            out[role] = Location(family, shift, bits)
    return out


def _shape(ins: iced.Instruction) -> Shape:
    return Shape(_MNEMONIC[ins.mnemonic], width(ins), ins.op_count, frozenset(locations(ins)),
                 ins.op_count > 0 and ins.op0_kind == iced.OpKind.MEMORY)


def edge_cases(raw: bytes) -> tuple[Case, ...]:
    """The edge cases of ``raw``'s class, each reduced to the roles ``raw`` has (an immediate role is
    ``edge_immediates``'), without repeats; () for a mnemonic of no class."""
    ins = _decode(raw)
    cls = edge_class(_MNEMONIC[ins.mnemonic])
    if cls is None:
        return ()
    where = locations(ins)
    out = (Case(tuple((r, v) for r, v in c.values if r in where), c.flags) for c in cls.cases(_shape(ins)))
    return tuple(dict.fromkeys(out))


# ---------------------------------------------------------------------------
# States and immediates
# ---------------------------------------------------------------------------


def _set_bits(regs: dict[str, int], at: Location, value: int) -> None:
    mask = ((1 << at.bits) - 1) << at.shift
    regs[at.family] = regs[at.family] & ~mask | (value << at.shift) & mask


def _signed(v: int, bits: int) -> int:
    return v - (1 << bits) if v >> (bits - 1) & 1 else v


def edge_states(raw: bytes, address: int, rng: random.Random) -> list[MachineState]:
    """One placed state per edge case of ``raw`` at ``address`` (see the module doc); a case no
    placement fits is left out."""
    return [state for _, state in edge_cases_placed(raw, address, rng)]


def edge_cases_placed(raw: bytes, address: int, rng: random.Random) -> list[tuple[Case, MachineState]]:
    """``edge_states`` with the case each state was made from (what a report of a difference names)."""
    ins = _decode(raw, address)
    where = locations(ins)
    bit_string = _MNEMONIC[ins.mnemonic] in ("bt", "bts", "btr", "btc") and "op1" in where \
        and where["op0"].family is None
    out = []
    for case in edge_cases(raw):
        regs = random_registers(rng)
        regs["rflags"] = 0x2 | regs["rflags"] & DF | case.flags
        memory_values = []
        for role, value in case.values:
            at = where[role]
            if at.family is None:
                memory_values.append((at.bits, value))
            elif not (bit_string and role == "op1"):
                _set_bits(regs, at, value)
        state = place(raw, address, regs, rng)
        if state is None:
            continue
        regs, memory = dict(state.registers), dict(state.memory)
        spans = access_spans(raw, address, regs)
        if bit_string:
            spans = _bit_string_word(raw, address, regs, where["op1"], dict(case.values).get("op1"))
        for bits, value in memory_values:
            at, _ = next(((a, n) for a, n in spans if 8 * n == bits), spans[0])
            for k in range(bits // 8):
                memory[at + k] = value >> (8 * k) & 0xFF
        out.append((case, MachineState(regs, memory)))
    return out


def _bit_string_word(raw: bytes, address: int, regs: dict[str, int], offset_at: Location,
                     offset: int | None) -> list[tuple[int, int]]:
    """bt m, r: set the offset register (in ``regs``) unless it also addresses memory, and return the
    word its offset selects: the operand's address plus the offset's signed quotient by the width."""
    (ea, size), = access_spans(raw, address, regs)[:1]
    if offset is None:
        return [(ea, size)]
    before = regs[offset_at.family]
    _set_bits(regs, offset_at, offset)
    if access_spans(raw, address, regs)[0][0] != ea:  # the offset register addresses the operand too
        regs[offset_at.family] = before
        offset = regs[offset_at.family] >> offset_at.shift & ((1 << offset_at.bits) - 1)
    bits = 8 * size
    return [(ea + (_signed(offset, offset_at.bits) >> (bits.bit_length() - 1)) * size, size)]


def immediate_of(raw: bytes) -> int | None:
    """``raw``'s immediate (None: it has none): the variants of a form that get its edge states are one per
    immediate value (its instances differ only in register numbers and displacements)."""
    dec = iced.Decoder(64, raw)
    ins = dec.decode()
    offsets = dec.get_constant_offsets(ins)
    if not offsets.has_immediate or offsets.immediate_size == 0:
        return None
    return int.from_bytes(raw[offsets.immediate_offset:offsets.immediate_offset + offsets.immediate_size], "little")


def edge_immediates(raw: bytes) -> list[bytes]:
    """Copies of ``raw`` with its blind immediate (a count, a bit offset, an ALU operand) at each of its
    class's edge values not already in ``raw`` (see the module doc); [] when the class varies none."""
    dec = iced.Decoder(64, raw)
    ins = dec.decode()
    cls = edge_class(_MNEMONIC[ins.mnemonic])
    offsets = dec.get_constant_offsets(ins)
    if cls is None or cls.immediates is None or not offsets.has_immediate or offsets.has_immediate2 \
            or offsets.immediate_size == 0:
        return []
    at, size = offsets.immediate_offset, offsets.immediate_size
    out = []
    for value in cls.immediates(width(ins), size):
        copy = raw[:at] + (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little") + raw[at + size:]
        if copy != raw:
            out.append(copy)
    return list(dict.fromkeys(out))
