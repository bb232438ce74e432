"""The CPU-validated form table (proof.form_table) and its validation (selftest.form_validation)."""

from __future__ import annotations

import platform
import random

import pytest

from relocverify.concrete.cpu_identity import FEATURE_MASK_ENV
from relocverify.proof import form_table
from relocverify.proof import semantics as S
from relocverify.proof.forms import facts
from relocverify.selftest.form_validation import validate_form

on_x86 = pytest.mark.skipif(platform.machine() != "x86_64", reason="validates forms on an x86-64 CPU")


@pytest.fixture(params=["", "-avx512"], ids=["this-cpu", "no-avx512"])
def judge_mask(request, monkeypatch):
    """Validation as on this CPU, and as on a CPU without AVX-512 (the judge's feature mask), whatever CPU
    runs the suite: a form is not loose for state the CPU does not have."""
    monkeypatch.setenv(FEATURE_MASK_ENV, request.param)
    return request.param


def test_the_table_covers_the_kernel_and_says_where_it_was_made():
    table = form_table.load()
    statuses = {row.status for row in table.rows.values()}
    assert statuses == {"exact", "loose", "failed"}
    assert len(table.rows) > 3000 and table.cpu and table.generated
    every_row_has_instances = all(row.instances for row in table.rows.values())
    assert every_row_has_instances
    for row in table.rows.values():
        assert row.status == "exact" or row.loose, row.form  # a row that is not exact says why


@on_x86
def test_a_sample_of_the_table_validates_again_on_this_cpu(judge_mask):
    """Rows drawn at random (a new sample each run): an exact row must still be exact here, a loose one
    must not have become failed.  A form needing a feature this CPU lacks is not run here (no reading)."""
    table = form_table.load()
    rng = random.Random()
    seed = rng.getrandbits(32)
    rng.seed(seed)
    exact = [r for r in table.rows.values() if r.status == "exact"]
    loose = [r for r in table.rows.values() if r.status == "loose"]
    for row in rng.sample(exact, 25) + rng.sample(loose, 8):
        again = validate_form(row.form, [bytes.fromhex(h) for h in row.instances], 8, seed)
        if again.lacks:
            continue
        if row.status == "exact":
            assert again.status == "exact", (seed, row.form, again.loose, again.example)
        else:
            assert again.status != "failed", (seed, row.form, again.loose)


@on_x86
def test_a_wrong_flag_helper_is_caught(monkeypatch, judge_mask):
    """Class 6's mechanism: validation compares every flag with the CPU.  Break angr's flag helper (CF
    flipped) and an add that validates exact no longer does."""
    raw = bytes.fromhex("4801d8")
    assert validate_form(facts(raw).form, [raw], 8).status == "exact"
    real = S._ccall.amd64g_calculate_rflags_all

    def wrong(state, cc_op, dep1, dep2, ndep):
        return real(state, cc_op, dep1, dep2, ndep) ^ 1

    monkeypatch.setattr(S._ccall, "amd64g_calculate_rflags_all", wrong)
    broken = validate_form(facts(raw).form, [raw], 8)
    assert broken.status != "exact" and "flags" in broken.loose


@on_x86
def test_the_zmm_upper_bits_are_state_of_the_semantics(monkeypatch):
    """Class 8's mechanism: a VEX-encoded write zeroes zmm bits 511:256 on an AVX-512 CPU, and the semantics
    says so; without that the CPU and the semantics part."""
    from relocverify.concrete.cpu import xsave_layout

    if not xsave_layout().avx512:
        pytest.skip("this CPU has no AVX-512: no zmm upper bits")
    raw = bytes.fromhex("c5e1efdb")  # vpxor %xmm3,%xmm3,%xmm3
    assert validate_form(facts(raw).form, [raw], 8).status == "exact"
    original = S.Interpreter.mark

    def no_zeroing(self, path, address, length):
        original(self, path, address, length)
        for name in S.ZMM_HI:
            off = S.REG_BY_NAME[name][0]
            for k in range(32):
                path.regs.pop(off + k, None)

    monkeypatch.setattr(S.Interpreter, "mark", no_zeroing)
    assert "zmm upper" in validate_form(facts(raw).form, [raw], 8).loose


def test_an_unknown_form_is_denied_by_default():
    from relocverify.proof.admission import status

    f = facts(bytes.fromhex("2e3e2e3e4801d8"))  # a form no kernel and no corpus has
    assert form_table.load().row(f.form) is None
    assert status(f)[0] is None and "not in the CPU-validated table" in status(f)[1]


# --- a floating-point form's memory operand (the CI's random sample found one validated exact) ---------

_CVTSS2SD_M32 = "CVTSS2SD_XMM_XMMM32 xmm:A,m4[bB] |f3||"


def _special_f32(v: int) -> bool:
    """A NaN or a denormal: the operands whose conversion sets MXCSR's invalid or denormal flag."""
    exponent, fraction = (v >> 23) & 0xFF, v & 0x7FFFFF
    return (exponent == 0xFF and fraction) or (exponent == 0 and fraction)


@pytest.mark.parametrize("fp", [True, False])
def test_a_floating_point_memory_operand_meets_nans_and_denormals(fp):
    """The mechanism: ``states.place(..., fp_edge=k)`` gives the k-th state's access a signalling NaN, a
    denormal, a quiet NaN... in turn (every even state), so the first four states of a form meet a
    signalling NaN and a denormal whatever the seed; random bytes alone are one about once in a hundred."""
    import random as r

    from relocverify.concrete import states

    raw = bytes.fromhex("f30f5a4310")  # cvtss2sd 0x10(%rbx),%xmm0
    rng, seen, placed = r.Random(7), [], 0
    while placed < 200:
        s = states.place(raw, 0x30000100, states.random_registers(rng, vector_state=False), rng,
                         fp_edge=placed if fp else None)
        if s is None:
            continue
        placed += 1
        at = (s.registers["rbx"] + 0x10) & (1 << 64) - 1
        seen.append(int.from_bytes(bytes(s.memory[at + k] for k in range(4)), "little"))
    specials = sum(bool(_special_f32(v)) for v in seen)
    if fp:
        assert seen[0] == 0x7F800001 and _special_f32(seen[2]) and seen[2] & 0x7FFFFFFF < 0x800000  # SNaN, denormal
        assert specials > len(seen) // 3
    else:
        assert specials < len(seen) // 20


@on_x86
def test_a_float_conversion_of_a_nan_in_memory_is_loose():
    """The witness: cvtss2sd from memory sets MXCSR's invalid flag for a signalling NaN (and the
    denormal flag for a denormal), which VEX does not model; validated with edge operands it is loose,
    whatever the seed.  (It is loose for the proofs in any case: ``lifter_checks`` calls every form
    that computes floating point loose.)"""
    row = form_table.load().rows[_CVTSS2SD_M32]
    assert row.status == "loose" and "mxcsr status" in row.loose
    for seed in (0, 1, 2):
        again = validate_form(row.form, [bytes.fromhex(h) for h in row.instances], 8, seed)
        assert again.status == "loose" and "mxcsr status" in again.loose, (seed, again)


@on_x86
def test_the_floating_point_forms_validated_exact_stay_exact_with_edge_operands(judge_mask):
    """Every row the table calls exact that computes floating point (int-to-double conversions, which no
    input can make inexact or invalid) validates exact again with edge values in its memory operands."""
    from relocverify.selftest.form_validation import is_floating_point

    rows = [r for r in form_table.load().rows.values()
            if r.status == "exact" and is_floating_point(bytes.fromhex(r.instances[0]))]
    assert rows
    for row in rows:
        again = validate_form(row.form, [bytes.fromhex(h) for h in row.instances], 8, 11)
        assert again.status == "exact", (row.form, again.loose, again.example)
