"""The machine model (``proof.machine_model``): relocations that compute what the original computes but differ
in the machine they run in are never proved, and their equivalent neighbours still are.

Each class is tested with members generated over registers, displacements and addresses (Hypothesis), not
with one example: interrupt frames below RSP at CPL 0 (``smt.stack_exposure``), the segment a fault is raised
through, read-modify-write split into a load and a store, shadow stacks, IBT, alignment checking at CPL 3, and
instructions whose effect lands on the next instruction."""

from __future__ import annotations

import importlib
from pathlib import Path
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relocverify.plan.plan import make_plan
from relocverify.proof.machine_model import MACHINE_MODEL, Context, Treatment, check_machine, one_step
from relocverify.proof.prove import prove_relocation
from relocverify.proof.verdict import Verdict
from relocverify.x86.decode import decode

A = 0xFFFFFFFF81234560
T = 0xFFFFFFFFC0001000
USER_A = 0x401000
USER_T = 0x7F0000001000
SETTINGS = settings(max_examples=12, deadline=None)
#: General-purpose registers by number, without rsp (4) and r11 (11, the relocations' scratch).
REGS = st.sampled_from([0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 12, 13, 14, 15])


def jmp_back(at: int, here: int, to: int) -> bytes:
    return b"\xe9" + struct.pack("<i", to - (here + 5))


def rex(w: int, reg: int = 0, base: int = 0) -> bytes:
    return bytes([0x40 | (w << 3) | ((reg >> 3) << 2) | (base >> 3)])


def mov_load_rsp(reg: int, disp: int) -> bytes:
    """mov disp8(%rsp), %reg"""
    return rex(1, reg) + bytes([0x8B, 0x44 | ((reg & 7) << 3), 0x24, disp & 0xFF])


def mov_store_rsp(reg: int, disp: int) -> bytes:
    """mov %reg, disp8(%rsp)"""
    return rex(1, reg) + bytes([0x89, 0x44 | ((reg & 7) << 3), 0x24, disp & 0xFF])


def lea_rsp(disp: int) -> bytes:
    """lea disp8(%rsp), %rsp (writes no flag)"""
    return bytes([0x48, 0x8D, 0x64, 0x24, disp & 0xFF])


def pop(reg: int) -> bytes:
    return (b"\x41" if reg >= 8 else b"") + bytes([0x58 + (reg & 7)])


def push(reg: int) -> bytes:
    return (b"\x41" if reg >= 8 else b"") + bytes([0x50 + (reg & 7)])


def with_jump_back(orig: bytes, body: bytes, at: int = A, tramp: int = T) -> bytes:
    return body + jmp_back(at, tramp + len(body), at + len(orig))


def verdict(orig: bytes, reloc: bytes, at: int = A, tramp: int = T):
    return prove_relocation(decode(orig, at), reloc, tramp)


def assert_not_proved_by_machine(result) -> None:
    assert result.verdict is not Verdict.PROVED, result.render()
    assert result.method == "machine-model", result.render()


# ---------------------------------------------------------------------------
# The table itself
# ---------------------------------------------------------------------------


def test_every_row_has_a_reason_a_source_and_a_real_mechanism():
    keys = [r.key for r in MACHINE_MODEL]
    assert len(keys) == len(set(keys))
    for row in MACHINE_MODEL:
        assert row.reason and row.source and row.what and row.contexts, row
        assert isinstance(row.treatment, Treatment)
        for name in row.mechanism.split(";")[0].split(" (")[0].split(", "):
            module, _, attr = name.strip().partition(".")
            if module in ("smt", "machine_model", "atomicity") and attr:
                assert hasattr(importlib.import_module(f"relocverify.proof.{module}"), attr), (row.key, name)


def test_the_dimensions_of_the_issue_are_rows():
    keys = {r.key for r in MACHINE_MODEL}
    assert {"fault-segment", "fault-error-code", "single-step-set", "interrupt-shadow", "interrupt-frame",
            "signal-frame", "alignment-check", "ibt-kernel", "shadow-stack", "single-step-entry",
            "data-breakpoints"} <= keys


def test_context_is_the_address_half():
    assert Context.of(A) is Context.KERNEL and Context.of(USER_A) is Context.USER


# ---------------------------------------------------------------------------
# Interrupt frames below RSP at CPL 0
# ---------------------------------------------------------------------------


@SETTINGS
@given(REGS)
def test_a_pop_that_reads_below_rsp_after_moving_it_is_refuted(reg):
    orig = pop(reg)
    bad = with_jump_back(orig, lea_rsp(8) + mov_load_rsp(reg, -8))
    good = with_jump_back(orig, mov_load_rsp(reg, 0) + lea_rsp(8))
    r = verdict(orig, bad)
    assert r.verdict is Verdict.REFUTED and r.method == "machine-model", r.render()
    assert verdict(orig, good).verdict is Verdict.PROVED


@SETTINGS
@given(REGS)
def test_a_push_that_stores_before_moving_rsp_is_refuted(reg):
    orig = push(reg)
    bad = with_jump_back(orig, mov_store_rsp(reg, -8) + lea_rsp(-8))
    good = with_jump_back(orig, lea_rsp(-8) + mov_store_rsp(reg, 0))
    r = verdict(orig, bad)
    assert r.verdict is Verdict.REFUTED and r.method == "machine-model", r.render()
    assert verdict(orig, good).verdict is Verdict.PROVED


@SETTINGS
@given(st.sampled_from([16, 24, 32, 64, 120]), REGS)
def test_moving_rsp_up_and_back_exposes_live_stack(lift, reg):
    """``mov disp(%rsp), reg`` relocated as rsp moved up, the load, rsp moved back: the bytes between are
    live for the original and exposed at the boundaries."""
    orig = mov_load_rsp(reg, 8)
    bad = with_jump_back(orig, lea_rsp(lift) + mov_load_rsp(reg, 8 - lift) + lea_rsp(-lift))
    assert_not_proved_by_machine(verdict(orig, bad))


def test_the_red_zone_keeps_data_below_rsp_in_user_space():
    """At CPL 3 a signal frame starts 128 bytes below RSP: the pop read 8 bytes below is safe there."""
    orig = pop(3)
    body = lea_rsp(8) + mov_load_rsp(3, -8)
    near = USER_A + 0x100000
    reloc = with_jump_back(orig, body, USER_A, near)
    assert verdict(orig, reloc, USER_A, near).verdict is Verdict.PROVED
    assert verdict(orig, with_jump_back(orig, body)).verdict is Verdict.REFUTED


def test_leave_split_in_two_is_equivalent_under_interrupts():
    orig = b"\xc9"  # leave
    reloc = with_jump_back(orig, b"\x48\x89\xec" + b"\x5d")  # mov %rbp,%rsp; pop %rbp
    assert verdict(orig, reloc).verdict is Verdict.PROVED


# ---------------------------------------------------------------------------
# Which fault: segment and error code
# ---------------------------------------------------------------------------


@SETTINGS
@given(REGS, st.integers(-128, 127))
def test_an_rsp_based_access_moved_to_another_base_raises_another_fault(reg, disp):
    orig = mov_load_rsp(reg, disp)
    mov_rsp_r11 = b"\x49\x89\xe3"  # mov %rsp, %r11
    load_r11 = rex(1, reg, 11) + bytes([0x8B, 0x43 | ((reg & 7) << 3), disp & 0xFF])
    reloc = with_jump_back(orig, mov_rsp_r11 + load_r11)
    assert verdict(orig, reloc).verdict is Verdict.REFUTED  # r11 differs too: the semantics says so first
    check = check_machine(orig, A, reloc, (), T)
    assert check.refutes and "#SS" in check.original and "#GP" in check.relocated, check


ALU = {"add": 0x01, "or": 0x09, "and": 0x21, "sub": 0x29, "xor": 0x31}


@SETTINGS
@given(st.sampled_from(sorted(ALU)), st.sampled_from([0, 1, 2, 6, 7]), st.integers(0, 120))
def test_a_read_modify_write_split_into_load_and_store_changes_the_error_code(op, reg, disp):
    """``op %reg, disp(%rbx)`` as r11 saved, load, op, store, r11 restored: the same registers, flags,
    memory and memory events, but a not-present page faults as a read instead of a write."""
    code = ALU[op]
    orig = bytes([0x48, code, 0x43 | (reg << 3), disp])
    load = bytes([0x4C, 0x8B, 0x5B, disp])  # mov disp(%rbx), %r11
    alu = bytes([0x49, code, 0xC3 | (reg << 3)])  # op %reg, %r11
    store = bytes([0x4C, 0x89, 0x5B, disp])  # mov %r11, disp(%rbx)
    save_len, restore_len = 7, 7
    body_len = save_len + len(load) + len(alu) + len(store) + restore_len + 5
    slot = (T + body_len + 7) & ~7
    save = b"\x4c\x89\x1d" + struct.pack("<i", slot - (T + 7))
    head = save + load + alu + store
    restore = b"\x4c\x8b\x1d" + struct.pack("<i", slot - (T + len(head) + 7))
    body = head + restore
    reloc = with_jump_back(orig, body)
    reloc += b"\xcc" * (slot - T - len(reloc)) + b"\0" * 8
    r = prove_relocation(decode(orig, A), reloc, T)
    assert r.verdict is Verdict.REFUTED and r.method == "machine-model", r.render()
    assert "error code" in r.counterexample.differences[0].what


# ---------------------------------------------------------------------------
# Shadow stacks and IBT
# ---------------------------------------------------------------------------


@SETTINGS
@given(st.integers(-0x10000, 0x10000))
def test_a_call_as_push_and_jump_is_refuted_by_the_shadow_stack(rel):
    orig = b"\xe8" + struct.pack("<i", rel)
    target = A + 5 + rel
    push_ret = b"\x68" + struct.pack("<i", (A + 5) - (1 << 64))
    reloc = push_ret + b"\xe9" + struct.pack("<i", target - (T + 10))
    r = verdict(orig, reloc)
    assert r.verdict is Verdict.REFUTED and r.counterexample.differences[0].what == "shadow stack", r.render()


def test_a_ret_as_stack_moved_and_indirect_jump_is_refuted():
    r = verdict(b"\xc3", lea_rsp(8) + b"\xff\x64\x24\xf8")
    assert r.verdict is Verdict.REFUTED and r.method == "machine-model"


@SETTINGS
@given(st.sampled_from([b"\x48\x8b\x03", b"\x48\x89\x03", b"\x48\x01\xd8", b"\x90"]), st.integers(0, 7))
def test_an_indirect_jump_back_is_not_proved_at_cpl0_and_assumes_no_user_ibt(orig, pad):
    body = orig + b"\x90" * pad
    qword_at = USER_T + len(body) + 6
    fill = -qword_at % 8  # align the qword: alignment checking is its own row
    body += b"\x90" * fill
    kernel = body + b"\xff\x25\0\0\0\0" + struct.pack("<Q", A + len(orig))
    r = verdict(orig, kernel)
    assert r.verdict is Verdict.UNKNOWN and "IBT" in r.reason, r.render()
    user = body + b"\xff\x25\0\0\0\0" + struct.pack("<Q", USER_A + len(orig))
    u = verdict(orig, user, USER_A, USER_T)
    assert u.verdict is Verdict.PROVED, u.render()
    assert any("IBT" in a for a in u.assumes)


# ---------------------------------------------------------------------------
# Alignment checking at CPL 3
# ---------------------------------------------------------------------------


@SETTINGS
@given(st.integers(0, 15), st.integers(0, 7))
def test_an_absolute_jump_whose_qword_is_misaligned_raises_ac_in_user_space(tramp_low, pad):
    orig = b"\x48\x8b\x03"
    tramp = USER_T + tramp_low
    body = orig + b"\x90" * pad
    reloc = body + b"\xff\x25\0\0\0\0" + struct.pack("<Q", USER_A + 3)
    r = verdict(orig, reloc, USER_A, tramp)
    if (tramp + len(body) + 6) % 8:
        assert r.verdict is Verdict.REFUTED and "#AC" in r.counterexample.differences[0].relocated, r.render()
    else:
        assert r.verdict is Verdict.PROVED, r.render()


@SETTINGS
@given(st.sampled_from(["48 8b 03", "48 8b 05 10 00 00 00", "74 05", "e2 05", "c7 05 10 00 00 00 01 00 00 00",
                        "48 8d 05 00 10 00 00", "ff 15 10 00 00 00"]), st.integers(0, 63))
def test_our_plans_align_every_tracer_access_in_user_space(hexes, tramp_low):
    """The planner's absolute jumps and save slots at any trampoline alignment."""
    insn = decode(bytes.fromhex(hexes), USER_A)
    plan = make_plan(insn, USER_T + tramp_low)
    if plan.trampoline:
        check = check_machine(insn.raw, insn.address, plan.trampoline, (), plan.tramp, plan.tracer_memory)
        assert check.problem is None or "IBT" in check.problem, check


# ---------------------------------------------------------------------------
# Effects on the next instruction
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("orig", [b"\x9d", b"\x66\x9d", b"\xfb", b"\x8e\xd0", b"\x48\xcf"])
def test_an_original_whose_effect_lands_on_the_next_instruction_cannot_be_copied(orig):
    r = verdict(orig, with_jump_back(orig, orig))
    assert r.verdict is Verdict.REFUTED and r.method == "machine-model", r.render()


@pytest.mark.parametrize("added", [b"\x9c\x9d", b"\xfb", b"\x8c\xd0\x8e\xd0"])
def test_a_relocation_with_an_effect_on_its_next_instruction_is_not_proved(added):
    orig = b"\x48\x8b\x03"
    reloc = with_jump_back(orig, orig + added)
    assert verdict(orig, reloc).verdict is not Verdict.PROVED
    check = check_machine(orig, A, reloc, (), T)
    assert check.problem is not None and "next instruction" in check.problem


def test_a_proof_prints_what_it_assumes():
    orig = pop(3)
    r = verdict(orig, with_jump_back(orig, mov_load_rsp(3, 0) + lea_rsp(8)))
    assert r.verdict is Verdict.PROVED
    assert any("TF" in a for a in r.assumes) and "assumes:" in r.render()
    assert r.as_json()["assumes"] == list(r.assumes)


def test_the_fast_path_is_for_one_step_relocations_only():
    assert one_step(with_jump_back(b"\x5b", b"\x5b"), T)
    assert one_step(b"\x5b\x90\x90" + jmp_back(A, T + 3, A + 1), T)
    assert not one_step(with_jump_back(b"\x5b", lea_rsp(8) + mov_load_rsp(3, -8)), T)


@SETTINGS
@given(REGS, st.integers(1, 3))
def test_a_push_after_other_instructions_is_still_equivalent(reg, nops):
    """The bytes a push makes live are exposed before it, but written by it: nothing is lost.  (An earlier
    version of the check refuted this: a false refutation.)"""
    orig = push(reg)
    reloc = with_jump_back(orig, b"\x48\x89\xc0" * nops + orig)  # mov %rax,%rax: no flag, no memory
    r = verdict(orig, reloc)
    assert r.verdict is Verdict.PROVED, r.render()


@SETTINGS
@given(st.integers(0, 15))
def test_a_kernel_relocation_may_not_use_a_vector_register_as_scratch(xmm):
    """At CPL 0 a vector register outside kernel_fpu_begin holds a task's user state; an interrupt that
    uses the FPU saves it as that state (row kernel-vector-state)."""
    orig = b"\x48\x8b\x03"  # mov (%rbx), %rax
    r = rex(1, xmm)[0]
    load = bytes([0x66, r, 0x0F, 0x6E, 0x03 | ((xmm & 7) << 3)])  # movq (%rbx), %xmmN via 66 REX.W 0f 6e
    to_rax = bytes([0x66, r, 0x0F, 0x7E, 0xC0 | ((xmm & 7) << 3)])  # movq %xmmN, %rax
    reloc = with_jump_back(orig, load + to_rax)
    assert verdict(orig, reloc).verdict is not Verdict.PROVED
    check = check_machine(orig, A, reloc, (), T)
    assert check.problem is not None and "zmm" in check.problem and not check.refutes
    assert check_machine(orig, USER_A, with_jump_back(orig, load + to_rax, USER_A, USER_A + 0x100000), (),
                         USER_A + 0x100000).problem is None  # at CPL 3 the registers are the process's own


def test_docs_machine_lists_every_row():
    text = (Path(__file__).resolve().parent.parent / "docs" / "machine.md").read_text()
    missing = [r.key for r in MACHINE_MODEL if f"| `{r.key}` |" not in text]
    assert not missing, f"docs/machine.md lacks the rows {missing}"


@SETTINGS
@given(REGS, st.sampled_from([8, 16, 64]))
def test_a_value_kept_below_rsp_across_a_boundary_is_lost(reg, depth):
    """``mov %reg, -d(%rsp)`` then ``mov -d(%rsp), %reg``: an interrupt between the two overwrites it."""
    orig = b"\x48\x89\xc0"  # mov %rax, %rax
    reloc = with_jump_back(orig, mov_store_rsp(reg, -depth) + mov_load_rsp(reg, -depth))
    r = verdict(orig, reloc)
    assert r.verdict is not Verdict.PROVED, r.render()


@pytest.mark.parametrize("prefix", ["", "3e", "36", "26", "2e", "64", "65"])
@pytest.mark.parametrize("base", [4, 5, 3, 0, 12, 13])
def test_a_segment_override_decides_the_fault_only_for_fs_and_gs(prefix, base):
    """In 64-bit mode cs:, ds:, es: and ss: overrides are ignored: rsp and rbp bases raise #SS, others #GP
    (this CPU: ds:8(%rsp) raises SIGBUS, ss:8(%rbx) SIGSEGV; selftest found four false proofs when the
    override was taken at its word)."""
    from relocverify.proof.machine_model import machine_classes

    modrm = 0x40 | (0 << 3) | (base & 7)  # mov disp8(base), %rax
    raw = bytes.fromhex(prefix) + bytes([0x48 | (base >> 3)]) + bytes([0x8B, modrm]) \
        + (b"\x24" if base & 7 == 4 else b"") + b"\x08"
    (access,) = machine_classes(raw, A).accesses
    expect = "ss" if base in (4, 5) and prefix not in ("64", "65") else "flat"
    assert access.segment == expect, (raw.hex(), access)


@pytest.mark.parametrize("orig,at,reloc,tramp,memory", [
    ("80882909000020", 0x30000100, "48892df9ffff004889c53e808d2909000020488b2de7ffff00e9e90000ff", 0x31000000,
     (0x32000000, 0x100)),
    ("3e480fba2810", 0x30000100, "48892df9ffff004889c53e480fba6d0010488b2de8ffff00e9e90000ff", 0x31000000,
     (0x32000000, 0x100)),
    ("3e0fc14308", 0x30000100, "48892df9ffff004889dd3e0fc14508488b2deaffff00e9ea0000ff", 0x31000000,
     (0x32000000, 0x100)),
    ("3e41ff0481", 0xFFFFFFFF81000100, "48892df9ffff004c89cd3eff448500488b2deaffff00e9ea0000ff", 0xFFFFFFFF82000000,
     (0xFFFFFFFF83000000, 0x100)),
])
def test_selftest_s_false_proofs_of_a_ds_access_rebased_on_rbp(orig, at, reloc, tramp, memory):
    """``relocverify selftest --pairs 2000 --seed 20261127`` (fault-segment): a ds: access moved onto
    ``ds:(%rbp)`` raises #SS where the original raises #GP; the CPU judge saw SIGBUS against SIGSEGV."""
    r = prove_relocation(decode(bytes.fromhex(orig), at), bytes.fromhex(reloc), tramp, tracer_memory=(memory,))
    assert r.verdict is Verdict.REFUTED and r.method == "machine-model", r.render()


def test_a_tracer_slot_written_before_a_boundary_is_no_stack():
    """The relocation saves a scratch register to its slot, then the original (which moves rsp) runs: the
    slot is no stack that an interrupt could lose (selftest saw this refuted)."""
    r = prove_relocation(decode(bytes.fromhex("1b20"), 0x30000100),
                         bytes.fromhex("4c891df9ffff004989c3411b234c8b1decffff00e9e90000ff"), 0x31000000,
                         tracer_memory=((0x32000000, 0x100),))
    assert r.method != "machine-model", r.render()


@SETTINGS
@given(st.integers(0, 2**47), st.integers(-2**31, 2**31 - 1), st.sampled_from([
    "488b05{}", "48c705{}01000000", "ff35{}", "0fb605{}",  # RIP-relative: the address is where the bytes are
    "48a1{}{}", "65488b0425{}"]),  # movabs from an absolute address; %gs: with no base or index
       st.lists(st.booleans(), min_size=2, max_size=6))
def test_machine_classes_see_where_the_bytes_are_when_an_address_is_absolute(at, disp, pattern, inside):
    """``machine_classes`` remembers its answers by the bytes alone only for bytes that access no absolute
    address: an operand at one (RIP-relative or not) is tracer memory at one place and not at another.
    Each query puts the operand's address in the tracer ranges or just outside them, in turn, with the
    same bytes: an answer remembered from the other case would be caught."""
    from relocverify.proof.machine_model import machine_classes
    from relocverify.x86.registers import MASK64

    d32 = struct.pack("<i", disp).hex()
    raw = bytes.fromhex(pattern.format(d32, d32) if pattern.startswith("48a1") else pattern.format(d32))
    for k, hit in enumerate(inside):
        a = (at + k * 0x1000) & MASK64
        ins = decode(raw, a)
        m = ins.memory
        target = ins.rip_target if ins.rip_relative else (int.from_bytes(raw[2:10], "little") if raw[:2] == b"\x48\xa1"
                                                           else m.displacement & MASK64)
        ranges = ((target, 8),) if hit else (((target + 64) & MASK64, 8),)
        c = machine_classes(raw, a, ranges)
        assert bool(c.tracer_accesses) == hit, (raw.hex(), hex(a), hex(target), c)
        stack = 1 if raw[:1] == b"\xff" else 0  # push also writes the stack
        assert len(c.accesses) == stack + (not hit), (raw.hex(), hex(a), c)


@SETTINGS
@given(st.integers(0, 2**47), st.integers(0, 2**47), st.sampled_from(["488b4310", "4c8b642408", "f0480fb1570c",
                                                                      "c3", "ff5510", "e8{}", "0f1f440000"]))
def test_machine_classes_of_bytes_with_no_absolute_address_are_the_same_anywhere(a, b, pattern):
    """Bytes with no absolute memory operand have one answer wherever they are (what lets ``machine_classes``
    remember it by the bytes), with or without tracer ranges."""
    from relocverify.proof.machine_model import machine_classes

    raw = bytes.fromhex(pattern.format("10203040"))
    assert machine_classes(raw, a) == machine_classes(raw, b, ((b, 64),)) == machine_classes(raw, a, ((b, 16),))


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from([
    "e9{}", "e8{}", "eb{b}", "74{b}", "0f85{}", "2ee9{}", "3eff25{}", "ff15{}", "488b05{}", "48a1{}{}",
    "65488b0425{}", "488b4310", "c3", "50", "f0480fb1570c", "0f1f440000"]),
    st.integers(-2**31, 2**31 - 1), st.integers(0, 2**64 - 1), st.booleans()), min_size=1, max_size=12))
def test_machine_classes_remembered_are_the_classes_made_afresh(queries):
    """Whatever ``machine_classes`` remembers (by bytes, by a direct branch's opcode, by bytes, address and
    ranges), each answer is the one ``classes_of`` makes afresh: the same bytes at other addresses and with
    other ranges, and branches with other offsets, asked in any order."""
    from relocverify.proof.machine_model import classes_of, machine_classes

    for pattern, disp, at, near in queries:
        d32 = struct.pack("<i", disp).hex()
        raw = bytes.fromhex(pattern.replace("{b}", d32[:2]).format(d32, d32))
        ranges = (((at + disp) % 2**64, 64),) if near else ()
        assert machine_classes(raw, at, ranges) == classes_of(raw, at, ranges), (raw.hex(), hex(at), ranges)
