"""What a tracer model answers about one instruction, and the shared pieces every model uses.

A model (``TracerModel``) answers, for an instruction at A with its trampoline (out-of-line slot)
at T, exactly one ``Answer``:

* ``Refuse``: the tracer will not probe there, with the tracer's own reason and the source line
  that decides it;
* ``Relocate``: what the tracer executes instead, as bytes placed at T.  ``written`` is what
  the tracer writes into its slot (e.g. the copied instruction and an ``int3``); ``code`` is
  the slot composed with the tracer's state fixup after the single-step (``fixup``), written
  as bytes with the same effect, so that ``proof.prove.prove_relocation`` can judge it.  The
  composition is stated per model (for kprobes: the ``int3`` at T+len traps and
  ``resume_singlestep`` sets ``ip += (A - T) - 1``, which is ``jmp A+len``);
* ``RelocateBlock``: a run of instructions relocated as one block behind a ``jmp`` that
  overwrites the start of the run (optprobes), with the entries into the overwritten bytes
  the tracer missed, if any;
* ``Emulate``: the emulation the handler performs, in the effects language (``plan.effects``);
* ``Unmodelled``: the tracer does something the project's languages cannot express (a flags
  push, an IF change); audited as ``unknown`` with the reason.

Every decision cites the tracer's file and function (``Cite``).  Models are pure: bytes,
addresses and decoder facts in, answers out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Union

from ..plan.block import BlockPlan
from ..plan.effects import Effect, effect_json
from ..proof.machine_model import Machine
from ..x86.encoding import jump
from ..x86.instruction import Instruction
from ..x86.registers import MASK64


@dataclass(frozen=True)
class Cite:
    """Where a decision is made: a file of the tracer's source, the function, and what it does."""

    file: str
    function: str
    note: str = ""

    def text(self) -> str:
        return f"{self.file} {self.function}" + (f" ({self.note})" if self.note else "")


@dataclass(frozen=True)
class Refuse:
    reason: str  # the tracer's own words or error code
    cite: Cite

    @property
    def kind(self) -> str:
        return "refuse"

    def as_json(self) -> dict:
        return {"kind": "refuse", "reason": self.reason, "source": self.cite.text()}


@dataclass(frozen=True)
class Relocate:
    code: bytes  # what runs from T: the slot composed with the fixup (see the module doc)
    written: bytes  # what the tracer writes into its slot
    fixup: str  # the state fixup after the single-step, in words
    cite: Cite
    tracer_memory: tuple[tuple[int, int], ...] = ()  # save slots the tracer owns (besides the code)

    @property
    def kind(self) -> str:
        return "relocate"

    def as_json(self) -> dict:
        return {"kind": "relocate", "code": self.code.hex(), "written": self.written.hex(), "fixup": self.fixup,
                "tracer_memory": [[hex(a), n] for a, n in self.tracer_memory], "source": self.cite.text()}


@dataclass(frozen=True)
class Entry:
    """A transfer of control into bytes a block probe overwrites: ``source`` jumps to ``target``."""

    target: int
    source: int
    how: str  # 'branch' (a direct jump or call), 'extable' (an exception fixup), 'jump_label' (a static key's jump)
    where: str  # the source's function

    def as_json(self) -> dict:
        return {"target": hex(self.target), "source": hex(self.source), "how": self.how, "where": self.where}


@dataclass(frozen=True)
class RelocateBlock:
    """A block probe: ``jmp T`` written over [A, A+5); ``block`` is the run [A, A+L) the tracer
    copies to T (``block.trampoline``: the copies back to back and the jump to A+L), ``written``
    what the tracer writes into its slot (its handler template is not part of the obligation:
    it saves and restores every register and flag around the handler call), and ``entries``
    the transfers into (A, A+5) from code the tracer's checks do not see."""

    block: BlockPlan
    written: bytes
    fixup: str
    cite: Cite
    entries: tuple[Entry, ...] = ()

    @property
    def kind(self) -> str:
        return "relocate"

    def as_json(self) -> dict:
        b = self.block
        return {"kind": "relocate", "block": True, "code": b.trampoline.hex(), "written": self.written.hex(),
                "length": b.length, "instructions": [i.raw.hex() for i in b.instructions],
                "fixup": self.fixup, "tracer_memory": [[hex(a), n] for a, n in b.tracer_memory],
                "entries": [e.as_json() for e in self.entries], "source": self.cite.text()}


@dataclass(frozen=True)
class Emulate:
    effects: tuple[Effect, ...]
    cite: Cite

    @property
    def kind(self) -> str:
        return "emulate"

    def as_json(self) -> dict:
        return {"kind": "emulate", "effects": [effect_json(e) for e in self.effects], "source": self.cite.text()}


@dataclass(frozen=True)
class Unmodelled:
    reason: str
    cite: Cite

    @property
    def kind(self) -> str:
        return "unmodelled"

    def as_json(self) -> dict:
        return {"kind": "unmodelled", "reason": self.reason, "source": self.cite.text()}


Answer = Union[Refuse, Relocate, RelocateBlock, Emulate, Unmodelled]


@dataclass(frozen=True)
class Context:
    """What a model may know beyond the instruction: facts about where it sits.

    ``boundary``: False when the tracer's own walk from the function's start does not reach A
    (kprobes ``can_probe``); None when not known (a lone instruction).  ``sites``: the kernel
    site kinds at A (``store.store.SITE_KINDS``), for the tracers' address blacklists."""

    boundary: bool | None = None
    sites: tuple[str, ...] = ()
    function: str = ""
    stream: bytes = b""  # the image's bytes from A on (up to 15), where the tracer's decoder may read past ours

    def bytes_at(self, insn: Instruction) -> bytes:
        return self.stream if self.stream[:insn.length] == insn.raw else insn.raw


NO_CONTEXT = Context()


class TracerModel(Protocol):
    name: str  # 'kprobes@6.1'
    decoder: str | None  # 'linux-insn@6.1' for the Linux models, None for our own decode
    source: str  # where the model was written from
    # Optional ``machine``: the machine its relocations run in (``proof.machine_model.Machine``: user space
    # for uprobes and fasttrap, a kernel without IBT for kinst); absent means the context of each
    # instruction's address.  Read through ``machine_of(model)``.

    def answer(self, insn: Instruction, tramp: int, context: Context = NO_CONTEXT) -> Answer: ...

    def site_refusal(self, context: Context) -> Refuse | None: ...


def machine_of(model) -> Machine | None:
    """The machine ``model``'s relocations run in, or None for the context of each address."""
    return getattr(model, "machine", None)


def jump_back(tramp: int, code: bytes, to: int) -> bytes:
    """``code`` followed by the jump from its end at T to ``to`` (rel32 in reach, else absolute)."""
    return code + jump((tramp + len(code)) & MASK64, to)


def signed(value: int, size: int) -> int:
    """``value``'s low ``size`` bytes as a signed integer."""
    bits = size * 8
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


@dataclass(frozen=True)
class SiteRule:
    """A site kind a tracer refuses to probe at, with why (a row of a model's table)."""

    kind: str
    reason: str
    cite: Cite = field(default_factory=lambda: Cite("", ""))


def refuse_sites(rules: tuple[SiteRule, ...], context: Context) -> Refuse | None:
    for rule in rules:
        if rule.kind in context.sites:
            return Refuse(rule.reason, rule.cite)
    return None
