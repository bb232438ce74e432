"""Replay a relocation concretely: the original at A and its relocation, side by side.

This is the independent check behind a ``refuted`` verdict: the SMT
checker's counterexample is an input state, and a relocation is refuted
only when running both sides on that state also gives different outcomes
here.  ``machine`` states what a run assumes; ``compare`` says what is
compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..plan import effects as fx

from .effect_machine import run_effects
from .machine import MAX_STEPS, NOT_REPLAYABLE, RELOCATION_MARGIN, TIMEOUT, in_ranges, run_original, run_relocated
from .outcome import REGISTERS, RFLAGS_COMPARED, Difference, MachineState, Outcome, with_code


@dataclass(frozen=True)
class Replay:
    """Both outcomes of one replay and their differences.

    ``replayable`` is False when an outcome says nothing about the machine:
    a limit of the replay (self-modifying code, syscall), or an original
    that did not finish within ``MAX_STEPS``.  A relocation that times out
    where the original finished is a difference, not a limit.
    """

    original: Outcome
    relocated: Outcome
    differences: tuple[Difference, ...]

    @property
    def replayable(self) -> bool:
        return not self.limit

    @property
    def limit(self) -> str:
        """Why the replay is not conclusive ('' if it is)."""
        o, r = self.original.fault or "", self.relocated.fault or ""
        if o.startswith(NOT_REPLAYABLE) or o.startswith(TIMEOUT):
            return f"original: {o}"
        return f"relocation: {r}" if r.startswith(NOT_REPLAYABLE) else ""

    @property
    def differ(self) -> bool:
        """A conclusive difference: what confirms a counterexample."""
        return self.replayable and bool(self.differences)



# ---------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------


def _show(name: str, value: int) -> str:
    return f"{value:#x}" if name != "rflags" else f"{value & RFLAGS_COMPARED:#x}"


def _register_differences(a: Outcome, b: Outcome) -> list[Difference]:
    out = []
    for name in REGISTERS:
        va, vb = a.registers.get(name, 0), b.registers.get(name, 0)
        if name == "rflags":
            va, vb = va & RFLAGS_COMPARED, vb & RFLAGS_COMPARED
        if va != vb:
            out.append(Difference(name, _show(name, va), _show(name, vb)))
    return out


def _runs(addresses: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for addr in addresses:
        if runs and runs[-1][-1] + 1 == addr:
            runs[-1].append(addr)
        else:
            runs.append([addr])
    return runs


def _memory_differences(a: Outcome, b: Outcome, tracer_memory) -> list[Difference]:
    differing = sorted(addr for addr in set(a.writes) | set(b.writes)
                       if a.writes.get(addr) != b.writes.get(addr) and not in_ranges(addr, tracer_memory))

    def show(writes: dict[int, int], run: list[int]) -> str:
        return " ".join("--" if addr not in writes else f"{writes[addr]:02x}" for addr in run) \
            if any(addr in writes for addr in run) else "not written"

    return [Difference(f"mem[{run[0]:#x}]", show(a.writes, run), show(b.writes, run)) for run in _runs(differing)]


def compare(a: Outcome, b: Outcome, tracer_memory: Iterable[tuple[int, int]] = ()) -> list[Difference]:
    """The differences between the original's outcome ``a`` and the relocation's ``b``.

    Memory differences are grouped into runs of consecutive bytes, named by
    their first address ('mem[0x...]') and shown as bytes in address order
    ('--' where that side did not write the byte).
    """
    if a.fault or b.fault:
        return [] if a.fault == b.fault else [Difference("fault", a.fault or "none", b.fault or "none")]
    diffs = [] if a.next_rip == b.next_rip else [Difference("rip", f"{a.next_rip:#x}", f"{b.next_rip:#x}")]
    return diffs + _register_differences(a, b) + _memory_differences(a, b, tuple(tracer_memory))


def replay(orig: bytes, at: int, tramp: int, state: MachineState, reloc: bytes | None = None,
           effects: tuple[fx.Effect, ...] | None = None, tracer_memory: Iterable[tuple[int, int]] = ()) -> Replay:
    """Run the original and one relocation (``reloc`` bytes at T, or an ``effects`` program) on ``state``."""
    if (reloc is None) == (effects is None):
        raise ValueError("replay needs exactly one of reloc and effects")
    tracer_memory = tuple(tracer_memory)
    image = with_code(state, at, orig)
    original = run_original(orig, at, image)
    if reloc is not None:
        relocated = run_relocated(reloc, tramp, at, len(orig), image, tracer_memory, MAX_STEPS + RELOCATION_MARGIN)
    else:
        relocated = run_effects(tuple(effects), at, image)
    return Replay(original, relocated, tuple(compare(original, relocated, tracer_memory)))
