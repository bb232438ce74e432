"""Validate a subset of the form table's rows again, merge them in, and log why in its ``amended`` record.

A change to the validation itself (new states, ``concrete.edge_operands``)
makes the rows it reaches stale, and ``selftest --validate-forms`` would
run all of the table's forms from their sources again.  An amendment runs
only the rows a selector picks, from the instances each row records:

* ``rows_to_amend(table, select)``: the forms (with their instances) of the
  rows ``select`` picks; a ``failed`` row is never picked (no new state
  makes it trusted);
* ``amended_results(table, results)``: the results as the table takes
  them: a row that was ``exact`` takes its new result; a row that was
  ``loose`` stays loose whatever the new sample finds (its witness stands),
  with the outputs the new sample found added to its own;
* ``amend(table, results, note, date, here)``: the table with those
  results merged in by the table's own writer (``form_merge.merge_table``,
  the other CPUs' readings of these rows replaced: they were made by the old
  validation, not the same test) and ``{date: note}`` in its ``amended``
  log (after a note of the same day);
* ``amend_table(path, select, note, ...)``: the above on the table's file;
  it re-reads the file just before writing and replaces it atomically.

``witnesses(form, instances)`` says what differs in a form's edge states:
each differing state's edge operand values and input flags, and each
output (register, flag, memory, fault) with the CPU's and the semantics'
values; the amendment's report prints them.  ``edge_operand_rows`` is the
selector for the edge operands: every row whose mnemonic has an edge class.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from dataclasses import dataclass
from typing import Callable

from ..concrete import cpu
from ..concrete import edge_operands as EO
from ..concrete.outcome import MachineState, Outcome
from ..proof import evaluation as EV
from ..proof.forms import facts
from ..x86.registers import GPR64
from .form_merge import merge_table
from .form_validation import (CODE_AT, RFLAG_BITS, FormResult, compare, instance_variants, is_floating_point,
                              program_for, validate_forms)

Selector = Callable[[str, dict], bool]


def edge_operand_rows(form: str, row: dict) -> bool:
    """A row whose instances' mnemonic has an edge class (``edge_operands.edge_class``)."""
    f = facts(bytes.fromhex(row["instances"][0])) if row.get("instances") else None
    return f is not None and EO.edge_class(f.mnemonic) is not None


def rows_to_amend(table: dict, select: Selector) -> dict[str, list[bytes]]:
    """The forms of ``table``'s rows that ``select`` picks, with their instances; never a failed row."""
    return {form: [bytes.fromhex(h) for h in row["instances"]] for form, row in table.get("forms", {}).items()
            if row["status"] != "failed" and row.get("instances") and select(form, row)}


def amended_results(table: dict, results: dict[str, FormResult]) -> dict[str, FormResult]:
    """``results`` as the table takes them (see the module doc): a loose row's outputs are kept."""
    out = {}
    for form, result in results.items():
        old = table["forms"][form]
        if old["status"] == "loose" and not result.lacks and result.status != "failed":
            loose = tuple(sorted(set(old.get("loose", ())) | set(result.loose)))
            result = dataclasses.replace(result, status="loose", loose=loose,
                                         example=result.example or old.get("example", ""))
        out[form] = result
    return out


@dataclass(frozen=True)
class Change:
    """One row the amendment changed: its status and outputs before and after."""

    form: str
    before: str
    after: str
    loose_before: tuple[str, ...]
    loose_after: tuple[str, ...]

    def describe(self) -> str:
        if self.before == self.after:
            added = sorted(set(self.loose_after) - set(self.loose_before))
            return f"{self.form}: {self.after}, + {', '.join(added)}"
        return f"{self.form}: {self.before} -> {self.after} ({', '.join(self.loose_after)})"


def changes(before: dict, after: dict) -> list[Change]:
    """The rows whose status or outputs differ between two tables."""
    out = []
    for form, row in after.get("forms", {}).items():
        old = before.get("forms", {}).get(form)
        if old is None:
            continue
        if old["status"] != row["status"] or set(old.get("loose", ())) != set(row.get("loose", ())):
            out.append(Change(form, old["status"], row["status"], tuple(old.get("loose", ())),
                              tuple(row.get("loose", ()))))
    return out


def amend(table: dict, results: dict[str, FormResult], note: str, date: str, here) -> dict:
    """``table`` with ``results`` (validated on ``here``) merged in and the note logged; pure."""
    doc = merge_table(table, amended_results(table, results), here, replace_others=True)
    log = dict(doc.get("amended", {}))
    log[date] = f"{log[date]}; {note}" if date in log else note
    doc["amended"] = log
    return doc


@dataclass(frozen=True)
class Amendment:
    """What ``amend_table`` did: how many rows it validated, what changed, how long it took."""

    validated: int
    changes: tuple[Change, ...]
    seconds: float
    counts: dict


def amend_table(path: str, select: Selector, note: str, date: str, jobs: int = 1, progress=None,
                results: dict[str, FormResult] | None = None) -> Amendment:
    """Validate the rows of the table at ``path`` that ``select`` picks, and write the amended table
    (``results``: already validated, e.g. by an earlier run of the same selection)."""
    with open(path) as f:
        table = json.load(f)
    todo = rows_to_amend(table, select)
    start = time.monotonic()
    if results is None:
        results = validate_forms(todo, jobs=jobs, progress=progress)
    seconds = time.monotonic() - start
    with open(path) as f:  # re-read: another writer may have changed it while the rows ran
        table = json.load(f)
    results = {form: r for form, r in results.items() if form in table.get("forms", {})}
    doc = amend(table, results, note.format(**_tally(table, results)), date, cpu.identity())
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=0, sort_keys=True)
    os.replace(tmp, path)
    return Amendment(len(todo), tuple(changes(table, doc)), seconds, doc["counts"])


def _tally(table: dict, results: dict[str, FormResult]) -> dict[str, int]:
    """Counts a note may name: ``{validated}``, ``{exact_to_loose}``, ``{exact_to_failed}``, ``{grown}``."""
    rows = table["forms"]
    worse = [f for f, r in results.items() if rows[f]["status"] == "exact" and r.status != "exact"]
    grown = [f for f, r in amended_results(table, results).items() if rows[f]["status"] == "loose"
             and (r.status != "loose" or set(r.loose) - set(rows[f].get("loose", ())))]
    return {"validated": len(results), "exact_to_loose": sum(results[f].status == "loose" for f in worse),
            "exact_to_failed": sum(results[f].status == "failed" for f in worse), "grown": len(grown)}


# ---------------------------------------------------------------------------
# What differs, state by state
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Witness:
    """One edge state where the CPU and the semantics part: the instance run, the edge case (operand values
    by role, input flags), and each differing output as (name, CPU value, semantics value)."""

    raw: str
    case: EO.Case
    outputs: tuple[tuple[str, str, str], ...]

    def describe(self) -> str:
        operands = ", ".join(f"{role}={value:#x}" for role, value in self.case.values) or "-"
        differ = "; ".join(f"{name}: cpu {c} vex {s}" for name, c, s in self.outputs)
        return f"{self.raw} [{operands}; flags {_flag_names(self.case.flags)}]: {differ}"


def _flag_names(rflags: int) -> str:
    return "".join(name for name, bit in RFLAG_BITS.items() if rflags >> bit & 1) or "none"


def _outputs(c: Outcome, s: Outcome, state: MachineState) -> tuple[tuple[str, str, str], ...]:
    """The outputs that differ, by name, with both values (integer registers, flags, memory, fault)."""
    if c.fault or s.fault:
        return (("fault", str(c.fault), str(s.fault)),) if c.fault != s.fault else ()
    out = []
    for r in GPR64 + ("fs_base", "gs_base"):
        v = s.registers.get(r)
        if v is not None and c.registers.get(r, v) != v:
            out.append((r, f"{c.registers[r]:#x}", f"{v:#x}"))
    cf, sf = c.registers["rflags"], s.registers.get("rflags")
    if sf is not None:
        out += [(name, str(cf >> bit & 1), str(sf >> bit & 1)) for name, bit in RFLAG_BITS.items()
                if (cf ^ sf) >> bit & 1]
    writes = {a: v for a, v in s.writes.items() if state.memory.get(a, 0) != v}
    if c.writes != writes:
        out.append(("memory", str(sorted(c.writes.items())[:4]), str(sorted(writes.items())[:4])))
    return tuple(out)


def witnesses(form: str, instances: list[bytes], seed: int = 0, limit: int = 8) -> list[Witness]:
    """Up to ``limit`` edge states of ``form`` (its instances, their variants and edge immediates) whose
    CPU and semantics outcomes differ, with what differs (see ``Witness``): the first state of each set of
    differing outputs (by name), so that a rare register difference is not hidden by undefined flags."""
    rng = random.Random(f"witness:{seed}:{form}")
    f = facts(instances[0])
    fp = is_floating_point(instances[0])
    variants = [v for raw in instances[:4] for v in instance_variants(raw, rng)]
    variants += [v for v in EO.edge_immediates(variants[0]) if v not in variants]
    found: dict[tuple[str, ...], Witness] = {}
    for raw in variants:
        pairs = EO.edge_cases_placed(raw, CODE_AT, rng)
        if not pairs:
            continue
        states = [cpu.trim_state(s) for _, s in pairs]  # the state this CPU loads, as form validation does
        sem = EV.evaluate(raw, CODE_AT, states)
        outs = cpu.run_on_cpu(program_for(raw), states)
        for (case, _), state, c, s in zip(pairs, states, outs, sem):
            if compare(c, s, state, raw, f, fp):
                w = Witness(raw.hex(), case, _outputs(c, s, state))
                found.setdefault(tuple(name for name, _, _ in w.outputs), w)
                if len(found) >= limit:
                    return list(found.values())
    return list(found.values())
