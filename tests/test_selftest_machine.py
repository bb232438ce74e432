"""The machine's operators and judges (issue 41): each operator makes candidates from real shapes, and each
judge tells apart a pair that differs in its dimension and agrees on one that does not."""

from __future__ import annotations

import io
import json
import platform
import random

import iced_x86 as iced
import pytest

from relocverify.cli.main import main
from relocverify.concrete.outcome import MachineState
from relocverify.proof.verdict import ProofResult, Verdict
from relocverify.selftest import (fault_kinds, fault_signals, indirect_branches, interrupt_frames, operators as O,
                                  run as selftest_run, shadow_stack, traps)
from relocverify.selftest.kernel_twin import twin
from relocverify.selftest.machine_judgement import judge_machine
from relocverify.selftest.machine_states import KERNEL_HALF, kernel
from relocverify.selftest.machine_trace import run_trace, sides

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="the judges run code on an x86-64 CPU")

MACHINE_OPERATORS = ("fault-segment", "rmw-split", "trap-late", "below-rsp", "ibt-indirect", "shadow-stack",
                     "unaligned-slot", "edge-operand")
MACHINE_CONTROLS = ("stack-order", "aligned-slot", "kernel-copy", "same-segment")
SHAPES = ("5b", "50", "c9", "c3", "4157", "6a08", "e800100000", "ffd0", "c21000", "48014308", "ff4500",
          "488b442408", "488b4308", "48034508", "4801c3", "48c1e003", "9d", "fb", "7440", "e900100000")
KAT, KT = O.KERNEL.at, O.KERNEL.tramp
STACK = 0x20008000


def _op(name: str) -> O.Operator:
    return next(o for o in O.OPERATORS if o.name == name)


def _made(name: str, seeds: int = 4) -> list[O.Candidate]:
    op, out = _op(name), []
    for seed in range(seeds):
        rng = random.Random(seed)
        for h in SHAPES:
            c = op.make(O.shape_for(bytes.fromhex(h)), rng)
            if c is not None:
                out.append(c)
    return out


def _state(**regs) -> MachineState:
    memory = {STACK - 0x100 + k: (k * 7) & 0xFF for k in range(0x200)}
    return MachineState({"rsp": STACK, "rflags": 0x202, **regs}, memory)


def _traces(orig: str, reloc: bytes, at: int = KAT, tramp: int = KT, state: MachineState | None = None):
    o, r = sides(bytes.fromhex(orig), at, reloc, tramp, continuation=True)
    after = frozenset(a for a, _ in o.code[1:])
    s = state or _state()
    return run_trace(o, s, continuation=after), run_trace(r, s, continuation=after), s


def _back(body: bytes, length: int, tramp: int = KT, at: int = KAT) -> bytes:
    return O._back(O.Site(at, tramp, 0), body, length)


@pytest.mark.parametrize("name", MACHINE_OPERATORS + MACHINE_CONTROLS)
def test_every_machine_operator_makes_decodable_candidates_at_its_site(name):
    made = _made(name)
    assert len(made) >= 8, (name, len(made))
    for c in made:
        assert c.operator == name and c.klass == (0 if name in MACHINE_CONTROLS else _op(name).klass)
        assert all(not i.is_invalid for i in iced.Decoder(64, c.reloc[:len(c.reloc) - 8 if b"\xff\x25\x00\x00\x00\x00"
                                                                         in c.reloc else len(c.reloc)], ip=c.tramp))
        assert kernel(c.at) == kernel(c.tramp) and c.tramp - c.at == O.TRAMP - O.AT
    if name in ("below-rsp", "ibt-indirect", "trap-late", "stack-order", "kernel-copy"):
        assert any(c.at >= KERNEL_HALF for c in made)
    if name in ("unaligned-slot", "aligned-slot"):
        assert all(c.at < KERNEL_HALF for c in made)


def test_the_machine_classes_are_numbered_after_the_fifteen():
    assert {_op(n).klass for n in MACHINE_OPERATORS} == set(range(16, 23))


def test_traps_a_popf_copied_before_the_jump_back_traps_one_instruction_early():
    state = _state()
    state = MachineState(state.registers, state.memory | {STACK + 1: 0x03})  # TF and IF popped
    to, tr, _ = _traces("9d", _back(b"\x9d", 1), state=state)
    assert "single-step" in traps.compare(to, tr, True)
    to, tr, _ = _traces("4801c3", _back(bytes.fromhex("4801c3"), 3), state=state)
    assert traps.compare(to, tr, True) == ""


def test_traps_an_sti_copied_leaves_a_exit_open_to_interrupts():
    state = MachineState(_state().registers | {"rflags": 0x2}, _state().memory)
    to, tr, _ = _traces("fb", _back(b"\xfb", 1), state=state)
    assert "interrupt windows" in traps.compare(to, tr, True)
    assert "held off at the exit" in traps.compare(to, tr, True)


def test_ibt_an_absolute_jump_back_at_cpl0_lands_on_no_endbr64():
    reloc = O._abs_back(O.KERNEL, bytes.fromhex("4801c3"), KAT + 3)
    to, tr, _ = _traces("4801c3", reloc)
    assert "#CP" in indirect_branches.compare(to, tr, KAT, KT, 3, len(reloc))
    to, tr, _ = _traces("4801c3", _back(bytes.fromhex("4801c3"), 3))
    assert indirect_branches.compare(to, tr, KAT, KT, 3, 8) == ""
    # the original's own indirect jump, copied: the same #CP on both sides
    state = _state(rax=0x540000000)
    to, tr, _ = _traces("ffe0", b"\xff\xe0", state=state)
    assert indirect_branches.compare(to, tr, KAT, KT, 2, 2) == ""


def test_ibt_a_target_in_the_trampoline_on_endbr64_is_fine():
    # jmp *%r11 to T+13 where endbr64 is, then the jump back
    body = bytes.fromhex("4c8d1d06000000") + bytes.fromhex("41ffe3") + b"\x90\x90\x90" + b"\xf3\x0f\x1e\xfa"
    reloc = _back(body, 3)
    to, tr, _ = _traces("4801c3", reloc)
    assert tr.steps[2].raw == b"\xf3\x0f\x1e\xfa", [s.raw.hex() for s in tr.steps]
    assert indirect_branches.first_violation(tr, (KT, len(reloc)), "T") is None


def test_the_shadow_stack_sees_a_call_as_push_and_jmp_and_a_ret_as_lea_and_jmp():
    at, tramp = O.AT, O.TRAMP
    call = O.Candidate("x", 0, bytes.fromhex("e800100000"), O._code(O.USER, [O._I.create_i32(
        O._C.PUSHQ_IMM32, at + 5), O._I.create_branch(O._C.JMP_REL32_64, at + 5 + 0x1000)]), at, tramp)
    o, r = sides(call.orig, at, call.reloc, tramp)
    s = _state()
    assert "the next ret raises #CP" in shadow_stack.compare(run_trace(o, s), run_trace(r, s), s)
    pad = (0x540000000).to_bytes(8, "little")
    ret_state = MachineState(s.registers, s.memory | {STACK + k: b for k, b in enumerate(pad)})
    o, r = sides(b"\xc3", at, bytes.fromhex("488d642408ff6424f8"), tramp)
    assert shadow_stack.compare(run_trace(o, ret_state), run_trace(r, ret_state), ret_state)
    o, r = sides(b"\xc3", at, b"\xc3", tramp)  # a ret copied: the same pop
    assert shadow_stack.compare(run_trace(o, ret_state), run_trace(r, ret_state), ret_state) == ""


def test_fault_kinds_a_split_read_modify_write_faults_as_a_read():
    c = O.rmw_split(O.shape_for(bytes.fromhex("48014308")), random.Random(0))
    o, r = sides(c.orig, c.at, c.reloc, c.tramp)
    how, _ = fault_kinds.compare(o, r, [_state(rbx=0x20005000)], c.orig, c.at)
    assert "W=1" in how and "W=0" in how
    same = bytes.fromhex("48014308")
    o, r = sides(same, c.at, O._back(O.Site(c.at, c.tramp, 0), same, 4), c.tramp)
    assert fault_kinds.compare(o, r, [_state(rbx=0x20005000)], same, c.at) == ("", None)


def test_fault_kinds_an_rsp_access_through_another_register_is_gp_not_ss():
    shape = O.shape_for(bytes.fromhex("488b442408"))
    moved = O._back(O.USER, O._rebased(shape, O.USER, O._R.R11), 5)
    o, r = sides(shape.raw, O.AT, moved, O.TRAMP)
    how, _ = fault_kinds.compare(o, r, [_state()], shape.raw, O.AT)
    assert "#SS" in how and "#GP" in how
    shape = O.shape_for(bytes.fromhex("488b4308"))
    moved = O._back(O.USER, O._rebased(shape, O.USER, O._R.R11), 4)
    o, r = sides(shape.raw, O.AT, moved, O.TRAMP)
    assert fault_kinds.compare(o, r, [_state(rbx=0x20005000)], shape.raw, O.AT) == ("", None)


def test_interrupt_frames_overwrite_data_left_below_rsp_at_cpl0_and_not_in_the_red_zone_at_cpl3():
    rng = random.Random(1)
    late = bytes.fromhex("488d642408488b5c24f8")  # lea 8(%rsp),%rsp; mov -8(%rsp),%rbx
    first = bytes.fromhex("488b1c24488d642408")  # mov (%rsp),%rbx; lea 8(%rsp),%rsp
    states = [_state(), _state(rsp=STACK + 8)]
    _, r = sides(b"\x5b", KAT, _back(late, 1), KT)
    how, _ = interrupt_frames.compare(r, KT, states, True, rng)
    assert "rbx" in how, how
    _, r = sides(b"\x5b", KAT, _back(first, 1), KT)
    assert interrupt_frames.compare(r, KT, states, True, rng) == ("", None)
    _, r = sides(b"\x5b", O.AT, _back(late, 1, O.TRAMP, O.AT), O.TRAMP)
    assert interrupt_frames.compare(r, O.TRAMP, states, False, rng) == ("", None)


def test_interrupt_frames_wait_for_if_and_the_sti_shadow():
    late = bytes.fromhex("488d642408488b5c24f8")
    _, r = sides(b"\x5b", KAT, _back(late, 1), KT)
    off = MachineState(_state().registers | {"rflags": 0x2}, _state().memory)
    assert interrupt_frames.boundaries(run_trace(r, off), True) == []
    assert interrupt_frames.boundaries(run_trace(r, _state()), True) == [1, 2]


def test_this_cpu_tells_an_unaligned_slot_and_a_segment_change_apart_by_signal():
    rng = random.Random(2)
    shape = O.shape_for(bytes.fromhex("4801c3"))
    states = [_state(rax=5, rbx=7)]
    bad = O.Candidate("x", 21, shape.raw, O._abs_back(O.USER, shape.raw, O.AT + 3, 3), O.AT, O.TRAMP)
    how, _ = fault_signals.compare(bad, states, rng)
    assert "SIGBUS" in how, how
    good = O.Candidate("x", 0, shape.raw, O._abs_back(O.USER, shape.raw, O.AT + 3), O.AT, O.TRAMP)
    assert fault_signals.compare(good, states, rng) == ("", None)
    shape = O.shape_for(bytes.fromhex("488b442408"))
    moved = O._at(O.USER, "x", 16, shape.raw, O._back(O.USER, O._rebased(shape, O.USER, O._R.R11), 5), "", True)
    how, _ = fault_signals.compare(moved, [_state()], rng)
    assert "SIGBUS" in how and "SIGSEGV" in how, how


def test_a_kernel_candidate_s_twin_moves_its_addresses_and_leaves_other_immediates():
    c = O.Candidate("x", 19, bytes.fromhex("e800100000"), O._abs_back(O.KERNEL, O._code(O.KERNEL, [O._I.create_i32(
        O._C.PUSHQ_IMM32, O._signed64(KAT + 5))]), KAT + 5 + 0x1000), KAT, KT)
    t = twin(c)
    assert t.at == O.AT and (O.AT + 5).to_bytes(4, "little") in t.reloc
    assert (O.AT + 0x1005).to_bytes(8, "little") in t.reloc
    imm = bytes.fromhex("4981eb00000081")  # sub $0xffffffff81000000,%r11: an immediate, not an address
    c = O.Candidate("x", 0, imm, _back(imm, len(imm)), KAT, KT)
    assert twin(c).reloc[:len(imm)] == imm


def test_judge_machine_finds_each_machine_operator_s_difference_and_none_in_its_controls():
    found = set()
    for name in MACHINE_OPERATORS:
        for c in _made(name, seeds=2)[:10]:
            if judge_machine(c, 6, random.Random(3)).differs:
                found.add(name)
                break
    assert found >= set(MACHINE_OPERATORS) - {"edge-operand"}, set(MACHINE_OPERATORS) - found
    for name in MACHINE_CONTROLS:
        for c in _made(name, seeds=1)[:4]:
            j = judge_machine(c, 6, random.Random(3))
            assert not j.differs, (c.replay, j.how)


def test_a_checker_that_proves_every_machine_candidate_is_caught(monkeypatch):
    """The machine judges behind the selftest: with every pair 'proved', each machine class yields false
    proofs (edge operands are the CPU judge's, on flags), and the command exits 1."""
    monkeypatch.setattr(selftest_run, "prove_relocation",
                        lambda *a, **k: ProofResult(Verdict.PROVED, "sabotaged", "test"))
    out, err = io.StringIO(), io.StringIO()
    code = main(["selftest", "--pairs", "48", "--seed", "7", "--json", "--jobs", "1", "--states", "6",
                 "--operators", "16,17,18,19,20,21"], out, err)
    report = json.loads(out.getvalue())
    assert code == 1
    found = {fp["operator"] for fp in report["false_proofs"]}
    assert found >= {"fault-segment", "rmw-split", "trap-late", "below-rsp", "ibt-indirect", "shadow-stack",
                     "unaligned-slot"}, found
