"""The CPU judge (concrete.cpu): the whole user-visible state in and out, on this machine's CPU."""

from __future__ import annotations

import platform
import random

import pytest

import iced_x86 as iced

from relocverify.concrete import cpu, native, states
from relocverify.concrete.cpu_identity import FEATURE_MASK_ENV
from relocverify.concrete.outcome import MachineState
from relocverify.errors import InputError
from relocverify.x86.decode import decode

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="runs code on an x86-64 CPU")

A = 0x30000100
DATA = ((states.ARENA, states.ARENA_SIZE),)
RSP = states.ARENA + 0x8000


def run(hexbytes: str, exits=None, **regs):
    raw = bytes.fromhex(hexbytes)
    regs.setdefault("rsp", RSP)
    program = cpu.Program(((A, raw),), A, tuple(exits or (A + len(raw),)), DATA)
    (out,) = cpu.run_on_cpu(program, [MachineState(regs, {})])
    return out


@pytest.fixture(params=["", "-avx512", "-avx"], ids=["this-cpu", "no-avx512", "no-avx"])
def judge_mask(request, monkeypatch):
    """The judge as on this CPU, and as on a CPU without AVX-512 (or AVX): the feature mask, whatever CPU
    runs the suite."""
    monkeypatch.setenv(FEATURE_MASK_ENV, request.param)
    return request.param


def test_every_register_class_round_trips_through_a_nop(judge_mask):
    """Every register this CPU has (under the mask) comes back as it went in, and a class it has not is
    absent from the outcome (not 0)."""
    rng = random.Random(1)
    regs = states.random_registers(rng)
    regs["rsp"] = RSP
    regs["rflags"] &= ~(1 << 18)
    out = run("90", **regs)
    assert out.fault is None and out.next_rip == A + 1
    layout = cpu.xsave_layout()
    assert set(out.registers) == set(cpu.state_names())
    for name in cpu.state_names():
        width = {"mxcsr": cpu.mxcsr_mask()}.get(name, (1 << (layout.vector_bits if name.startswith("zmm") else 80)) - 1)
        if name != "rflags":
            assert out.registers[name] == regs.get(name, 0) & width, name
    assert (out.registers["rflags"] ^ regs["rflags"]) & 0xCD5 == 0
    has_avx512 = "avx512f" in native.cpu_flags() and judge_mask == ""
    assert ("k3" in out.registers) == ("zmm31" in out.registers) == has_avx512
    if not has_avx512:
        assert out.registers["zmm3"] < 1 << layout.vector_bits and "avx512f" not in cpu.identity().features


def test_the_mask_gives_xsave_and_xrstor_a_reduced_requested_feature_bitmap(monkeypatch):
    """Under -avx512 the state's xrstor and the outcome's xsave name XCR0 less the AVX-512 components in
    edx:eax (so the CPU neither loads nor stores them); the host's own save and restore stay whole."""
    monkeypatch.setenv(FEATURE_MASK_ENV, "-avx512")
    layout = cpu.xsave_layout()
    assert layout.xcr0 == cpu.xcr0() & ~0xE0 and not layout.avx512 and 5 not in layout.offsets
    page, _, epilogue_at = cpu.harness_page(True, layout.xcr0)
    requested = []
    for part in (page[:epilogue_at], page[epilogue_at:]):
        eax = edx = None
        for ins in iced.Decoder(64, part):
            if ins.code == iced.Code.MOV_R32_IMM32:
                eax, edx = (ins.immediate32, edx) if ins.op0_register == iced.Register.EAX else (eax, ins.immediate32)
            if ins.mnemonic in (iced.Mnemonic.XSAVE64, iced.Mnemonic.XRSTOR64):
                requested.append(eax | edx << 32)
            if ins.code == iced.Code.INT3:
                break
    assert requested == [2**64 - 1, layout.xcr0, layout.xcr0, 2**64 - 1]  # host save, state in, state out, host


def test_a_masked_feature_is_not_run_and_says_why(monkeypatch):
    monkeypatch.setenv(FEATURE_MASK_ENV, "-avx512")
    program = cpu.Program(((A, bytes.fromhex("62f1fd48efc0")),), A, (A + 6,), DATA)  # vpxorq zmm0,zmm0,zmm0
    with pytest.raises(ValueError, match="AVX512F.*RELOCVERIFY_CPU_FEATURES=-avx512"):
        program.check()
    cpu.Program(((A, bytes.fromhex("c5f9efc0")),), A, (A + 4,), DATA).check()  # vpxor xmm: AVX is there
    monkeypatch.setenv(FEATURE_MASK_ENV, "-avx")
    with pytest.raises(ValueError, match="AVX"):
        cpu.Program(((A, bytes.fromhex("c5f9efc0")),), A, (A + 4,), DATA).check()
    assert native.refusal(decode(bytes.fromhex("62f17d08efc0"), 0)).startswith("cpu lacks")  # vpxord xmm (EVEX)


def test_the_identity_says_what_the_mask_hid(monkeypatch):
    here = cpu.identity()
    monkeypatch.setenv(FEATURE_MASK_ENV, "-avx512")
    masked = cpu.identity()
    assert masked.masked == ("avx512",) and not masked.avx512 and masked != here
    assert not any(f.startswith("avx512") for f in masked.features) and "k0-7" in masked.unseen()
    assert (masked.vendor, masked.family, masked.model) == (here.vendor, here.family, here.model)
    assert "masked -avx512" in masked.describe()


def test_a_state_is_cut_to_what_the_cpu_loads(monkeypatch):
    state = MachineState({"rax": 1, "zmm3": (1 << 512) - 1, "ymm4": (1 << 256) - 1, "zmm20": 5, "k3": 7}, {})
    monkeypatch.setenv(FEATURE_MASK_ENV, "-avx512")
    assert cpu.trim_state(state).registers == {"rax": 1, "zmm3": (1 << 256) - 1, "ymm4": (1 << 256) - 1}
    monkeypatch.setenv(FEATURE_MASK_ENV, "-avx")
    assert cpu.trim_state(state).registers == {"rax": 1, "zmm3": (1 << 128) - 1, "ymm4": (1 << 128) - 1}


@pytest.mark.parametrize("text", ["avx512", "-avx513", "+avx512"])
def test_a_mask_that_names_no_hideable_feature_is_an_input_error(monkeypatch, text):
    monkeypatch.setenv(FEATURE_MASK_ENV, text)
    with pytest.raises(InputError, match="RELOCVERIFY_CPU_FEATURES=-avx512"):
        cpu.xsave_layout()


@pytest.mark.skipif(not cpu.xsave_layout().avx512, reason="this CPU has no AVX-512: no zmm upper bits to zero")
def test_a_vex_encoded_write_zeroes_zmm_bits_above_vl():
    before = (0xAB << 500) | (0xCD << 200) | 5
    out = run("c5e1efdb", zmm3=before)  # vpxor xmm3,xmm3,xmm3
    assert out.registers["zmm3"] == 0
    out = run("660fefdb", zmm3=before)  # pxor xmm3,xmm3: legacy SSE keeps bits 511:128
    assert out.registers["zmm3"] == before & ~((1 << 128) - 1)


def test_fnclex_clears_the_x87_exception_flags_vex_does_not_have():
    out = run("dbe2", fsw=0x80FF)
    assert out.registers["fsw"] == 0


def test_faults_are_outcomes_and_a_loop_times_out():
    assert run("48f7f1", rax=1, rdx=0, rcx=0).fault == "signal SIGFPE"  # div %rcx by 0
    assert run("48f7f1", rax=0, rdx=5, rcx=2).fault == "signal SIGFPE"  # quotient overflow
    assert run("ebfe").fault == "timeout"


def test_a_segment_base_is_an_input():
    raw = "65488b042510000000"  # mov %gs:0x10,%rax
    program = cpu.Program(((A, bytes.fromhex(raw)),), A, (A + 9,), DATA)
    state = MachineState({"gs_base": states.ARENA + 0x100, "rsp": RSP}, {states.ARENA + 0x110: 0xAB})
    (out,) = cpu.run_on_cpu(program, [state])
    assert out.registers["rax"] == 0xAB


def test_a_branch_lands_on_its_pad():
    out = run("7440", exits=(A + 2, A + 0x42), rflags=0x42)  # je +0x40 with ZF set
    assert out.next_rip == A + 0x42
    assert run("7440", exits=(A + 2, A + 0x42), rflags=0x2).next_rip == A + 2


def test_placed_states_put_every_access_in_the_arena():
    rng = random.Random(3)
    for hexbytes in ("488b04c8", "ff742408", "f3a4", "c3", "ff10", "65488b042510000000"):
        raw = bytes.fromhex(hexbytes)
        for _ in range(5):
            state = states.place(raw, A, states.random_registers(rng), rng)
            assert state is not None
            program = cpu.Program(((A, raw),), A, tuple(sorted({A + len(raw), states.PAD})), DATA)
            (out,) = cpu.run_on_cpu(program, [state])
            assert out.fault is None, (hexbytes, out.fault)


def test_overlapping_code_and_pads_are_refused():
    with pytest.raises(ValueError):
        cpu.Program(((A, b"\x90" * 4),), A, (A + 2,), DATA).check()


def test_the_selftest_judge_compares_only_state_the_cpu_has(monkeypatch):
    """Two outcomes that differ only in k3: told apart with AVX-512, alike where the CPU has none (neither
    side has k3 there); and under the mask the judge still tells a false relocation from a true one."""
    from relocverify.concrete.outcome import Outcome
    from relocverify.selftest.judgement import difference, judge
    from relocverify.selftest.operators import AT, TRAMP, Candidate, jmp

    base = {**{r: 0 for r in cpu.state_names()}, "rflags": 2}
    o, r = Outcome(dict(base, k3=1), A, {}), Outcome(dict(base, k3=2), A, {})
    monkeypatch.setenv(FEATURE_MASK_ENV, "-avx512")
    assert difference(o, r, ()) == ""
    bad = Candidate("rex-before-legacy", 1, bytes.fromhex("4801c0"), bytes.fromhex("486601c0") + jmp(TRAMP + 4, AT + 3))
    assert judge(bad, 8, random.Random(1)).differs
    good = Candidate("own-plan", 0, bytes.fromhex("4801c0"), bytes.fromhex("4801c0") + jmp(TRAMP + 3, AT + 3))
    assert not judge(good, 8, random.Random(1)).differs
    vpxorq = bytes.fromhex("62f1fd48efc0")  # vpxorq %zmm0,%zmm0,%zmm0
    evex = Candidate("avx512-state", 8, vpxorq, vpxorq + jmp(TRAMP + 6, AT + 6))
    verdict = judge(evex, 8, random.Random(1))
    assert not verdict.differs and "not runnable here" in verdict.how and "AVX512F" in verdict.how
    monkeypatch.setenv(FEATURE_MASK_ENV, "")
    if cpu.xsave_layout().avx512:
        assert difference(o, r, ()) == "k3: original 0x1, relocation 0x2"


def test_selftest_runs_as_on_a_cpu_without_avx512(monkeypatch):
    """The command, under the mask: the vector-state operators and the controls, no false proof."""
    import io
    import json

    from relocverify.cli.main import main

    monkeypatch.setenv(FEATURE_MASK_ENV, "-avx512")
    out, err = io.StringIO(), io.StringIO()
    code = main(["selftest", "--pairs", "40", "--seed", "3", "--operators", "8,0", "--states", "8", "--json",
                 "--jobs", "2"], out, err)
    report = json.loads(out.getvalue())
    assert code == 0 and not report["false_proofs"], report["false_proofs"][:2]
    assert report["controls"]["proved"] > 0
