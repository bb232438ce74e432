"""A decoder change, gated: the baseline's decoder against the tested one, answer by answer.

The baseline keeps a digest of the tested decoder's answers, not the answers,
so on its own the gate can only say *that* answers changed.  When the
baseline's decoder can be run again (a ``linux-insn@`` decoder: its build is
in the cache under its source's digest, or its source is still there), this
module decodes the same inputs with it, checks that it reproduces the
baseline's digests, and judges every byte string whose answer changed by the
other decoders' consensus (``compare.compare``: a *failing* answer disagrees,
unexplained, with a majority of them):

| kind | the old answer | the new answer | fails the gate |
|---|---|---|---|
| ``regression`` | not failing | failing | yes |
| ``fix`` | failing | not failing | no |
| ``newly-decoded`` | an error | decoded, not failing | no |
| ``newly-decoded-unconfirmed`` | an error | decoded where most others reject it | no, listed |
| ``still-differs`` | failing | failing, differently | no |
| ``neutral`` | not failing | not failing | no |

An instruction newer than the consensus decoders (an ISA extension capstone
and iced-x86 predate) and bytes the CPU rejects look alike to the others: a
newly decoded answer they reject is listed as unconfirmed, for review, and
does not fail.

For each change, the plan built from the old answer and the plan built from
the new one (``consequence``'s substitution into the consensus decode, then
``plan.make_plan``) say whether the change alters a relocation.  For
``linux-insn`` decoders the changes are grouped by the entries of
``x86-opcode-map.txt`` that differ between the two trees and decided the
answer (``OpcodeMap.keys``); a change under no changed entry came from
``insn.c``/``inat.c`` or the awk script.

The gate then fails only on a regression, or on a new failing difference
whose answer did not change (an input the baseline has not seen), or, when
the old decoder does not reproduce the baseline, on changed digests as usual.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from ..errors import InputError
from ..plan.plan import DEFAULT_TRAMP, make_plan
from ..x86.decode import decode
from ..x86.decoders import linux_insn
from ..x86.decoders.protocol import Decoder, Facts
from ..x86.instruction import Instruction
from . import answers as answers_mod
from .baseline import Baseline
from .compare import Finding, compare
from .run import GateReport, digest
from .samples import Unit

KINDS = ("regression", "fix", "newly-decoded", "newly-decoded-unconfirmed", "still-differs", "neutral")
NO_MAP_LINE = "no changed opcode-map entry (insn.c, inat.c or the awk script)"
SHOW_PER_GROUP = 3


@dataclass(frozen=True)
class Change:
    """One byte string whose answer changed."""

    unit: str
    address: int
    raw: bytes
    count: int
    old: Facts
    new: Facts
    kind: str  # one of KINDS
    entries: tuple[tuple[str, str], ...]  # changed opcode-map entries that decided it (linux-insn only)
    old_plan: tuple[str, str]  # (plan label, trampoline hex) from the old answer
    new_plan: tuple[str, str]

    @property
    def alters_plan(self) -> bool:
        return self.old_plan != self.new_plan

    def as_json(self) -> dict:
        return {"unit": self.unit, "address": hex(self.address), "bytes": self.raw.hex(" "), "count": self.count,
                "kind": self.kind, "old": self.old.as_json(self.address), "new": self.new.as_json(self.address),
                "map_entries": [" ".join(k) for k in self.entries], "alters_plan": self.alters_plan,
                "old_plan": self.old_plan[0], "new_plan": self.new_plan[0]}


@dataclass(frozen=True)
class ChangeReport:
    old: str  # the baseline's decoder: name and version
    new: str
    reproduced: bool  # the old decoder gives the baseline's digest in every unit the baseline has
    changes: tuple[Change, ...]
    map_diff: dict  # (table, opcode) -> (old line, new line); empty when not linux-insn
    unaccounted: tuple[Finding, ...]  # new failing differences whose answer did not change
    digest_changed: bool

    @property
    def regressions(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.kind == "regression")

    @property
    def failed(self) -> bool:
        return bool(self.regressions or self.unaccounted or (self.digest_changed and not self.reproduced))

    def counts(self) -> dict[str, dict[str, int]]:
        distinct, instructions = Counter(), Counter()
        for c in self.changes:
            distinct[c.kind] += 1
            instructions[c.kind] += c.count
        return {k: {"distinct": distinct[k], "instructions": instructions[k]} for k in KINDS}

    def groups(self) -> dict[tuple[tuple[str, str], ...], list[Change]]:
        out: dict = {}
        for c in self.changes:
            out.setdefault(c.entries, []).append(c)
        return dict(sorted(out.items(), key=lambda kv: (not kv[0], kv[0])))

    def as_json(self) -> dict:
        return {"old": self.old, "new": self.new, "reproduced": self.reproduced, "failed": self.failed,
                "counts": self.counts(), "alter_a_plan": sum(c.alters_plan for c in self.changes),
                "map_entries_changed": len(self.map_diff),
                "map_entries_reached": len({k for c in self.changes for k in c.entries}),
                "map_diff": {" ".join(k): {"old": o, "new": n} for k, (o, n) in self.map_diff.items()},
                "changes": [c.as_json() for c in self.changes],
                "unaccounted": [{"address": hex(f.address), "bytes": f.raw.hex(" "), "class": f.klass}
                                for f in self.unaccounted]}


def applies(base: Baseline | None, tested: Decoder) -> bool:
    """A ``linux-insn@`` decoder gated against a baseline another ``linux-insn@`` build made."""
    if base is None or not tested.name.startswith("linux-insn@"):
        return False
    then = base.doc.get("decoder", {})
    return str(then.get("name", "")).startswith("linux-insn@") and (
        then.get("name"), then.get("version")) != (tested.name, tested.version())


def baseline_decoder(base: Baseline) -> Decoder | None:
    """The baseline's decoder as it was: its cached build, else its source built again if unchanged."""
    then = base.doc["decoder"]
    old = linux_insn.from_cache(then["name"], then["version"])
    if old is None:
        try:
            old = linux_insn.adapter(then["name"])
        except InputError:
            return None
    return old if old.version() == then["version"] else None


def decoder_change(old: Decoder, new: Decoder, others: list[Decoder], units: list[Unit], report: GateReport,
                   base: Baseline, jobs: int = 1) -> ChangeReport:
    """Every byte string whose answer differs between ``old`` and ``new``, judged and grouped."""
    items: dict[bytes, int] = {}
    for unit in units:
        for raw, (address, _) in unit.samples.items():
            items.setdefault(raw, address)
    pairs = [(a, r) for r, a in items.items()]
    # One table per call: old and new may share a name (one tree, before and after a patch).
    table = answers_mod.answers([old] + others, pairs, jobs=jobs)
    mine, theirs = table[old.name], answers_mod.answers([new], pairs, jobs=jobs)[new.name]
    known = [u for u in units if base.unit_digest(u.name) is not None]
    reproduced = all(digest(u.samples, mine) == base.unit_digest(u.name) for u in known)
    new_failing = {f.raw for f in report.findings if f.failing}
    changed_raws: set[bytes] = set()
    old_failing: set[bytes] = set()
    per_unit = []
    for unit in units:
        changed = {raw: seen for raw, seen in unit.samples.items() if mine[raw] != theirs[raw]}
        changed_raws.update(changed)
        old_failing.update(f.raw for f in compare(unit.name, changed, old, others, table) if f.failing)
        per_unit.append((unit, changed))
    map_diff, entries = _map_entries(old, new, sorted(changed_raws))
    plans: dict = {}
    changes = []
    for unit, changed in per_unit:
        for raw, (address, count) in sorted(changed.items(), key=lambda kv: kv[1][0]):
            a, b = mine[raw], theirs[raw]
            if raw not in plans:
                plans[raw] = (_plan(raw, address, a), _plan(raw, address, b))
            rejected = 2 * sum(not table[o.name][raw].ok for o in others) > len(others)
            changes.append(Change(unit.name, address, raw, count, a, b,
                                  _kind(a, b, raw in old_failing, raw in new_failing, rejected),
                                  entries.get(raw, ()), *plans[raw]))
    unaccounted = tuple(f for f in report.new_findings if f.raw not in changed_raws)
    return ChangeReport(f"{old.name} {old.version()}", f"{new.name} {new.version()}", reproduced, tuple(changes),
                        map_diff, unaccounted, any(u.digest_changed for u in report.units))


def settle(report: GateReport, change: ChangeReport) -> GateReport:
    """The gate's report as the change report judges it: a changed answer fails only as a regression,
    and a changed digest is no failure of its own when the baseline was reproduced."""
    changed = {c.raw for c in change.changes}
    bad = {c.raw for c in change.regressions}
    units = [replace(u, digest_changed=u.digest_changed and not change.reproduced) for u in report.units]
    kept = [f for f in report.new_findings if f.raw in bad or f.raw not in changed]
    notes = report.notes + [f"{u.name}: answers changed since the baseline; the change report judges them"
                            for u in report.units if u.digest_changed and change.reproduced]
    return replace(report, units=units, new_findings=kept, notes=notes)


def _kind(old: Facts, new: Facts, old_failing: bool, new_failing: bool, rejected: bool) -> str:
    """The table in the module doc; ``rejected``: most other decoders cannot decode it."""
    if not old.ok and new.ok and (not new_failing or rejected):
        return "newly-decoded-unconfirmed" if new_failing else "newly-decoded"
    if new_failing:
        return "still-differs" if old_failing else "regression"
    return "fix" if old_failing else "neutral"


def _map_entries(old: Decoder, new: Decoder, raws: list[bytes]):
    """The changed opcode-map entries, and per byte string those among them that decided it."""
    if not (hasattr(old, "opcode_map") and hasattr(new, "opcode_map")):
        return {}, {}
    diff = old.opcode_map().diff(new.opcode_map())
    entries = {}
    for raw, ka, kb in zip(raws, old.map_keys(raws), new.map_keys(raws)):
        entries[raw] = tuple(sorted({k for k in ka + kb if k in diff}))
    return diff, entries


def _plan(raw: bytes, address: int, facts: Facts) -> tuple[str, str]:
    """The plan built from ``facts`` put in the consensus decode: (label, trampoline hex)."""
    from .consequence import as_answered

    true = decode(raw, address)
    if not isinstance(true, Instruction):
        return ("none: no consensus instruction", "")
    if not facts.ok:
        return ("none: undecodable", "")
    fake = as_answered(true, raw, facts)
    if fake is None:
        return (f"none: length {facts.length} past the bytes", "")
    try:
        plan = make_plan(fake, DEFAULT_TRAMP)
    except (ValueError, IndexError, KeyError, AssertionError, TypeError) as e:
        return (f"none: the planner cannot use these facts ({type(e).__name__})", "")
    return (f"{plan.kind.value} ({plan.rule})", plan.trampoline.hex())


def render(change: ChangeReport) -> str:
    """The change report: counts, then the changes grouped by the opcode-map entries that decided them."""
    counts = change.counts()
    total = sum(c["distinct"] for c in counts.values())
    out = [f"decoder change: {change.old} -> {change.new}; the baseline's answers "
           f"{'reproduced' if change.reproduced else 'NOT reproduced (changed digests fail as usual)'}"]
    if change.map_diff:
        reached = {k for c in change.changes for k in c.entries}
        out.append(f"x86-opcode-map.txt: {len(change.map_diff)} entries differ; {len(reached)} of them decide "
                   f"a changed answer")
    out.append(f"{total:,} encodings changed ({sum(c['instructions'] for c in counts.values()):,} instructions): "
               + ", ".join(f"{counts[k]['distinct']:,} {k}" for k in KINDS)
               + f"; {sum(c.alters_plan for c in change.changes):,} alter a plan")
    for entries, group in change.groups().items():
        kinds = Counter(c.kind for c in group)
        head = "; ".join(f"{t} {op}: {_line(change.map_diff[(t, op)])}" for t, op in entries) or NO_MAP_LINE
        out.append(f"  {head}")
        out.append(f"    {len(group)} encodings: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
                   + f"; {sum(c.alters_plan for c in group)} alter a plan")
        shown = sorted(group, key=lambda c: (KINDS.index(c.kind), not c.alters_plan))[:SHOW_PER_GROUP]
        for c in shown:
            plan = (f"plan {c.old_plan[0]} -> {c.new_plan[0]}" if c.old_plan[0] != c.new_plan[0]
                    else "trampoline changes" if c.alters_plan else "same plan")
            out.append(f"    [{c.kind}] {c.address:#x} {c.raw.hex(' ')} in {c.unit}: "
                       f"{c.old.describe(c.address)} -> {c.new.describe(c.address)}; {plan}")
    for f in change.unaccounted:
        out.append(f"  FAIL unchanged answer, new difference: {f.address:#x} {f.raw.hex(' ')} ({f.klass})")
    out.append("change: FAILED (regressions)" if change.regressions else
               "change: FAILED" if change.failed else "change: no regression")
    return "\n".join(out) + "\n"


def _line(pair: tuple[str | None, str | None]) -> str:
    old, new = pair
    return f"{old or '(none)'!r} -> {new or '(none)'!r}"
