"""What a decoder's answer does to a relocation: the plan built from the
tested decoder's facts, checked against the true instruction.

The true instruction is the consensus decode (``x86.decode.decode``:
capstone cross-checked by iced-x86 and the layout parser, documented
capstone defects resolved).  The tested decoder's facts (length,
displacement, immediate, branch target) replace the consensus's in a copy
of that record, ``plan.make_plan`` plans from the copy, and the trampoline
(or emulation) it yields is checked with ``proof.prove`` against the *true*
original.  A plan built from a wrong answer must not be proved: the checker
refutes it, or at least does not prove it.  The consensus's own plan and
verdict are computed alongside, and the result is *worse* when the tested
verdict ranks below the consensus's (``Verdict.rank``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..plan.plan import DEFAULT_TRAMP, PlanKind, make_plan
from ..proof.prove import prove_effects, prove_plan, prove_relocation
from ..proof.verdict import Verdict
from ..x86.decode import decode
from ..x86.decoders.protocol import Facts
from ..x86.instruction import Instruction

TIMEOUT_MS = 5_000


@dataclass(frozen=True)
class Consequence:
    plan: str  # 'rewrite (rip-relative)', or why no plan was built
    verdict: Verdict
    reason: str
    consensus_plan: str
    consensus_verdict: Verdict

    @property
    def worse(self) -> bool:
        return self.verdict.rank > self.consensus_verdict.rank

    def describe(self) -> str:
        return (f"plan from the tested answer: {self.plan} -> {self.verdict.value} ({self.reason}); "
                f"consensus plan: {self.consensus_plan} -> {self.consensus_verdict.value}")

    def as_json(self) -> dict:
        return {"plan": self.plan, "verdict": self.verdict.value, "reason": self.reason,
                "consensus_plan": self.consensus_plan, "consensus_verdict": self.consensus_verdict.value,
                "worse": self.worse}


def consequence(raw: bytes, address: int, tested: Facts, tramp: int = DEFAULT_TRAMP,
                timeout_ms: int = TIMEOUT_MS) -> Consequence | None:
    """The tested answer's plan and verdict beside the consensus's; None when the consensus has no instruction."""
    true = decode(raw, address)
    if not isinstance(true, Instruction):
        return None
    plan0 = make_plan(true, tramp)
    v0 = prove_plan(true, plan0, timeout_ms=timeout_ms)
    cplan = f"{plan0.kind.value} ({plan0.rule})"
    if not tested.ok:
        return Consequence("none: the tested decoder cannot decode it", Verdict.REJECTED, tested.error,
                           cplan, v0.verdict)
    fake = as_answered(true, raw, tested)
    if fake is None:
        return Consequence("none", Verdict.REJECTED,
                           f"the tested length {tested.length} runs past the {len(raw)} bytes the sample has",
                           cplan, v0.verdict)
    try:
        plan = make_plan(fake, tramp)
    except (ValueError, IndexError, KeyError, AssertionError, TypeError) as e:
        return Consequence("none", Verdict.REJECTED, f"the planner cannot use these facts: {e}",
                           cplan, v0.verdict)
    label = f"{plan.kind.value} ({plan.rule})"
    if plan.kind is PlanKind.REJECT:
        result = prove_plan(fake, plan)
    elif plan.kind is PlanKind.EMULATE:
        result = prove_effects(true, plan.effects, tramp, timeout_ms=timeout_ms)
    else:
        result = prove_relocation(true, plan.trampoline, tramp, timeout_ms=timeout_ms,
                                  tracer_memory=plan.tracer_memory[1:])
    return Consequence(label, result.verdict, result.reason, cplan, v0.verdict)


def as_answered(true: Instruction, raw: bytes, f: Facts) -> Instruction | None:
    """The consensus record ``true`` with a decoder's answer ``f`` in place of its own facts.

    The instruction is ``raw`` cut to ``f.length``; the displacement and
    immediate offsets and sizes, and the branch target, are ``f``'s for every
    field ``f`` reports (a field in ``f.unreported`` keeps the consensus's).
    Everything else (mnemonic, operands, registers) stays the consensus's:
    the record is what a planner that trusts this decoder would see.  None
    when ``f`` has no length or a length past the ``len(raw)`` bytes there are.
    Used for the plan a tested answer leads to (``consequence``) and for
    the plans before and after a decoder change (``gate.change``)."""
    if f.length is None or f.length > len(raw):
        return None
    kw = {"raw": raw[:f.length]}
    if "disp" not in f.unreported:
        kw.update(disp_offset=f.disp_offset or 0, disp_size=f.disp_size if f.disp_offset is not None else 0)
    if "imm" not in f.unreported:
        kw.update(imm_offset=f.imm_offset or 0, imm_size=f.imm_size if f.imm_offset is not None else 0)
    if "target" not in f.unreported and f.target_delta is not None:
        kw["branch_target"] = f.target(true.address)
    return replace(true, **kw)
