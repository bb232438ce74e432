"""Counterexamples unicorn cannot confirm, replayed on this machine's CPU (``concrete.cpu_replay``,
``tracers.judge.replay_unconfirmed``): real bytes, the real tracer models, z3, and the CPU itself."""

from __future__ import annotations

import json
import subprocess

import pytest

from relocverify.concrete.cpu_identity import FEATURE_MASK_ENV
from relocverify.concrete.cpu_replay import replay_on_cpu, unsafe
from relocverify.concrete.native import cpu_flags
from relocverify.proof.verdict import Verdict
from relocverify.tracers import get_model
from relocverify.tracers.judge import UNCONFIRMED, prove_answer, replay_unconfirmed
from relocverify.tracers.model import Context, machine_of
from relocverify.x86.decode import decode
from relocverify.x86.encoding import jump

A = 0xFFFFFFFF81234560  # a kernel text address: the replay moves it into user space
T = 0xFFFFFFFFC0001000  # the kernel tracers' slot in module space
VPCMPEQB_YMM = bytes.fromhex("c5fd7407")  # vpcmpeqb (%rdi),%ymm0,%ymm0: unicorn raises invalid-instruction
PAUSE = bytes.fromhex("f390")


def _judged(tracer: str, raw: bytes, at: int = A, tramp: int = T):
    insn = decode(raw + b"\x90" * 8, at)
    model = get_model(tracer)
    answer = model.answer(insn, tramp, Context(True, frozenset(), "f", raw))
    return insn, answer, prove_answer(insn, answer, tramp, 10.0, machine_of(model))


def _has_avx2() -> bool:
    return "avx2" in cpu_flags()


@pytest.mark.parametrize("tracer", ["uprobes@6.1", "kprobes@6.1"])
def test_a_vex256_jcc_emulation_unicorn_cannot_run_is_confirmed_on_the_cpu(tracer):
    """Both tracers take c5 fd 74 07 (opcode byte 74 after the VEX prefix) for je: z3 refutes the
    emulation, unicorn cannot run vpcmpeqb on ymm, the CPU runs it and shows ymm0 changed."""
    insn, answer, result = _judged(tracer, VPCMPEQB_YMM)
    assert answer.kind == "emulate"
    assert result.verdict is Verdict.UNKNOWN and result.reason.startswith(UNCONFIRMED)
    assert "unicorn cannot execute vpcmpeqb" in result.reason
    decided = replay_unconfirmed(insn, answer, result)
    if not _has_avx2():  # a judge without AVX2 cannot run it: it says so, and the verdict stays unknown
        assert decided.verdict is Verdict.UNKNOWN and decided.method == "cpu-not-run"
        return
    assert decided.verdict is Verdict.REFUTED and decided.method == "cpu"
    assert "confirmed on CPU" in decided.reason
    assert [d.what for d in decided.counterexample.differences] == ["zmm0"]
    assert decided.counterexample.replayed is True
    assert "code moved by" in decided.counterexample.replay_note  # a kernel address, run in user space


def test_a_feature_mask_hiding_avx2_leaves_the_counterexample_unknown(monkeypatch):
    monkeypatch.setenv(FEATURE_MASK_ENV, "-avx2")
    insn, answer, result = _judged("uprobes@6.1", VPCMPEQB_YMM)
    decided = replay_unconfirmed(insn, answer, result)
    assert decided.verdict is Verdict.UNKNOWN and decided.method == "cpu-not-run"
    assert "AVX2" in decided.reason and f"{FEATURE_MASK_ENV}=-avx2" in decided.reason


def test_the_replay_can_fail_a_correct_relocation_of_the_same_counterexample_is_not_confirmed():
    """The mutant: the tracer's answer replaced by a copy of the instruction and a jump back (what a
    correct tracer runs).  On z3's very state and the judge's own states the CPU sees no difference,
    so the replay does not confirm; a relocation that drops the instruction (only the jump back) is
    confirmed."""
    if not _has_avx2():
        pytest.fail("this test needs a CPU with AVX2 (the judge runs vpcmpeqb on ymm)")
    insn, answer, result = _judged("uprobes@6.1", VPCMPEQB_YMM)
    state = result.counterexample.state()
    right = replay_on_cpu(VPCMPEQB_YMM, A, T, state, reloc=VPCMPEQB_YMM + jump(T + 4, A + 4))
    assert right.status == "same" and right.differences == ()
    dropped = replay_on_cpu(VPCMPEQB_YMM, A, T, state, reloc=jump(T, A + 4))
    assert dropped.status == "differs" and [d.what for d in dropped.differences] == ["zmm0"]


def test_a_counterexample_the_cpu_does_not_confirm_stays_unknown_and_says_so():
    """uprobes emulates pause (f3 90) as a jump to the next instruction: z3's difference does not show
    on unicorn, nor on the CPU (z3's state and eight of the judge's own)."""
    insn, answer, result = _judged("uprobes@6.1", PAUSE)
    assert result.verdict is Verdict.UNKNOWN and result.reason.startswith(UNCONFIRMED)
    decided = replay_unconfirmed(insn, answer, result)
    assert decided.verdict is Verdict.UNKNOWN and decided.method == "cpu-same"
    assert "the CPU saw no difference either" in decided.reason


@pytest.mark.parametrize("raw,row", [("fa", "privileged"), ("0f01cb", "privileged"), ("e4 60", "privileged"),
                                     ("0f05", "kernel entry"), ("48cb", "far transfer")])
def test_an_instruction_user_mode_cannot_run_needs_the_guest(raw, row):
    raw = bytes.fromhex(raw.replace(" ", ""))
    assert unsafe(decode(raw, A)).startswith(row)
    out = replay_on_cpu(raw, A, T, result_state(), effects=())
    assert out.status == "guest" and "needs the guest" in out.note


def result_state():
    from relocverify.concrete.outcome import MachineState

    return MachineState({"rax": 1}, {})


def test_the_audit_counts_what_the_cpu_decided(tmp_path):
    """A user program with vpcmpeqb on ymm, pause and vzeroupper, audited for uprobes: the VEX ones are
    tracer-wrong 'confirmed on CPU', pause stays unknown, and the summary says how many unknowns the CPU
    decided (unknown without the CPU = unknown + confirmed)."""
    if not _has_avx2():
        pytest.fail("this test needs a CPU with AVX2")
    source = tmp_path / "t.c"
    source.write_text('void f(void){ __asm__ volatile("vpcmpeqb (%rdi), %ymm0, %ymm0\\n\\tpause\\n\\tvzeroupper"); }\n'
                      "int main(void){ return 0; }\n")
    subprocess.run(["gcc", "-O1", "-o", str(tmp_path / "t"), str(source)], check=True)
    summary_file = tmp_path / "s.json"
    run = subprocess.run([".venv/bin/relocverify", "audit", "--tracer", "uprobes@6.1", str(tmp_path / "t"), "--db",
                          str(tmp_path / "t.sqlite"), "--no-progress", "--cache-dir", str(tmp_path / "cache"),
                          "--summary-json", str(summary_file)], capture_output=True, text=True)
    assert run.returncode == 1, run.stderr
    t = json.loads(summary_file.read_text())["tracers"]["uprobes@6.1"]
    assert t["cpu_replay"] == {"confirmed": 2, "no_difference": 1, "needs_guest": 0, "not_run": 0}
    wrong = {g["group"] for g in t["groups"]["tracer-wrong"]}
    assert "vpcmpeqb via check_jmp_cond: differs in zmm0 (confirmed on CPU)" in wrong
    assert any(g.startswith("vzeroupper via check_jmp_cond") and g.endswith("(confirmed on CPU)") for g in wrong)
    assert any("the CPU saw no difference" in g["group"] for g in t["groups"]["unknown"])
    assert "2 confirmed (unknown -> tracer-wrong; unknown without the CPU:" in run.stdout


def test_a_rip_relative_operand_moves_with_the_code():
    """vmovdqu 0x2000(%rip),%ymm0 at a kernel address: its operand moves with A into user space.  A
    relocation with the displacement fixed for T runs alike; the copy left unfixed reads from T's side
    (unmapped here: a fault), and is confirmed as a difference."""
    from relocverify.concrete.outcome import MachineState

    if not _has_avx2():
        pytest.fail("this test needs a CPU with AVX2")
    orig = bytes.fromhex("c5fe6f0500200000")
    operand = A + len(orig) + 0x2000
    state = MachineState({"rdi": 5}, {operand + i: (7 * i + 1) & 0xFF for i in range(32)})
    fixed = orig[:4] + (operand - (T + len(orig))).to_bytes(4, "little", signed=True) + jump(T + 8, A + 8)
    same = replay_on_cpu(orig, A, T, state, reloc=fixed)
    assert same.status == "same", same.note
    unfixed = replay_on_cpu(orig, A, T, state, reloc=orig + jump(T + 8, A + 8))
    assert unfixed.status == "differs" and unfixed.differences[0].what == "fault"


def test_a_relocation_using_its_own_slot_runs_alike_on_the_judges_own_states_too():
    """A correct relocation that saves %rax in the tracer's slot (2 pages past T) around the instruction:
    z3's state and the judge's own states all map the slot, so nothing differs (the slot unmapped in the
    judge's own states made the first store fault: a false confirmation)."""
    from relocverify.concrete.outcome import MachineState

    if not _has_avx2():
        pytest.fail("this test needs a CPU with AVX2")
    orig = bytes.fromhex("c5fe6f07")  # vmovdqu (%rdi),%ymm0
    slot = T + 0x2000

    def riprel(opcode: bytes, at: int) -> bytes:  # mov %rax,slot(%rip) / mov slot(%rip),%rax
        return opcode + (slot - (at + 7)).to_bytes(4, "little", signed=True)

    save = riprel(bytes.fromhex("488905"), T)
    body = save + orig + riprel(bytes.fromhex("488b05"), T + 7 + 4)
    reloc = body + jump(T + len(body), A + 4)
    out = replay_on_cpu(orig, A, T, MachineState({"rdi": 0x1000}, {}), reloc=reloc, tracer_memory=((slot, 8),))
    assert out.status == "same", out.note
