"""Verdicts: what the checker concluded about one relocation, and its evidence.

``Verdict`` is ordered by strength of the claim, strongest first:

  proved    an SMT proof (or the IR-identity fast path, itself a proof) that the
            relocation ends in the same state as the original for every register
            value and every memory content;
  opaque    a byte-identical copy of a position-independent instruction whose VEX
            semantics are missing or known wrong; NOT a proof, the reason names the gap;
  unknown   solver timeout, unsupported semantics, or a counterexample that did not
            replay: no claim either way;
  rejected  policy: no relocation was planned;
  refuted   a counterexample: concrete inputs on which the two differ, replayed on unicorn.

Every count the tool prints keeps these five apart.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property, lru_cache

from ..concrete.outcome import Difference, MachineState


class Verdict(str, Enum):
    PROVED = "proved"
    OPAQUE = "opaque"
    UNKNOWN = "unknown"
    REJECTED = "rejected"
    REFUTED = "refuted"

    @property
    def rank(self) -> int:
        """0 for the strongest claim (proved) .. 4 for the weakest (refuted)."""
        return _RANK[self]

    def __str__(self) -> str:  # printed and formatted as its name in every output ("proved")
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


_RANK = {v: i for i, v in enumerate(Verdict)}

EXIT_CODES = {
    Verdict.PROVED: 0,
    Verdict.REJECTED: 1,
    Verdict.REFUTED: 1,
    Verdict.UNKNOWN: 3,
    Verdict.OPAQUE: 3,
}


def verdict_exit_code(v: Verdict) -> int:
    return EXIT_CODES[v]


@dataclass(frozen=True)
class Counterexample:
    """Concrete inputs and the outputs that differ.

    ``registers`` maps names ('rax'..'r15', 'rflags', 'fs_base', 'gs_base',
    'xmm0'...) to integers; ``memory`` maps byte addresses to byte values
    (only the bytes the solver's model fixed: every other byte is 0).
    """

    registers: tuple[tuple[str, int], ...]
    memory: tuple[tuple[int, int], ...]
    differences: tuple[Difference, ...]
    orig_hex: str
    at: int
    tramp: int
    reloc_hex: str = ""
    effects_json: str = ""
    replayed: bool | None = None  # None: not replayed; True: unicorn saw a difference too
    replay_note: str = ""

    def state(self) -> MachineState:
        """The counterexample's inputs, as a concrete machine state."""
        return MachineState(dict(self.registers), dict(self.memory))

    def state_json(self) -> str:
        return json.dumps({"registers": {k: hex(v) for k, v in self.registers},
                           "memory": {hex(a): f"{b:02x}" for a, b in self.memory}}, separators=(",", ":"))

    @property
    def replay_command(self) -> str:
        parts = ["relocverify", "replay", "--orig", self.orig_hex, "--at", hex(self.at), "--tramp", hex(self.tramp)]
        if self.reloc_hex:
            parts += ["--reloc", self.reloc_hex]
        if self.effects_json:
            parts += ["--effects", self.effects_json]
        parts += ["--state", self.state_json()]
        return " ".join(shlex.quote(p) for p in parts)

    def as_json(self) -> dict:
        return {
            "registers": {k: hex(v) for k, v in self.registers},
            "memory": {hex(a): f"{b:02x}" for a, b in self.memory},
            "differences": [{"what": d.what, "original": d.original, "relocated": d.relocated}
                            for d in self.differences],
            "replayed": self.replayed,
            "replay_note": self.replay_note,
            "replay": self.replay_command,
        }

    def render(self) -> str:
        regs = ", ".join(f"{k}={v:#x}" for k, v in self.registers)
        lines = [f"  counterexample: {regs or '(any registers)'}"]
        if self.memory:
            lines.append("  memory: " + ", ".join(f"[{a:#x}]={b:#04x}" for a, b in self.memory[:16])
                         + (" ..." if len(self.memory) > 16 else ""))
        for d in self.differences:
            lines.append(f"  differs: {d.what}: original {d.original}, relocated {d.relocated}")
        if self.replayed is not None:
            lines.append(f"  unicorn replay: {'confirmed' if self.replayed else 'NOT confirmed'}"
                         f"{': ' + self.replay_note if self.replay_note else ''}")
        lines.append(f"  replay: {self.replay_command}")
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ProofResult:
    verdict: Verdict
    reason: str
    method: str = ""  # 'fast-path' | 'smt' | 'policy' | ''
    counterexample: Counterexample | None = None
    seconds: float = 0.0
    obligations: tuple[str, ...] = field(default=())  # which obligations were discharged
    #: The machine model's preconditions this verdict depends on (``proof.machine_model``: rows treated as
    #: preconditions), printed with it; empty for verdicts that claim nothing.
    assumes: tuple[str, ...] = field(default=())

    def as_json(self) -> dict:
        out = {
            "verdict": self.verdict.value,
            "reason": self.reason,
            "method": self.method,
            "counterexample": None if self.counterexample is None else self.counterexample.as_json(),
        }
        if self.assumes:
            out["assumes"] = list(self.assumes)
        return out

    def render(self) -> str:
        text = f"verdict: {self.verdict.value}"
        if self.method:
            text += f" [{self.method}]"
        text += f": {self.reason}\n"
        for a in self.assumes:
            text += f"  assumes: {a}\n"
        if self.counterexample is not None:
            text += self.counterexample.render()
        return text


_HEX = re.compile(r"0x[0-9a-f]+|\b[0-9a-f]{6,}\b")


@lru_cache(maxsize=1 << 16)
def reason_key(verdict: Verdict, rule: str, method: str, reason: str) -> str:
    """A reason with its instance-specific numbers removed, for counting (remembered: a kernel's rows repeat a
    few thousand reasons, and the substitution over a long one costs about 10 µs)."""
    if verdict is Verdict.PROVED:
        return f"proved by {method}"
    if verdict is Verdict.REJECTED and not rule.startswith("site:"):
        head = reason.split(":")[0] if rule in ("undecodable", "decoder-disagreement") else reason
        return f"{rule}: {_HEX.sub('N', head)}"
    return _HEX.sub("N", reason)


@dataclass(frozen=True)
class Finding:
    """One instruction's verdict, with the plan and proof that produced it:
    what the engine stores for every instruction of an image.

    ``klass`` is the instruction's class (its decoder-neutral operation
    name, or the decode outcome for bytes that are not an instruction);
    ``proof_us`` the time the proof took when it was made and ``fresh``
    whether it was made for this instruction (else it was reused from the
    proof cache); ``answers`` the decoders' answers where they disagree."""

    verdict: Verdict
    reason: str
    method: str
    plan_kind: str
    rule: str
    klass: str
    proof_us: int = 0
    fresh: bool = False
    counterexample: Counterexample | None = None
    answers: str | None = None

    @cached_property
    def reason_key(self) -> str:
        return reason_key(self.verdict, self.rule, self.method, self.reason)

    @cached_property
    def outcome(self) -> tuple[str, str, str, str, str, str]:
        """The fields many instructions share: (verdict, method, plan kind, rule, class, reason key)."""
        return (self.verdict.value, self.method, self.plan_kind, self.rule, self.klass, self.reason_key)

    def weaker_than(self, other: "Finding") -> bool:
        return _RANK[self.verdict] > _RANK[other.verdict]
