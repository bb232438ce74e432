"""Instruction forms and the facts the semantics cannot see (proof.forms), and the reachable walk."""

from __future__ import annotations

import pytest

from relocverify.proof.forms import extra_features, facts
from relocverify.proof.reachable import reachable


def f(hexbytes: str):
    return facts(bytes.fromhex(hexbytes))


def test_a_rex_before_a_legacy_prefix_is_another_form_read_as_the_cpu_reads_it():
    plain, ignored = f("664801c0"), f("486601c0")
    assert plain.code == "ADD_RM64_R64"  # 66 then REX.W: a 64-bit add
    assert ignored.code == "ADD_RM16_R16"  # REX.W then 66: the CPU ignores the REX
    assert "|rex.66|" in ignored.form and ignored.form != f("6601c0").form


def test_forms_abstract_registers_displacements_and_blind_immediates_but_keep_aliasing():
    assert f("4801d8").form == f("4d01c8").form  # add rbx,rax vs add r9,r8
    assert f("4801c0").form != f("4801d8").form  # add rax,rax: one register twice
    assert f("488b4310").form == f("488b4b7f").form  # the displacement is not part of the form
    assert f("4883c001").form == f("4883c07f").form  # an ALU immediate is not
    assert f("660f70c01b").form != f("660f70c0e4").form  # a shuffle's immediate is


def test_facts_carry_what_the_ir_does_not():
    assert f("0faef0").hazards.fence == "mfence" and f("0faee8").hazards.fence == "lfence"
    assert f("0fc303").hazards.nontemporal
    assert f("f0ff00").hazards.locked and f("488703").hazards.locked
    assert (f("660fd400").align, f("660fd400").align_legacy) == (16, True)  # paddq xmm, m128: legacy SSE
    assert f("c5f9d400").align == 0  # vpaddq: no alignment check
    assert (f("c5f96f00").align, f("c5f96f00").align_legacy) == (16, False)  # vmovdqa: aligned, on every vendor
    assert f("c5fa6f00").align == 0  # vmovdqu
    assert f("c5e1efdb").zeroes_upper == (3,) and f("660fefdb").zeroes_upper == ()
    assert f("dbe2").x87 and not f("4801d8").x87


def test_vendor_splits_are_named():
    assert f("66e900000000").vendor_split  # jmp rel32 with 0x66: rel16 on AMD
    assert f("66c3").vendor_split is None or "AMD" in f("66c3").vendor_split
    assert f("e900000000").vendor_split is None


@pytest.mark.parametrize("hexbytes", ["2e" * 15 + "90", "f0" + "90", "c4e27df7c0" + "00"])
def test_not_one_valid_instruction(hexbytes):
    assert facts(bytes.fromhex(hexbytes)) is None


def test_features_the_relocation_adds():
    assert extra_features(f("0fbcc3").features, f("f30fbcc3").features) == {"BMI1"}  # bsf -> tzcnt
    assert not extra_features(f("4801d8").features, f("e900000000").features)


def test_the_walk_follows_control_flow_into_the_middle_of_an_instruction():
    code = bytes.fromhex("eb01f0ff00") + bytes.fromhex("e900000000")
    walk = reachable(code, 0x1000)
    assert walk.problem is None
    assert [raw.hex() for _, raw in walk.instructions] == ["eb01", "ff00", "e900000000"]  # the LOCK is skipped


def test_the_walk_refuses_bytes_the_cpu_cannot_run():
    assert reachable(bytes.fromhex("eb0006"), 0x1000).problem  # push es: invalid in 64-bit mode
    assert reachable(bytes.fromhex("48"), 0x1000).problem  # runs past the code
