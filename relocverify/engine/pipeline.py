"""The per-instruction pipeline: bytes at an address -> decode -> plan -> proof -> ``Finding``.

``Prover.verify`` is the one place an instruction is decoded in full (capstone
and iced-x86, cross-checked), planned and proved.  A proof is looked up
under its full cache key first (``proof.cache_key``); a new one runs under
a watchdog: the solver gets the timeout, and a SIGALRM this much later
(``WATCHDOG_MARGIN_S``) stops anything else that hangs, so a run always
goes on with an ``unknown`` finding.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Callable

from ..plan.plan import PlanKind, make_plan
from ..processes import refused
from ..proof.cache_key import cache_key, reusable
from ..proof.verdict import Finding, ProofResult, Verdict
from ..schedule.watchdog import WATCHDOG_MARGIN_S, ProofTimeout, own_alarm, watchdog  # noqa: F401 - the engine's names
from ..text import one_line
from ..store.cache import CachedProof
from ..x86.decode import decode
from ..x86.instruction import Decoded, Instruction


def prove_plan(decoded, plan, timeout_ms, smt=None):
    """``proof.prove.prove_plan``, imported when first needed: a run whose every
    finding is cached never loads angr and z3."""
    from ..proof.prove import prove_plan as prove

    return prove(decoded, plan, timeout_ms=timeout_ms, smt=smt)


def klass_of(decoded: Decoded) -> str:
    return decoded.opname if isinstance(decoded, Instruction) else type(decoded).__name__.lower()


def answers_json(decoded: Decoded) -> str | None:
    """The decoders' answers when they disagree, or when a known decoder bug was resolved; else None."""
    if isinstance(decoded, Instruction) and not decoded.notes:
        return None
    doc = {"answers": {a.decoder: a.as_json() for a in decoded.answers}}
    if isinstance(decoded, Instruction):
        doc["notes"] = list(decoded.notes)
    else:
        doc["reason"] = decoded.reason
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Verified:
    """A finding, and the full cache key it may be reused under (None: not reusable)."""

    finding: Finding
    full_key: bytes | None


class Prover:
    """Verifies instructions for one trampoline address (``tramp``, which may be changed between
    images: the proofs it holds are under full keys, which say how each instruction relates to
    its trampoline); remembers the proofs it made."""

    def __init__(self, tramp: int, timeout_s: float, proofs: Callable[[], dict[bytes, CachedProof]] | None = None,
                 rules=None, smt: Callable | None = None):
        """``proofs``: loads the persistent cache's proofs when the first one is wanted (None: none);
        ``rules``: the policy table (``plan.policy.POLICIES``; the kernel's by default); ``smt``: what runs the
        SMT checks (``proof.prove.prove_plan``'s ``smt``: a run's SMT helper; None: this process)."""
        self.tramp = tramp
        self.smt = smt
        self.rules = rules
        self.timeout_s = timeout_s
        self._load = proofs
        self._proofs: dict[bytes, CachedProof] | None = None
        self.new_proofs: dict[bytes, CachedProof] = {}

    @property
    def proofs(self) -> dict[bytes, CachedProof]:
        if self._proofs is None:
            self._proofs = self._load() if self._load is not None else {}
        return self._proofs

    def verify(self, raw: bytes, address: int) -> Verified:
        decoded = decode(raw, address)
        klass = klass_of(decoded)
        plan = make_plan(decoded, self.tramp, self.rules)
        answers = answers_json(decoded)
        if plan.kind is PlanKind.REJECT:
            return Verified(Finding(Verdict.REJECTED, plan.reason, "policy", plan.kind.value, plan.rule, klass,
                                    answers=answers), None)
        key = cache_key(decoded, plan)
        hit = None if key is None else self.proofs.get(key) or self.new_proofs.get(key)
        if hit is not None:
            return Verified(Finding(Verdict(hit.verdict), hit.reason, hit.method, plan.kind.value, plan.rule, klass,
                                    hit.proof_us, False, answers=answers), key)
        result, us = self._prove(decoded, plan)
        if key is not None and reusable(key, result):
            self.new_proofs[key] = CachedProof(result.verdict.value, result.reason, result.method, us)
        else:
            key = None
        return Verified(Finding(result.verdict, result.reason, result.method, plan.kind.value, plan.rule, klass,
                                us, True, result.counterexample, answers), key)

    def _prove(self, decoded, plan) -> tuple[ProofResult, int]:
        t0 = time.perf_counter()
        try:
            with watchdog(self.timeout_s + WATCHDOG_MARGIN_S):
                result = self._prove_now(decoded, plan)
        except ProofTimeout:  # landed between the proof's end and the watchdog's
            result = ProofResult(Verdict.UNKNOWN, f"timeout: no verdict within {self.timeout_s:g} s", "timeout")
        return result, max(1, int((time.perf_counter() - t0) * 1e6))

    def _prove_now(self, decoded, plan) -> ProofResult:
        try:
            result = prove_plan(decoded, plan, timeout_ms=int(self.timeout_s * 1000), smt=self.smt)
        except ProofTimeout:
            result = ProofResult(Verdict.UNKNOWN, f"timeout: no verdict within {self.timeout_s:g} s", "timeout")
        except Exception as exc:  # a bug in a third-party library must not stop the run
            if refused(exc) is not None:  # the system's limit, not this instruction's verdict: the run stops
                raise
            result = ProofResult(Verdict.UNKNOWN, f"internal error: {type(exc).__name__}: {one_line(exc)}", "error")
        return result
