"""The verdict for an instruction the semantics has a gap for: ``opaque`` when the relocation is a
byte-identical copy that jumps straight back (the CPU runs the same bytes), ``unknown`` otherwise."""

from __future__ import annotations

import time

from ..plan.policy import classify
from ..x86.instruction import Instruction
from .canonical import NotApplicable
from .fast_path import pure_jump_target
from .lift import Gap
from .verdict import ProofResult, Verdict


def _byte_identical_copy(decoded: Instruction, code: bytes | None) -> bool:
    if code is None or code[:decoded.length] != decoded.raw:
        return False
    return classify(decoded).strategy == "copy"


def _jumps_back(decoded: Instruction, code: bytes, tramp: int) -> bool:
    n = decoded.length
    if len(code) <= n:
        return False
    try:
        return pure_jump_target(code, tramp, tramp + n) == decoded.end
    except (NotApplicable, Gap):
        return False


def gap_result(decoded: Instruction, code: bytes | None, tramp: int, reason: str, t0: float) -> ProofResult:
    if _byte_identical_copy(decoded, code) and _jumps_back(decoded, code, tramp):
        reason = reason.removeprefix("not proved: ")
        return ProofResult(Verdict.OPAQUE, f"byte-identical copy, not proved: {reason}", "copy-check",
                           seconds=time.perf_counter() - t0)
    return ProofResult(Verdict.UNKNOWN, reason, "smt", seconds=time.perf_counter() - t0)
