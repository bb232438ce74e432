"""The form table keeps which CPUs validated each row, and a validation on another CPU merges into it
(selftest.form_merge, proof.form_table): two CPUs simulated by the judge's feature mask, and CPUs
recorded in a table as another machine would have written them."""

from __future__ import annotations

import io
import json
import os
import platform
import shutil

import pytest

from relocverify.concrete import cpu
from relocverify.concrete.cpu_identity import FEATURE_MASK_ENV, CpuIdentity
from relocverify.proof import form_table
from relocverify.proof.forms import facts
from relocverify.selftest.form_merge import merge_table, with_cpu_list
from relocverify.selftest.form_validation import FormResult, validate_form

on_x86 = pytest.mark.skipif(platform.machine() != "x86_64", reason="validates forms on an x86-64 CPU")

#: A CPU of the other vendor, as its own ``selftest --validate-forms`` would have recorded it.
INTEL = CpuIdentity("GenuineIntel", 6, 0x8F, 8, ("avx", "avx2", "avx512bw", "avx512f", "fma", "fsgsbase"), 0x2E7)
ADD = bytes.fromhex("4801d8")  # add %rbx,%rax
PSLLQ = bytes.fromhex("660f73f305")  # psllq $5,%xmm3
CVTDQ2PD = bytes.fromhex("f30fe6c1")  # cvtdq2pd %xmm1,%xmm0
VPXOR = bytes.fromhex("c5e1efdb")  # vpxor %xmm3,%xmm3,%xmm3 (zeroes zmm3 above bit 127)


def form(raw: bytes) -> str:
    return facts(raw).form


def validated(*raws: bytes) -> dict[str, FormResult]:
    return {form(r): validate_form(form(r), [r], 8) for r in raws}


def reading(status: str, *loose: str) -> FormResult:
    return FormResult(form(ADD), status, loose, 8, (ADD.hex(),))


def parsed(doc: dict) -> form_table.FormTable:
    return form_table.parse(json.dumps(doc, indent=0, sort_keys=True))


def test_the_shipped_table_names_the_cpus_of_every_row():
    table = form_table.load()
    assert table.cpus and table.cpus[0].vendor == "AuthenticAMD" and table.cpus[0].xcr0 == 0xE7
    for row in table.rows.values():
        assert all(0 <= i < len(table.cpus) for i in row.cpus), row.form
        assert row.cpus or row.status == "failed" and "not run" in row.loose[0], row.form
        assert row.reading_of(row.cpus[0]) is not None if row.cpus else True
    assert form_table.DIFFERS not in {c for row in table.rows.values() for c in row.loose} or len(table.cpus) > 1


@on_x86
def test_a_table_validated_with_and_without_avx512_lists_both_cpus(monkeypatch):
    """Two CPUs simulated by the mask: the same forms validated here and as on a CPU without AVX-512 merge
    into rows that list both; none is loose for state the second CPU does not have."""
    here = validated(ADD, PSLLQ, CVTDQ2PD, VPXOR)
    doc = merge_table({}, here, cpu.identity())
    monkeypatch.setenv(FEATURE_MASK_ENV, "-avx512")
    doc = merge_table(doc, validated(ADD, PSLLQ, CVTDQ2PD, VPXOR), cpu.identity())
    table = parsed(doc)
    assert len(table.cpus) == 2 and table.cpus[1].masked == ("avx512",) and not table.cpus[1].avx512
    for raw in (ADD, PSLLQ, CVTDQ2PD, VPXOR):
        row = table.row(form(raw))
        assert row.cpus == (0, 1) and row.status == "exact" and not row.readings, (row.form, row.loose)
    assert table.cpus_of(form(ADD)) == table.cpus
    again = merge_table(doc, validated(ADD), cpu.identity())  # the same (masked) CPU again: no third record
    assert len(again["cpus"]) == 2 and again["forms"][form(ADD)]["cpus"] == [0, 1]


def test_a_reading_that_differs_on_another_cpu_makes_the_row_not_exact():
    """An Intel CPU recorded in the table read CF of an add differently (as a wrong flag would): merged with
    this CPU's exact reading, the row is loose with the reason, and keeps both readings."""
    doc = merge_table({}, {form(ADD): reading("loose", "flags")}, INTEL)
    doc = merge_table(doc, {form(ADD): reading("exact")}, cpu.identity())
    row = parsed(doc).row(form(ADD))
    assert row.status == "loose" and row.loose == ("differs between CPUs", "flags") and row.cpus == (0, 1)
    assert row.reading_of(0) == form_table.Reading("loose", ("flags",)) and row.reading_of(1).status == "exact"
    failed = merge_table(doc, {form(ADD): reading("failed", "the control flow differs from the CPU's")}, INTEL)
    row = parsed(failed).row(form(ADD))
    assert row.status == "failed" and form_table.DIFFERS in row.loose
    agree = merge_table(doc, {form(ADD): reading("exact")}, INTEL)  # Intel validated again, now alike
    row = parsed(agree).row(form(ADD))
    assert row.status == "exact" and row.cpus == (0, 1) and not row.readings and not row.loose


def test_state_a_cpu_does_not_have_is_no_difference_between_cpus():
    """A CPU with AVX-512 finds the zmm upper bits wrong; one without cannot see them: the row is loose for
    the zmm upper bits, not for a difference between the CPUs."""
    no_avx512 = CpuIdentity("AuthenticAMD", 0x19, 0x21, 0, ("avx", "avx2"), 0x7)
    doc = merge_table({}, {form(ADD): reading("loose", "zmm upper")}, INTEL)
    doc = merge_table(doc, {form(ADD): reading("exact")}, no_avx512)
    row = parsed(doc).row(form(ADD))
    assert row.status == "loose" and row.loose == ("zmm upper",) and row.cpus == (0, 1)
    doc = merge_table(doc, {form(ADD): reading("loose", "vector")}, no_avx512)
    assert parsed(doc).row(form(ADD)).loose == ("differs between CPUs", "vector", "zmm upper")


def test_a_form_this_cpu_cannot_run_is_no_reading():
    lacking = FormResult(form(VPXOR), "failed", ("not run: needs AVX, which this CPU lacks",), 0, (VPXOR.hex(),),
                         lacks=("AVX",))
    doc = merge_table({}, {form(VPXOR): FormResult(form(VPXOR), "exact", (), 8, (VPXOR.hex(),))}, INTEL)
    kept = merge_table(doc, {form(VPXOR): lacking}, cpu.identity())
    assert kept["forms"][form(VPXOR)] == doc["forms"][form(VPXOR)] and len(kept["cpus"]) == 2
    fresh = merge_table({}, {form(VPXOR): lacking}, cpu.identity())["forms"][form(VPXOR)]
    assert fresh["status"] == "failed" and fresh["cpus"] == [] and "not run" in fresh["loose"][0]


def test_a_table_from_before_cpus_were_kept_gets_its_one_cpu():
    old = {"cpu": "AMD (xcr0 0xe7)", "forms": {form(ADD): {"status": "exact", "states": 8, "instances": [ADD.hex()]}}}
    doc = with_cpu_list(old)
    assert "cpu" not in doc and doc["forms"][form(ADD)]["cpus"] == [0]
    legacy = CpuIdentity.from_json(doc["cpus"][0])
    assert (legacy.vendor, legacy.xcr0, legacy.family) == ("AuthenticAMD", 0xE7, None)
    # a CPU the record may have meant (its recorded fields match) replaces its reading; another joins it
    zen = CpuIdentity("AuthenticAMD", 0x1A, 2, 1, ("avx",), 0xE7)
    row = merge_table(old, {form(ADD): reading("loose", "flags")}, zen)["forms"][form(ADD)]
    assert row["cpus"] == [1] and row["loose"] == ["flags"]
    row = merge_table(old, {form(ADD): reading("loose", "flags")}, INTEL)["forms"][form(ADD)]
    assert row["cpus"] == [0, 1] and form_table.DIFFERS in row["loose"]


@on_x86
def test_validate_forms_merges_into_the_table(tmp_path, monkeypatch):
    """``selftest --validate-forms --update`` as on a CPU without AVX-512: the forms the table lacks are
    validated and listed with that CPU; every other row keeps the CPU that validated it."""
    from relocverify.cli.main import main
    from relocverify.selftest import form_sources as FS

    if not os.path.exists("/bin/true"):
        pytest.skip("no /bin/true to take instructions from")
    target = tmp_path / "forms.json"
    shutil.copy(os.path.join(os.path.dirname(form_table.__file__), form_table.TABLE_NAME), target)
    doc = json.loads(target.read_text())
    forms, _ = FS.collect(FS.elf_instructions(["/bin/true"]))
    gone = sorted(f for f in forms if doc["forms"].get(f, {}).get("status") == "exact"
                  and not facts(forms[f][0]).features - {"INTEL8086", "INTEL386", "X64"})[:3]
    assert len(gone) == 3
    for f in gone:
        del doc["forms"][f]
    target.write_text(json.dumps(doc, indent=0, sort_keys=True))
    monkeypatch.setenv(FEATURE_MASK_ENV, "-avx512")
    out, err = io.StringIO(), io.StringIO()
    code = main(["selftest", "--validate-forms", "--update", "--elf", "/bin/true", "--output", str(target),
                 "--jobs", "1"], out, err)
    assert code == 0, err.getvalue()
    table = form_table.parse(target.read_text())
    shipped = form_table.parse(json.dumps(doc)).cpus  # however many CPUs the shipped table already holds
    here = len(shipped)
    assert len(table.cpus) == here + 1 and table.cpus[here] == cpu.identity() and table.cpus[here].masked == ("avx512",)
    for f in gone:
        assert table.row(f).cpus == (here,) and table.row(f).status == "exact", table.row(f)
    before = form_table.parse(json.dumps(doc)).rows
    assert all(row.cpus == before[f].cpus for f, row in table.rows.items() if f not in gone)
