"""The one protocol every decoder follows: the gate's cohort and the pipeline's decode.

A decoder is one class (``Decoder``) with

- ``name``: how the gate and the reports call it (``capstone``, ``linux-insn@6.1``);
- ``version()``: what its answers depend on; answers are cached by (name, version, bytes);
- ``fields``: the ones of ``FIELDS`` its ``Facts`` report (VEX keeps no
  displacement position, objdump prints no field offsets); only fields both
  sides report are compared;
- ``decode_many(items)``: for ``(address, bytes)`` pairs, one ``Facts`` each,
  in order: the structural facts a relocator depends on (length, prefix
  attribution, displacement and immediate positions, branch target).  ``Facts``
  is the JSON object of the external-command protocol (``docs/gate.md``) as a
  frozen value: an absent displacement or immediate is ``None``, never 0; a byte
  string the decoder cannot decode is a ``Facts`` with ``error`` set, never an
  exception.  Branch targets are kept relative to the instruction's address
  (``target_delta``), so one answer serves every address the same bytes occur at.

A decoder that can also give the pipeline's fuller answer (capstone and
iced-x86: ``x86.decode`` cross-checks the two) is a ``DetailDecoder``, the same
class with two more members:

- ``detail(raw, address)``: a ``Detail`` for the first instruction of ``raw`` at
  ``address`` (its ``DecoderAnswer``: length, displacement and immediate
  positions, text; mnemonic and operand text; the registers it reads and
  writes; operation name, condition, flow, branch target, memory operand,
  privilege, second immediate), or ``None`` when it cannot decode the bytes.
  One instruction per call, not a batch: ``x86.decode`` decodes one instruction
  at a time on a hot path and caches by (bytes, address), so a batch would
  only add a list per call;
- ``details``: the ones of ``Detail``'s fields it fills; the others hold their
  defaults (capstone lists no registers: ``x86.decode`` takes them from iced-x86).

The registry of decoders by name is ``adapters.py``; ``Adapter`` is the
protocol's earlier name.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Protocol, Sequence, runtime_checkable

from ..instruction import DecoderAnswer, MemoryOperand
from ..registers import MASK64

#: Every field the gate can compare, in report order.
FIELDS = ("length", "prefixes", "disp", "imm", "target")


class Facts(NamedTuple):
    """One decoder's answer for one byte string (offsets from its first byte).

    An immutable tuple rather than a frozen dataclass: the gate builds one per
    distinct byte string per decoder (millions for a kernel), and a tuple is
    built, compared, hashed and pickled several times faster."""

    length: int | None = None
    prefixes: int | None = None  # legacy prefix bytes attributed to the instruction; None: not reported
    disp_offset: int | None = None
    disp_size: int = 0
    imm_offset: int | None = None
    imm_size: int = 0
    target_delta: int | None = None  # (branch target - address) mod 2**64
    error: str | None = None
    unreported: frozenset[str] = frozenset()  # of FIELDS: this answer says nothing about them

    @property
    def ok(self) -> bool:
        return self.error is None

    def field(self, name: str):
        """The comparable value of one of ``FIELDS``."""
        if name == "disp":
            return (self.disp_offset, self.disp_size) if self.disp_offset is not None else None
        if name == "imm":
            return (self.imm_offset, self.imm_size) if self.imm_offset is not None else None
        if name == "target":
            return self.target_delta
        return getattr(self, name)

    def target(self, address: int) -> int | None:
        return None if self.target_delta is None else (address + self.target_delta) & MASK64

    def as_json(self, address: int = 0) -> dict:
        if self.error is not None:
            return {"error": self.error}
        return {"length": self.length, "prefixes": self.prefixes,
                "disp_offset": self.disp_offset, "disp_size": self.disp_size,
                "imm_offset": self.imm_offset, "imm_size": self.imm_size,
                "target": None if self.target_delta is None else hex(self.target(address))}

    def describe(self, address: int = 0) -> str:
        """One short line: ``len=7 disp=3:4 imm=- target=-``."""
        if self.error is not None:
            return f"error: {self.error}"
        disp = f"{self.disp_offset}:{self.disp_size}" if self.disp_offset is not None else "-"
        imm = f"{self.imm_offset}:{self.imm_size}" if self.imm_offset is not None else "-"
        tgt = "-" if self.target_delta is None else hex(self.target(address))
        pre = "" if self.prefixes is None else f" prefixes={self.prefixes}"
        return f"len={self.length}{pre} disp={disp} imm={imm} target={tgt}"


def error(message: str) -> Facts:
    return Facts(error=message)


def delta(target: int | None, address: int) -> int | None:
    return None if target is None else (target - address) & MASK64


class Detail(NamedTuple):
    """One decoder's full answer for one instruction, as the pipeline's decode uses it.

    A tuple, as ``Facts`` is: ``x86.decode`` builds two per instruction it
    decodes.  Fields the decoder does not fill (not in its ``details``) hold
    the defaults below."""

    answer: DecoderAnswer  # length, displacement and immediate positions (0 when absent), text
    mnemonic: str  # AT&T, as printed ('lock incl', 'callq')
    op_str: str
    reads: frozenset[str] = frozenset()  # GPRs as 64-bit family names (rflags included); implicit included
    writes: frozenset[str] = frozenset()
    opname: str = ""  # the decoder-neutral operation name ('call', 'jle', 'popfq')
    condition: str | None = None  # of jcc/setcc/cmovcc ('le', 'ne', ...)
    far: bool = False  # a far call/jmp/ret (loads CS)
    flow: str = "next"  # the flow-control kind ('next', 'call', 'conditional_branch', 'return', ...)
    branch_target: int | None = None  # masked to 64 bits
    memory: MemoryOperand | None = None  # the first explicit memory operand
    privileged: bool = False
    imm2: tuple[int, int] = (0, 0)  # second immediate (offset, size): enter, extrq, insertq


@runtime_checkable
class Decoder(Protocol):
    """A decoder: a name, a version, the fields it reports, and a batch decode."""

    name: str
    fields: frozenset[str]

    def version(self) -> str: ...

    def decode_many(self, items: Sequence[tuple[int, bytes]]) -> list[Facts]:
        """One ``Facts`` per ``(address, bytes)``, in order.  Never raises for any bytes."""
        ...


@runtime_checkable
class DetailDecoder(Decoder, Protocol):
    """A ``Decoder`` that also gives the pipeline's full answer, one instruction at a time."""

    details: frozenset[str]

    def detail(self, raw: bytes, address: int) -> Detail | None:
        """The first instruction of ``raw`` at ``address``; ``None`` if undecodable.  Never raises."""
        ...


#: The protocol's earlier name, for code written against it.
Adapter = Decoder


def decode_one(decoder: Decoder, raw: bytes, address: int) -> Facts:
    """``decode_many`` of one byte string."""
    return decoder.decode_many([(address, raw)])[0]


def batched(items: Iterable, size: int):
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
