"""One test per class of false proof: a member of the class is never ``proved``, by the mechanism named.

Each test breaks if its mechanism is removed (the comment says which).  The
members here are our own constructions; ``selftest`` generates many more, and
``corpora/adversary.toml`` keeps one per class with its concrete reason."""

from __future__ import annotations

import platform
import struct

import pytest

from relocverify.errors import InputError
from relocverify.proof import form_table
from relocverify.proof.prove import prove_relocation
from relocverify.proof.verdict import Verdict
from relocverify.x86.decode import decode

A = 0xFFFFFFFF81234560
T = 0xFFFFFFFFC0001000


def back(code: bytes, orig_len: int, tramp: int = T, at: int = A) -> bytes:
    return code + b"\xe9" + struct.pack("<i", at + orig_len - (tramp + len(code) + 5))


def prove(orig: str, reloc: bytes, tracer=()):
    raw = bytes.fromhex(orig)
    return prove_relocation(decode(raw, A), reloc, T, tracer_memory=tuple(tracer))


def not_proved(result, *words):
    assert result.verdict is not Verdict.PROVED, result.reason
    for w in words:
        assert w in result.reason, result.reason


def test_the_table_is_there_and_made_on_a_cpu():
    table = form_table.load()
    assert len(table.rows) > 1000 and table.cpu != "none"


# class 1 -- mechanism: only CPU-validated forms (admission 4), on the relocated side too
def test_rex_before_a_legacy_prefix_on_the_relocated_side():
    not_proved(prove("4801c0", back(bytes.fromhex("486601c0"), 3)), "CPU")


def test_the_control_for_class_1_is_proved():
    assert prove("4801c0", back(bytes.fromhex("4801c0"), 3)).verdict is Verdict.PROVED


# class 2, 3 -- mechanism: the obligation is symmetric (a loose form on the relocated side is trusted only
# as a re-execution of the original)
def test_a_move_replaced_by_multiplication_by_one():
    reloc = back(bytes.fromhex("660f28c1" "660f59053a000000"), 4)  # movapd; mulpd [rip+..]
    not_proved(prove("660f28c1", reloc + bytes(0x40 - len(reloc) + 8) + struct.pack("<dd", 1.0, 1.0)))


def test_max_of_x_and_x_inserted_changes_mxcsr_status():
    r = prove("4801d8", back(bytes.fromhex("f20f5fc0" "4801d8"), 3))
    not_proved(r)
    assert "re-execut" in r.reason or "CPU-validated" in r.reason, r.reason


# class 4 -- mechanism: hazards outside the IR (fence kinds, non-temporal stores) compared
@pytest.mark.parametrize("orig,reloc", [("0faef0", "0faee8"), ("0faee8", "0faef8"), ("0faef0", "90")])
def test_fences_swapped_or_dropped_are_refuted(orig, reloc):
    r = prove(orig, back(bytes.fromhex(reloc), 3))
    assert r.verdict is Verdict.REFUTED and r.method in ("memory-model", "smt"), r.reason


def test_a_store_made_non_temporal_is_refuted():
    r = prove("488903", back(bytes.fromhex("480fc303"), 3))
    assert r.verdict is Verdict.REFUTED and r.method == "memory-model", r.reason


# class 5 -- mechanism: symmetric loose rule (imul's undefined flags on the relocated side)
def test_undefined_flags_on_the_relocated_side():
    not_proved(prove("4883c000", back(bytes.fromhex("486bc001"), 4)))


# class 7 -- mechanism: x87 forms are not in the table (state VEX lacks)
@pytest.mark.parametrize("orig,reloc", [("dbe2", "90"), ("90", "dbe2"), ("dfe0", "31c0")])
def test_x87_state(orig, reloc):
    not_proved(prove(orig, back(bytes.fromhex(reloc), len(bytes.fromhex(orig)))))


# class 9 -- mechanism: faults are part of behaviour (alignment in the semantics, length by the walk)
def test_an_unaligned_access_made_aligned():
    not_proved(prove("f30f6f00", back(bytes.fromhex("660f6f00"), 4)))  # movdqu -> movdqa


def test_a_legacy_sse_access_made_vex():
    not_proved(prove("660ffe00", back(bytes.fromhex("c5f9fe00"), 4)))  # paddd (#GP if misaligned) -> vpaddd


def test_an_instruction_past_15_bytes():
    not_proved(prove("4801d8", back(bytes.fromhex("2e" * 13 + "4801d8"), 3)), "decode")


def test_a_division_that_can_fault_is_not_dead():
    # div's flags are undefined: not a move, not the original: not proved whatever its result
    not_proved(prove("90", back(bytes.fromhex("50" "52" "48f7f1" "5a" "58"), 1)))


# class 10 -- mechanism: vendor readings compared (iced's AMD decoder)
def test_an_operand_size_prefix_on_the_jump_back():
    reloc = back(bytes.fromhex("4801d8"), 3)
    not_proved(prove("4801d8", reloc[:3] + b"\x66" + reloc[3:]), "vendor")


# class 11 -- mechanism: a store into the relocation's own bytes is a difference
def test_a_relocation_that_patches_itself():
    store = bytes.fromhex("c605") + struct.pack("<i", 1) + b"\x90"  # mov byte [rip+1], 0x90: the next byte
    r = prove("4801d8", back(store + bytes.fromhex("4801d8"), 3), tracer=[(T, 32)])
    assert r.verdict is not Verdict.PROVED, r.reason


# class 12 -- mechanism: control flow followed, not swept (atomicity sees the unlocked inc the CPU runs)
def test_a_jump_over_a_lock_prefix():
    r = prove("f0ff00", back(bytes.fromhex("eb01f0ff00"), 3))
    assert r.verdict is Verdict.REFUTED and r.method == "atomicity", r.reason


# class 13 -- mechanism: memory events keep their widths
def test_a_store_split_in_two():
    reloc = back(bytes.fromhex("8903" "48c1c020" "894304" "48c1c020"), 3)  # mov [rbx],eax; rol; mov [rbx+4],eax; rol
    not_proved(prove("488903", reloc))


# class 14 -- mechanism: a form VEX models by a constant is loose (or failed): only re-execution proves it
@pytest.mark.parametrize("orig,reloc", [("0f01d0", "b807000000ba00000000"), ("c7f800000000", "b808000000")])
def test_constant_models(orig, reloc):
    not_proved(prove(orig, back(bytes.fromhex(reloc), len(bytes.fromhex(orig)))))


# class 15 -- mechanism: the vacuity check refuses the precondition before any proof
@pytest.mark.parametrize("ranges", [[(0, 1 << 47), ((1 << 64) - (1 << 47), 1 << 47)],
                                    [(0x1000, 0x100000), (0x200000, 0x100000), (0x400000, 0x1000000)]])
def test_tracer_memory_covering_everything_is_an_input_error(ranges):
    with pytest.raises(InputError):
        prove("488b03", back(b"\x90", 3), tracer=ranges)


def test_tracer_memory_naming_the_one_address_the_original_reads():
    with pytest.raises(InputError):  # mov rax,[rip+0x10]: reads A+7+0x10
        prove("488b0510000000", back(b"\x90", 7), tracer=[(A + 7 + 0x10, 8)])


def test_a_locked_access_through_a_scratch_copy_of_its_base_is_not_refuted_for_atomicity():
    """``xchg %eax,0x18(%rbx)`` relocated as ``mov %rbx,%r11; xchg %eax,0x18(%r11)`` (the selftest's
    same-segment control): the one locked operation is still one locked operation on the same address,
    which the sequential obligation checks; the atomicity check refuted it for its other base register
    (4 of 3,587 controls in the 20,000-pair selftest).  A LOCK dropped or added is still refuted."""
    from relocverify.proof.prove import prove_relocation
    from relocverify.x86.decode import decode

    at, tramp, slot = 0xFFFFFFFF81000100, 0xFFFFFFFF82000000, ((0xFFFFFFFF82000000, 256),)
    orig = bytes.fromhex("874318")
    via_r11 = bytes.fromhex("4c891df9ffff004989db418743184c8b1debffff00e9e90000ff")
    result = prove_relocation(decode(orig, at), via_r11, tramp, timeout_ms=10_000, tracer_memory=slot)
    assert result.method != "atomicity", result.reason
    unlocked = via_r11.replace(bytes.fromhex("41874318"), bytes.fromhex("41894318"))  # mov: the lock gone
    result = prove_relocation(decode(orig, at), unlocked, tramp, timeout_ms=10_000, tracer_memory=slot)
    assert result.verdict.value == "refuted" and result.method == "atomicity"
