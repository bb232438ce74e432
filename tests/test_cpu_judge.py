"""The CPU judge (concrete.cpu): the whole user-visible state in and out, on this machine's CPU."""

from __future__ import annotations

import platform
import random

import pytest

from relocverify.concrete import cpu, states
from relocverify.concrete.outcome import MachineState

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


def test_every_register_class_round_trips_through_a_nop():
    rng = random.Random(1)
    regs = states.random_registers(rng)
    regs["rsp"] = RSP
    regs["rflags"] &= ~(1 << 18)
    out = run("90", **regs)
    assert out.fault is None and out.next_rip == A + 1
    for name in ("rax", "r15", "mxcsr", "fcw", "fsw", "ftw", "k3", "zmm31") + tuple(f"st{i}" for i in range(8)):
        expected = regs[name] & (cpu.mxcsr_mask() if name == "mxcsr" else (1 << 512) - 1)
        assert out.registers[name] == expected, name
    assert (out.registers["rflags"] ^ regs["rflags"]) & 0xCD5 == 0


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
