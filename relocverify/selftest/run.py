"""``relocverify selftest``: generate candidate false proofs, let the checker judge them, let the CPU judge
every one the checker proves.

Shapes are real instructions: the instances of the CPU-validated form table
(kernel and module code of the Debian 6.1 kernel, the corpora and the
planner's trampolines) and the corpora's own bytes.  Pairs are spread over
the operators (``operators.OPERATORS``) round-robin; each candidate gets the
checker's verdict (``proof.prove.prove_relocation``, exactly what
``relocverify prove`` runs; a precondition it refuses as vacuous counts as
``unknown``), and each ``proved`` one the judges': the CPU over random and
edge states, or the memory-model table for the concurrency classes
(``judgement.judge``), then the machine the relocation runs in
(``machine_judgement.judge_machine``: a kernel candidate's user-space twin
on the CPU, this CPU's signals on non-canonical and misaligned states with
RFLAGS.AC, and a machine monitor on unicorn for traps and shadows, IBT,
the shadow stack, the first fault's kind and interrupt frames at each
boundary).  A proved candidate a judge tells apart is a **false proof**,
reported with the state and the replay command.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from ..errors import InputError
from ..processes import fork_map, refused
from ..proof import form_table
from ..proof.prove import prove_relocation
from ..proof.verdict import Verdict
from ..x86.decode import decode
from .judgement import judge
from .machine_judgement import judge_machine
from .operators import OPERATORS, Candidate, Operator, shape_for
from .form_sources import corpus_instructions

VERDICT_COLUMN = {Verdict.PROVED: "proved", Verdict.REFUTED: "refuted", Verdict.UNKNOWN: "unknown",
                  Verdict.OPAQUE: "unknown", Verdict.REJECTED: "refuted"}


@dataclass
class Tally:
    generated: int = 0
    proved: int = 0
    refuted: int = 0
    unknown: int = 0
    false_proofs: int = 0

    def as_json(self) -> dict:
        return {"generated": self.generated, "proved": self.proved, "refuted": self.refuted,
                "unknown": self.unknown, "false_proofs": self.false_proofs}


@dataclass
class Report:
    seed: int
    pairs: int
    operators: dict = field(default_factory=dict)  # name -> Tally
    controls: Tally = field(default_factory=Tally)
    false_proofs: list = field(default_factory=list)
    errors: list = field(default_factory=list)  # candidates on which the checker crashed (a bug to report)
    reasons: Counter = field(default_factory=Counter)  # (operator, verdict, reason head) -> n

    def as_json(self) -> dict:
        return {"seed": self.seed, "pairs": self.pairs,
                "operators": {name: t.as_json() for name, t in sorted(self.operators.items())},
                "controls": {"generated": self.controls.generated, "proved": self.controls.proved,
                             "refuted": self.controls.refuted, "unknown": self.controls.unknown,
                             "false_proofs": self.controls.false_proofs},
                "false_proofs": self.false_proofs, "errors": self.errors}


def shapes() -> list[bytes]:
    """Real instruction shapes: the validated table's instances, then the corpora's originals."""
    out = []
    for row in form_table.load().rows.values():
        out += [bytes.fromhex(h) for h in row.instances]
    out += list(corpus_instructions())
    return list(dict.fromkeys(out))


def _one(args) -> dict:
    operator_name, seed, states = args
    op = next(o for o in OPERATORS if o.name == operator_name)
    rng = random.Random(seed)
    pool = _pool(op)
    for _ in range(64):
        shape = shape_for(rng.choice(pool))
        if shape is None:
            continue
        try:
            cand = op.make(shape, rng)
        except ValueError:  # iced cannot encode the variant for this shape (an operand it does not allow)
            cand = None
        if cand is not None:
            break
    else:
        return {"operator": op.name, "skipped": True}
    return _check(op, cand, states, rng)


def _check(op: Operator, cand: Candidate, states: int, rng: random.Random) -> dict:
    decoded = decode(cand.orig, cand.at)
    try:
        result = prove_relocation(decoded, cand.reloc, cand.tramp, timeout_ms=10_000,
                                  tracer_memory=cand.tracer_memory)
        verdict, reason = result.verdict, result.reason
    except InputError as exc:
        verdict, reason = Verdict.UNKNOWN, f"refused as input: {exc}"
    except Exception as exc:  # noqa: BLE001 - a checker crash is a finding of the selftest, not the end of it
        if refused(exc) is not None:  # the system's limit is no checker crash: the selftest stops
            raise
        return {"operator": op.name, "control": op.control, "verdict": "unknown", "reason": "checker crashed",
                "orig": cand.orig.hex(), "reloc": cand.reloc.hex(),
                "error": {"operator": op.name, "replay": cand.replay, "exception": f"{type(exc).__name__}: {exc}"[:300]}}
    row = {"operator": op.name, "control": op.control, "verdict": VERDICT_COLUMN[verdict],
           "reason": reason.split(":")[0][:60], "orig": cand.orig.hex(), "reloc": cand.reloc.hex()}
    if verdict is Verdict.PROVED:
        j = judge(cand, states, rng)
        if not j.differs:
            j = judge_machine(cand, states, rng)
        if j.differs:
            row["false_proof"] = {"operator": op.name, "class": op.klass, "note": cand.note, "orig": cand.orig.hex(),
                                  "at": hex(cand.at), "reloc": cand.reloc.hex(), "tramp": hex(cand.tramp),
                                  "tracer_memory": [f"{lo:#x}:{n:#x}" for lo, n in cand.tracer_memory],
                                  "difference": j.how, "state": j.state_json(), "replay": cand.replay}
    return row


_SHAPES: list[bytes] = []
_POOLS: dict[str, list[bytes]] = {}


def _pool(op: Operator) -> list[bytes]:
    """The shapes an operator draws from: those it wants, when it says, else all."""
    if op.wants is None:
        return _SHAPES
    if op.name not in _POOLS:
        _POOLS[op.name] = [raw for raw in _SHAPES if op.wants(raw)] or _SHAPES
    return _POOLS[op.name]


def run(pairs: int, seed: int, names: list[str] | None = None, jobs: int = 1, states: int = 12,
        progress=None) -> Report:
    """See the module doc."""
    global _SHAPES
    _SHAPES = shapes()
    _POOLS.clear()
    ops = [o for o in OPERATORS if names is None or o.name in names or str(o.klass) in names]
    if not ops:
        raise InputError(f"no operator named {', '.join(names or [])}: choose from "
                         f"{', '.join(o.name for o in OPERATORS)}")
    rng = random.Random(seed)
    work = [(ops[i % len(ops)].name, rng.getrandbits(64), states) for i in range(pairs)]
    report = Report(seed, pairs, {o.name: Tally() for o in ops if not o.control})
    rows = _map(work, jobs, progress)
    for row in rows:
        if row.get("skipped"):
            continue
        tally = report.controls if row["control"] else report.operators[row["operator"]]
        tally.generated += 1
        setattr(tally, row["verdict"], getattr(tally, row["verdict"]) + 1)
        report.reasons[(row["operator"], row["verdict"], row["reason"])] += 1
        if "false_proof" in row:
            tally.false_proofs += 1
            report.false_proofs.append(row["false_proof"])
        if "error" in row:
            report.errors.append(row["error"])
    return report


def _map(work, jobs: int, progress):
    # A worker is renewed after 500 candidates: what angr and z3 keep between calls only grows.
    return fork_map(_one, work, jobs, chunksize=8, renew_after=500, progress=progress)
