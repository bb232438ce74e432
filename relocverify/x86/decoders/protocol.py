"""One small protocol every decoder adapter follows, for the decoder gate.

An adapter answers, for byte strings at addresses, the structural facts a
relocator depends on: a ``Facts`` value per input.  ``Facts`` is the JSON
object of the external-command protocol (``docs/gate.md``) as a frozen value:
an absent displacement or immediate is ``None``, never 0; a byte string the
decoder cannot decode is a ``Facts`` with ``error`` set, not an exception.

Not every decoder knows every field (VEX has no displacement position,
objdump prints no field offsets): ``Adapter.fields`` names the ones an
adapter reports, and only fields both sides report are compared.

Branch targets are kept relative to the instruction's address
(``target_delta``), so one answer serves every address the same bytes
occur at: answers are cached by (decoder, version, bytes).
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Protocol, Sequence

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


class Adapter(Protocol):
    """A decoder under the gate: a name, a version, the fields it reports, and a batch decode."""

    name: str
    fields: frozenset[str]

    def version(self) -> str: ...

    def decode_many(self, items: Sequence[tuple[int, bytes]]) -> list[Facts]:
        """One ``Facts`` per ``(address, bytes)``, in order.  Never raises for any bytes."""
        ...


def decode_one(adapter: Adapter, raw: bytes, address: int) -> Facts:
    return adapter.decode_many([(address, raw)])[0]


def batched(items: Iterable, size: int):
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
