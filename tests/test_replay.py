"""The unicorn replay: real unicorn runs at kernel addresses, no mocks."""

from __future__ import annotations

import io
import json
import shlex
import struct

import pytest

from relocverify import cli
from relocverify.x86.decode import decode
from relocverify.plan.effects import (Address, AddRsp, Branch, Const, Jump, Let, Load, Push, Reg, Temp, effect_json)
from relocverify.plan.plan import PlanKind, make_plan
from relocverify.x86.encoding import patch_disp
from relocverify.concrete.effect_machine import run_effects
from relocverify.concrete.machine import run_original, run_relocated
from relocverify.concrete.outcome import MachineState, Outcome, unmodelled_registers
from relocverify.concrete.replay import compare, replay
from relocverify.plan.effects import effects_from_json
from relocverify.proof.verdict import Counterexample

A = 0xFFFFFFFF81234560
T = 0xFFFFFFFFC0001000
STACK = 0xFFFFC90000013F00
ZF, SF, OF = 1 << 6, 1 << 7, 1 << 11


def qword(addr: int, value: int) -> dict[int, int]:
    return {addr + i: b for i, b in enumerate(struct.pack("<Q", value))}


def plan_for(hexbytes: str, tramp: int = T):
    orig = bytes.fromhex(hexbytes)
    return orig, make_plan(decode(orig, A), tramp)


# A RIP-relative load, rewritten


def test_rip_relative_load_rewrite_matches_original():
    orig, plan = plan_for("488b0510000000")  # mov 0x10(%rip),%rax
    assert plan.kind is PlanKind.REWRITE
    state = MachineState({"rax": 5}, qword(A + 7 + 0x10, 0x1122334455667788))
    r = replay(orig, A, T, state, reloc=plan.trampoline, tracer_memory=plan.tracer_memory)
    assert r.original.fault is None and r.relocated.fault is None
    assert r.original.registers["rax"] == 0x1122334455667788
    assert r.original.next_rip == r.relocated.next_rip == A + 7
    assert r.differences == () and not r.differ


def test_displacement_off_by_one_differs_in_rax():
    orig, plan = plan_for("488b0510000000")
    off = plan.trampoline.index(orig[:3]) + 3
    disp = struct.unpack_from("<i", plan.trampoline, off)[0]
    wrong = patch_disp(plan.trampoline, off, disp + 1)
    state = MachineState({}, qword(A + 7 + 0x10, 0x1122334455667788))
    r = replay(orig, A, T, state, reloc=wrong, tracer_memory=plan.tracer_memory)
    assert r.differ
    assert [d.what for d in r.differences] == ["rax"]
    assert r.differences[0].original == "0x1122334455667788"
    assert r.differences[0].relocated == "0x11223344556677"


def test_scratch_register_rewrite_matches_with_its_save_slot_as_tracer_memory():
    orig, plan = plan_for("488b0510000000", tramp=0x7F0000001000)  # A out of s32 reach of T
    assert plan.rule == "rip-scratch"
    state = MachineState({"rsi": 0x1234}, qword(A + 7 + 0x10, 0xAB))
    r = replay(orig, A, plan.tramp, state, reloc=plan.trampoline, tracer_memory=plan.tracer_memory)
    assert not r.differ
    without_slot = replay(orig, A, plan.tramp, state, reloc=plan.trampoline,
                          tracer_memory=((plan.tramp, len(plan.trampoline)),))
    assert [d.what for d in without_slot.differences] == [f"mem[{plan.save_slot:#x}]"]


def test_rip_relative_store_just_past_the_instruction_lands():
    orig, plan = plan_for("c70510000000aabbccdd")  # movl $0xddccbbaa, 0x10(%rip)
    r = replay(orig, A, T, MachineState({}, {}), reloc=plan.trampoline, tracer_memory=plan.tracer_memory)
    assert r.original.writes == {A + 10 + 0x10 + i: b for i, b in enumerate(b"\xaa\xbb\xcc\xdd")}
    assert r.original.next_rip == A + 10 and not r.differ


def test_store_into_own_bytes_is_not_replayable():
    orig, plan = plan_for("c705f6ffffffaabbccdd")  # movl $.., -10(%rip): overwrites itself
    r = replay(orig, A, T, MachineState({}, {}), reloc=plan.trampoline, tracer_memory=plan.tracer_memory)
    assert not r.replayable and not r.differ
    assert "self-modifying" in r.limit


def test_kernel_addresses_do_not_alias():
    # 0xffffffff81000000 and 0x000fffff81000000 are one page under unicorn's default TLB.
    orig = bytes.fromhex("488b03")  # mov (%rbx),%rax
    memory = {**qword(0xFFFFFFFF81000000, 1), **qword(0x000FFFFF81000000, 2), **qword(0x8000000000001000, 3)}
    for addr, value in ((0xFFFFFFFF81000000, 1), (0x000FFFFF81000000, 2), (0x8000000000001000, 3)):
        assert run_original(orig, A, MachineState({"rbx": addr}, memory)).registers["rax"] == value


# call *%r11, emulated


def test_indirect_call_effects_match_and_kprobes_bug_differs():
    orig, plan = plan_for("41ffd3")  # call *%r11
    assert plan.kind is PlanKind.EMULATE
    state = MachineState({"r11": 0xFFFFFFFF81000000, "rsp": STACK}, {})
    r = replay(orig, A, T, state, effects=plan.effects)
    assert r.original.next_rip == r.relocated.next_rip == 0xFFFFFFFF81000000
    assert r.relocated.registers["rsp"] == STACK - 8
    assert r.relocated.writes == qword(STACK - 8, A + 3)
    assert not r.differ

    kprobes = (Let("target", Reg("r11")), Push(Const(A + 5)), Jump(Temp("target")))
    bug = replay(orig, A, T, state, effects=kprobes)
    assert [d.what for d in bug.differences] == [f"mem[{STACK - 8:#x}]"]
    assert bug.differences[0].original.startswith("63") and bug.differences[0].relocated.startswith("65")


# ret $8


def test_ret_imm16_against_plain_ret_differs_in_rsp():
    orig, plan = plan_for("c20800")
    state = MachineState({"rsp": STACK}, qword(STACK, 0xFFFFFFFF81111111))
    assert not replay(orig, A, T, state, effects=plan.effects).differ
    plain = (Let("target", Load(Address(base="rsp"), 8)), AddRsp(8), Jump(Temp("target")))
    r = replay(orig, A, T, state, effects=plain)
    assert r.original.next_rip == 0xFFFFFFFF81111111 == r.relocated.next_rip
    assert [(d.what, d.original, d.relocated) for d in r.differences] == \
        [("rsp", f"{STACK + 16:#x}", f"{STACK + 8:#x}")]


# rep movsb, copied


def test_rep_movsb_copy_matches():
    orig, plan = plan_for("f3a4")
    assert plan.kind is PlanKind.COPY
    state = MachineState({"rcx": 3, "rsi": 0x10000, "rdi": 0x20000}, {0x10000: 0x41, 0x10001: 0x42, 0x10002: 0x43})
    r = replay(orig, A, T, state, reloc=plan.trampoline, tracer_memory=plan.tracer_memory)
    assert r.original.writes == {0x20000: 0x41, 0x20001: 0x42, 0x20002: 0x43}
    assert r.original.registers["rcx"] == 0 and r.original.next_rip == A + 2
    assert not r.differ


def test_rep_with_huge_count_is_not_replayable():
    orig, plan = plan_for("f3a4")
    r = replay(orig, A, T, MachineState({"rcx": 1 << 40}, {}), reloc=plan.trampoline,
               tracer_memory=plan.tracer_memory)
    assert r.original.fault.startswith("timeout") and not r.replayable and not r.differ


# jle rel8


@pytest.mark.parametrize("flags, taken", [(ZF, True), (SF, True), (SF | OF, False), (0, False)])
def test_jle_rewrite_and_wrong_condition(flags, taken):
    orig, plan = plan_for("7e10")
    state = MachineState({"rflags": flags | 2}, {})
    right = replay(orig, A, T, state, reloc=plan.trampoline, tracer_memory=plan.tracer_memory)
    assert right.original.next_rip == (A + 2 + 0x10 if taken else A + 2)
    assert not right.differ
    jl = replay(orig, A, T, state, effects=(Branch("l", A + 0x12, A + 2),))
    assert jl.differ == (flags == ZF)  # jl ignores ZF


# run_effects details


def test_effects_address_forms():
    state = MachineState({"rbx": 0xFFFFFFFF00000010, "rcx": 2, "gs_base": 0x5000, "rsp": STACK},
                         {**qword(0x5000 + 0x10 + 2 * 8 + 8, 0xAAAA), **qword(0x38, 0xBBBB)})
    gs = Load(Address(base="rbx", index="rcx", scale=8, disp=8, segment="gs", address_size=32))
    flat = Load(Address(base="rbx", index="rcx", scale=8, disp=8 + 0x10))
    o = run_effects((Let("a", gs), Let("b", flat), Push(Temp("a")), Jump(Temp("b"))), A, state)
    assert o.fault is None and o.next_rip == 0  # flat: 0xffffffff00000038 reads 0
    assert o.writes == qword(STACK - 8, 0xAAAA)


@pytest.mark.parametrize("hexbytes, target_at", [
    ("6567ff64cb08", 0x5000 + 0x28),  # jmp *%gs:8(%ebx,%ecx,8): 32-bit address, then the gs base
    ("65ff64cbf8", 0x5000 + 0xFFFFFFFF00000018),  # jmp *%gs:-8(%rbx,%rcx,8)
    ("67ff24c5f0ffffff", 0xFFFFFFF8),  # jmp *-0x10(,%eax,8): wraps below 0 in 32 bits
    ("ff1425f0ffffff", 0xFFFFFFFFFFFFFFF0),  # call *-0x10: an absolute address at the top of memory
])
def test_effects_addresses_agree_with_unicorn(hexbytes, target_at):
    orig, plan = plan_for(hexbytes)
    assert plan.kind is PlanKind.EMULATE
    state = MachineState({"rbx": 0xFFFFFFFF00000010, "rcx": 2, "rax": 1, "gs_base": 0x5000, "rsp": STACK},
                         qword(target_at, 0xFFFFFFFF81ABCDEF))
    r = replay(orig, A, T, state, effects=plan.effects)
    assert r.original.next_rip == r.relocated.next_rip == 0xFFFFFFFF81ABCDEF
    assert not r.differ


def test_effects_program_without_final_jump_is_a_fault_not_an_exception():
    o = run_effects((Push(Const(1)),), A, MachineState({}, {}))
    assert o.fault and "jump" in o.fault


def test_faults_are_values():
    empty = MachineState({}, {})
    assert run_original(bytes.fromhex("0f0b"), A, empty).fault == "invalid instruction"
    assert run_original(bytes.fromhex("cc"), A, empty).fault == "exception #BP (vector 3)"
    assert run_original(bytes.fromhex("48f7f1"), A, empty).fault == "exception #DE (vector 0)"
    assert run_original(bytes.fromhex("0f05"), A, empty).fault.startswith("not replayable")
    assert run_original(bytes.fromhex("ebfe"), A, empty).next_rip == A  # jmp . has left


def test_relocation_exit_to_t_is_back_to_a_and_a_loop_times_out():
    empty = MachineState({}, {})
    assert run_relocated(bytes.fromhex("90ebfd"), T, A, 2, empty).next_rip == A  # nop; jmp T
    assert run_relocated(bytes.fromhex("90ebfe"), T, A, 2, empty).fault.startswith("timeout")


def test_compare_skips_tracer_memory_and_groups_bytes():
    a = Outcome({"rflags": 0x202}, A + 3, {0x100: 1, 0x101: 2}, None)
    b = Outcome({"rflags": 0x002}, A + 3, {0x100: 1, 0x101: 3, 0x102: 4, T: 9}, None)
    assert [(d.what, d.original, d.relocated) for d in compare(a, b, ((T, 16),))] == \
        [("mem[0x101]", "02 --", "03 04")]


def test_effects_json_round_trip():
    progs = [make_plan(decode(bytes.fromhex(h), A), T).effects for h in ("41ffd3", "c20800", "ff2510000000")]
    progs.append((Let("t", Load(Address("rax", "rcx", 4, -8, "fs", 32), 4)), Branch("le", A + 0x12, A + 2)))
    for prog in progs:
        assert effects_from_json(json.loads(json.dumps([effect_json(e) for e in prog]))) == prog


# The CLI


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return cli.main(["replay", *argv], out=out, err=err), out.getvalue(), err.getvalue()


def test_cli_replay_exit_codes():
    orig, plan = plan_for("488b0510000000")
    state = json.dumps({"registers": {"rax": "0x5"}, "memory": {hex(A + 0x17): "8877665544332211"}})
    base = ["--orig", orig.hex(), "--at", hex(A), "--tramp", hex(T), "--state", state]
    code, out, _ = run_cli(*base, "--reloc", plan.trampoline.hex())
    assert code == 0 and out.endswith("equal\n")

    off = plan.trampoline.index(orig[:3]) + 3
    wrong = patch_disp(plan.trampoline, off, struct.unpack_from("<i", plan.trampoline, off)[0] + 1)
    code, out, _ = run_cli(*base, "--reloc", wrong.hex())
    assert code == 1 and "differs: rax: original 0x1122334455667788" in out

    call = ["--orig", "41ffd3", "--at", hex(A), "--tramp", hex(T),
            "--state", json.dumps({"registers": {"r11": "0x1000", "rsp": hex(STACK)}})]
    bug = json.dumps([effect_json(e) for e in (Let("target", Reg("r11")), Push(Const(A + 5)), Jump(Temp("target")))])
    code, out, _ = run_cli(*call, "--effects", bug)
    assert code == 1 and f"mem[{STACK - 8:#x}]" in out

    code, out, err = run_cli(*base[:-1], "{not json", "--reloc", plan.trampoline.hex())
    assert code == 2 and out == "" and err.count("\n") == 1 and "--state is not valid JSON" in err

    code, _, err = run_cli(*call, "--effects", "[{\"op\": \"fly\"}]")
    assert code == 2 and "unknown effect op" in err

    code, _, err = run_cli(*base)  # neither --reloc nor --effects
    assert code == 2 and "exactly one of --reloc" in err


def test_counterexample_replay_line_runs():
    orig, plan = plan_for("41ffd3")
    kprobes = (Let("target", Reg("r11")), Push(Const(A + 5)), Jump(Temp("target")))
    cx = Counterexample(registers=(("r11", 0x1000), ("rsp", STACK)), memory=(), differences=(), orig_hex=orig.hex(),
                        at=A, tramp=T, effects_json=json.dumps([effect_json(e) for e in kprobes]))
    argv = shlex.split(cx.replay_command)
    assert argv[:2] == ["relocverify", "replay"]
    code, out, _ = run_cli(*argv[2:])
    assert code == 1 and "difference" in out
    assert replay(orig, A, T, cx.state(), effects=kprobes).differ


def test_cli_not_replayable_is_exit_3():
    code, out, _ = run_cli("--orig", "0f05", "--at", hex(A), "--tramp", hex(T), "--reloc", "0f05", "--state", "{}")
    assert code == 3 and out.splitlines()[-1].startswith("inconclusive: original: not replayable: syscall")


def test_unmodelled_registers_are_ignored_and_ymm_gives_xmm():
    state = MachineState({"ymm1": (7 << 128) | 0x55, "ftop": 3, "guest_912": 1}, {})
    assert unmodelled_registers(state) == ("ftop", "guest_912")
    o = run_original(bytes.fromhex("66480f7ec8"), A, state)  # movq %xmm1,%rax
    assert o.fault is None and o.registers["rax"] == 0x55 and o.registers["xmm1"] == 0x55
    _, plan = plan_for("66480f7ec8")
    code, out, _ = run_cli("--orig", "66480f7ec8", "--at", hex(A), "--tramp", hex(T), "--reloc", plan.trampoline.hex(),
                           "--state", json.dumps({"registers": {"ymm1": "0x55", "ftop": "0x3"}}))
    assert code == 0 and "ignored: ftop" in out
    code, _, err = run_cli("--orig", "90", "--at", hex(A), "--tramp", hex(T), "--reloc", "90",
                           "--state", json.dumps({"registers": {"%rax": "0x1"}}))
    assert code == 2 and "not a register name" in err
