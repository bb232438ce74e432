"""Compare the tested decoder's answers with the other decoders'.

For each distinct byte string, the tested answer is compared field by field
(``protocol.FIELDS``, only those both decoders report) with each other
decoder's.  A difference is *explained* when it is a documented capstone
defect (a row of ``x86.decoders.known_bugs.KNOWN_DECODER_BUGS`` matches,
with the other side saying what iced-x86 says): explained differences are
counted under the row's name and never fail the gate.

The tested decoder *fails* a sample when it disagrees, unexplained, with
more of the other decoders than it agrees with; an other decoder whose own
answer is a documented defect there (capstone's ud1 length) has no vote.  When the others split
evenly there is no consensus to judge it by: the sample is reported as
*contested* (it is a disagreement among the other decoders) and does not
fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress
from operator import ne

from ..x86.decode import CROSS_CHECK, PRIMARY
from ..x86.decoders.known_bugs import KNOWN_DECODER_BUGS
from ..x86.decoders.protocol import FIELDS, Decoder, Facts, decode_one


#: Not a defect but a convention ``known_bugs.agree`` also accepts: for the
#: two-immediate forms (enter, extrq, insertq) capstone reports the second immediate.
SECOND_IMMEDIATE = "capstone-second-immediate"


@dataclass(frozen=True)
class Difference:
    """The tested decoder against one other decoder on one sample."""

    other: str
    kind: str  # 'length+disp', 'undecodable' (tested cannot decode), 'decodes-invalid' (only tested decodes)
    explained: str | None  # the KNOWN_DECODER_BUGS row, if any


@dataclass(frozen=True)
class Finding:
    """A sample where the tested decoder differs from at least one other decoder."""

    unit: str
    address: int
    raw: bytes
    count: int  # occurrences in the unit
    tested: str
    answers: tuple[tuple[str, Facts], ...]  # tested first, then every other decoder
    differences: tuple[Difference, ...]
    failing: bool

    @property
    def klass(self) -> str:
        """The row name when every difference is explained, else the unexplained kinds."""
        open_ = sorted({d.kind for d in self.differences if d.explained is None})
        if open_:
            return ",".join(open_)
        return ",".join(sorted({d.explained for d in self.differences}))

    @property
    def contested(self) -> bool:
        """Not failing, yet some difference is unexplained: the other decoders split."""
        return not self.failing and not self.explained

    @property
    def explained(self) -> bool:
        return all(d.explained for d in self.differences)

    def answer(self, name: str) -> Facts:
        return dict(self.answers)[name]

    @property
    def shape(self) -> str:
        """The bytes with displacement and immediate bytes as ``..``: the key of an accepted disagreement."""
        size = max((f.length for _, f in self.answers if f.ok and f.length), default=1)
        hexes = [f"{b:02x}" for b in self.raw[:size]]
        for _, f in self.answers:
            for off, size in ((f.disp_offset, f.disp_size), (f.imm_offset, f.imm_size)):
                if f.ok and off is not None:
                    for i in range(off, min(off + size, len(hexes))):
                        hexes[i] = ".."
        return " ".join(hexes)


def differing_fields(a: Facts, b: Facts, fields: frozenset[str]) -> str | None:
    """The kind of difference between two answers, or None if they agree."""
    if not a.ok or not b.ok:
        if a.ok == b.ok:
            return None
        return "undecodable" if not a.ok else "decodes-invalid"
    fields = fields - a.unreported - b.unreported
    diff = [f for f in FIELDS if f in fields and a.field(f) != b.field(f)]
    return "+".join(diff) or None


def explain(raw: bytes, address: int, tested: str, a: Facts, other: str, b: Facts) -> str | None:
    """The KNOWN_DECODER_BUGS row explaining capstone's side of a difference, if any."""
    if PRIMARY.name not in (tested, other) or tested == other:
        return None
    rest = b if tested == PRIMARY.name else a
    ic = CROSS_CHECK.detail(raw, address)
    if ic is None or rest != decode_one(CROSS_CHECK, raw, address):
        return None
    cs = PRIMARY.detail(raw, address)
    if cs is not None and cs.answer.length == ic.answer.length and ic.imm2[1] and (
            (cs.answer.imm_offset, cs.answer.imm_size) == ic.imm2):
        return SECOND_IMMEDIATE
    for bug in KNOWN_DECODER_BUGS:
        if bug.matches(raw, cs and cs.answer, ic.answer):
            return bug.name
    return None


def _known_wrong(raw: bytes, address: int, theirs) -> frozenset[str]:
    """The other decoders whose answer here is a documented defect (capstone against iced-x86): no vote."""
    table = {o.name: t[raw] for o, t, _ in theirs}
    if "capstone" not in table or "iced" not in table or table["capstone"] == table["iced"]:
        return frozenset()
    row = explain(raw, address, "iced", table["iced"], "capstone", table["capstone"])
    return frozenset({"capstone"}) if row else frozenset()


def compare(unit: str, samples: dict[bytes, list[int]], tested: Decoder, others: list[Decoder],
            answers: dict[str, dict[bytes, Facts]]) -> list[Finding]:
    """Every sample of ``unit`` where the tested decoder differs from another decoder."""
    mine = answers[tested.name]
    theirs = [(o, answers[o.name], tested.fields & o.fields) for o in others]
    findings = []
    suspects = set()
    for _, table, _ in theirs:  # the strings where the answers differ at all, in C (one loop per kernel)
        suspects.update(compress(samples, map(ne, map(mine.__getitem__, samples), map(table.__getitem__, samples))))
    for raw in sorted(suspects, key=lambda r: samples[r][0]):
        address, count = samples[raw]
        a = mine[raw]
        diffs = []
        for o, table, fields in theirs:
            b = table[raw]
            if a == b:
                continue
            kind = differing_fields(a, b, fields)
            if kind is not None:
                diffs.append(Difference(o.name, kind, explain(raw, address, tested.name, a, o.name, b)))
        if diffs:
            discredited = _known_wrong(raw, address, theirs)
            against = sum(1 for d in diffs if d.explained is None and d.other not in discredited)
            voters = len(others) - len(discredited)
            failing = against > voters - against
            findings.append(Finding(unit, address, raw, count, tested.name,
                                    ((tested.name, a),) + tuple((o.name, t[raw]) for o, t, _ in theirs),
                                    tuple(diffs), failing))
    return findings
