"""An amendment validates a subset of the form table's rows again (selftest.form_amendment): which rows it
picks, how a new result meets the old row, the log it writes, and the witnesses it reports."""

from __future__ import annotations

import json
import platform
import re

import claripy
import pytest

from relocverify.concrete.outcome import CF
from relocverify.proof import semantics as S
from relocverify.selftest.form_amendment import (amend, amend_table, amended_results, changes, edge_operand_rows,
                                                 rows_to_amend, witnesses)
from relocverify.selftest.form_merge import legacy_cpu
from relocverify.selftest.form_validation import FormResult

on_x86 = pytest.mark.skipif(platform.machine() != "x86_64", reason="validates forms on an x86-64 CPU")
HERE = legacy_cpu("AMD (xcr0 0xe7)")

ROL = "ROL_RM64_CL r64:A,r8:B |rex||"  # 48d3c0: an edge class (rotate)
SHL = "SHL_RM64_CL r64:A,r8:B |rex||"  # 48d3e0: an edge class (shift)
MOV = "MOV_R64_RM64 r64:A,r64:B |rex||"  # 488bc3: none
BAD = "RCL_RM64_CL m8[x],r8:A |rex||"  # a failed row of an edge class


def _table() -> dict:
    return {"about": "a test table", "amended": {"2026-11-26": "floating point"}, "cpu": "AMD (xcr0 0xe7)",
            "forms": {ROL: {"status": "exact", "states": 8, "instances": ["48d3c0"], "seen": 3},
                      SHL: {"status": "loose", "loose": ["undefined flags"], "states": 8, "instances": ["48d3e0"],
                            "example": "48d3e0: undefined flags", "seen": 5},
                      MOV: {"status": "exact", "states": 8, "instances": ["488bc3"], "seen": 9},
                      BAD: {"status": "failed", "loose": ["no state"], "states": 0, "instances": ["48d3d0"]}},
            "counts": {"exact": 2, "loose": 1, "failed": 1}}


def test_the_edge_operand_rows_are_those_of_an_edge_class_that_did_not_fail():
    assert set(rows_to_amend(_table(), edge_operand_rows)) == {ROL, SHL}
    assert rows_to_amend(_table(), edge_operand_rows)[ROL] == [bytes.fromhex("48d3c0")]


def test_an_exact_row_takes_its_new_result_and_a_loose_row_keeps_its_witness():
    results = {ROL: FormResult(ROL, "loose", ("flags",), 40, ("48d3c0",), "48d3c0: flags"),
               SHL: FormResult(SHL, "exact", (), 40, ("48d3e0",))}
    taken = amended_results(_table(), results)
    assert taken[ROL].status == "loose" and taken[ROL].loose == ("flags",)
    assert taken[SHL].status == "loose" and taken[SHL].loose == ("undefined flags",)
    assert taken[SHL].example == "48d3e0: undefined flags"  # the old witness stands
    grown = amended_results(_table(), {SHL: FormResult(SHL, "loose", ("register",), 40, ("48d3e0",), "x")})
    assert grown[SHL].loose == ("register", "undefined flags")


def test_an_amendment_merges_through_the_table_writer_and_logs_the_day():
    table = _table()
    results = {ROL: FormResult(ROL, "loose", ("flags",), 40, ("48d3c0",), "48d3c0: flags"),
               SHL: FormResult(SHL, "exact", (), 40, ("48d3e0",))}
    doc = amend(table, results, "edge operands: {n} rows", "2026-11-26", HERE)
    assert doc["amended"] == {"2026-11-26": "floating point; edge operands: {n} rows"}
    assert doc["forms"][ROL]["status"] == "loose" and doc["forms"][ROL]["seen"] == 3
    assert doc["forms"][SHL]["status"] == "loose" and doc["forms"][SHL]["loose"] == ["undefined flags"]
    assert doc["forms"][MOV] == {**table["forms"][MOV], "cpus": [0]}  # not validated: as it was
    assert doc["counts"] == {"exact": 1, "loose": 2, "failed": 1}
    assert [c.describe() for c in changes(table, doc)] == [f"{ROL}: exact -> loose (flags)"]
    assert amend(table, results, "again", "2026-11-27", HERE)["amended"]["2026-11-27"] == "again"


def test_amend_table_reads_the_file_again_before_it_writes(tmp_path):
    """The file is read once to pick the rows and again after they ran: a row another writer changed
    meanwhile is kept, and the note's counts are those of the file written."""
    path = tmp_path / "table.json"
    path.write_text(json.dumps(_table()))
    results = {ROL: FormResult(ROL, "loose", ("flags",), 40, ("48d3c0",), "48d3c0: flags")}
    done = amend_table(str(path), edge_operand_rows, "{validated} validated, {exact_to_loose} exact -> loose",
                       "2026-11-27", results=results)
    doc = json.loads(path.read_text())
    assert doc["amended"]["2026-11-27"] == "1 validated, 1 exact -> loose"
    assert done.validated == 2 and [c.form for c in done.changes] == [ROL] and done.counts == doc["counts"]


def _broken_at(count: int):
    real = S._ccall.amd64g_calculate_RCL

    def wrong(state, arg, rot_amt, eflags_in, sz):
        out = real(state, arg, rot_amt, eflags_in, sz)
        if claripy.SLT(sz, 0).is_true():
            return claripy.If(rot_amt == count, out ^ CF, out)
        return out

    return wrong


@on_x86
def test_the_witnesses_name_the_count_and_the_flag(monkeypatch):
    """rcl al, cl with angr's RCL helper wrong for CL = 27: the witnesses name that count and CF with the
    CPU's and the semantics' values, and the intact helper's own difference (OF with CL = 0) apart."""
    monkeypatch.setattr(S._ccall, "amd64g_calculate_RCL", _broken_at(27))
    found = witnesses("RCL_RM8_CL r8:A,r8:B |||", [bytes.fromhex("d2d0")])
    carry = [w for w in found if "CF" in [name for name, _, _ in w.outputs]]
    assert carry and all(dict(w.case.values)["op1"] == 27 for w in carry)
    assert re.search(r"op1=0x1b.*CF: cpu [01] vex [01]", carry[0].describe())
    overflow = [w for w in found if [name for name, _, _ in w.outputs] == ["OF"]]
    assert overflow and dict(overflow[0].case.values)["op1"] == 0
