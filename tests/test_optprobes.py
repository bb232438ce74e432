"""optprobes (arch/x86/kernel/kprobes/opt.c): the model's decisions against opt.c compiled, its rows
against the source, its block relocations proved and its mutants refuted, and the audit over a small
kernel image with a ``.cold`` part jumping back into the bytes a probe's jmp overwrites."""

from __future__ import annotations

import json
import os
import sys

import pytest

from relocverify.cli.main import main
from relocverify.plan.plan import DEFAULT_TRAMP
from relocverify.proof.verdict import Verdict
from relocverify.tracers import get_model
from relocverify.tracers.judge import prove_answer
from relocverify.tracers.model import Context, Entry, Refuse, RelocateBlock, Unmodelled
from relocverify.x86.decode import decode

T = DEFAULT_TRAMP
START = 0xFFFFFFFF81100000


@pytest.fixture(autouse=True, scope="module")
def _sources(linux_sources):
    """The models decode with the kernel's own decoder and opt.c is compiled from the source packages."""


def _answer(model: str, code: str, off: int, extable=frozenset(), sites=None, entries=None, thunks=None,
            start: int = START):
    m = get_model(model)
    data = bytes.fromhex(code.replace(" ", ""))
    offsets, pos = [], 0
    while pos < len(data):
        d = decode(data[pos:pos + 15], start + pos)
        offsets.append(pos)
        pos += d.length
    walk = m.function_walk(data, start, offsets, frozenset(extable), thunks)
    return m.answer_in(walk, data, off, T, Context(True, (), "f"), frozenset(extable),
                       lambda o: (sites or {}).get(o, ()), entries)


# push %rbp; mov %rsp,%rbp; mov 0x100(%rip),%rax; add $1,%rax; pop %rbp; ret
PLAIN = "55 4889e5 488b0500010000 4883c001 5d c3"
# xor %eax,%eax; test %edi,%edi; je +3; add $1,%eax; add $2,%eax; ret
JUMP_IN = "31c0 85ff 7403 83c001 83c002 c3"
# mov %rdi,%rax; add $8,%rax; jmp *%rax
INDIRECT = "4889f8 4883c008 ffe0"


def test_a_run_of_boostable_instructions_is_copied_with_the_displacement_fixed_and_a_jmp_back():
    a = _answer("optprobes@6.1", PLAIN, 1)
    assert isinstance(a, RelocateBlock) and not a.entries
    b = a.block
    assert [i.raw.hex() for i in b.instructions] == ["4889e5", "488b0500010000"]  # 3 + 7 >= 5 bytes
    assert b.length == 10 and b.starts == (T, T + 3)
    # __copy_instruction at real = T+3: disp = A_1 + 0x100 - T_1 (both past their instruction's end)
    a1 = START + 4
    disp = (a1 + 0x100 - (T + 3)) & 0xFFFFFFFF
    assert b.trampoline[3:10] == bytes.fromhex("488b05") + disp.to_bytes(4, "little")
    back = (START + 11 - (T + 15)) & 0xFFFFFFFF
    assert b.trampoline[10:] == b"\xe9" + back.to_bytes(4, "little")  # synthesize_reljump to A+len
    assert prove_answer(b.instructions[0], a, T).verdict is Verdict.PROVED


@pytest.mark.parametrize("model,code,off,says", [
    # can_optimize: insn_jump_into_range finds the je at +4 aiming at +9 = A+3
    ("optprobes@6.1", JUMP_IN, 6, "the jump at +0x4 aims into [A+1, A+5]"),
    # copy_optimized_instructions: can_boost refuses jcc (0x70...0x7f) in the copied run
    ("optprobes@6.1", JUMP_IN, 0, "can_boost refuses opcode 74"),
    # can_optimize (6.1): insn_is_indirect_jump anywhere in the function refuses every probe in it
    ("optprobes@6.1", INDIRECT, 0, "insn_is_indirect_jump: jmp through a register or memory"),
    # can_optimize: size - offset < JMP32_INSN_SIZE
    ("optprobes@6.1", PLAIN, 15, "fewer than 5 bytes to the symbol's end"),
    # the probe must first be a kprobe: __copy_instruction refuses int3
    ("optprobes@6.1", "cc 90 90 90 90 90 c3", 0, "not a kprobe: -EINVAL: int3"),
])
def test_cited_refusals(model, code, off, says):
    a = _answer(model, code, off)
    assert isinstance(a, Refuse) and says in a.reason, a


def test_6_12_skips_the_indirect_jump_check_on_a_retpoline_and_ibt_kernel():
    a = _answer("optprobes@6.12", INDIRECT, 0)
    assert isinstance(a, RelocateBlock) and [i.raw.hex() for i in a.block.instructions] == ["4889f8", "4883c008"]


def test_an_exception_table_entry_anywhere_refuses_the_function_and_a_reserved_site_the_range():
    a = _answer("optprobes@6.1", PLAIN, 1, extable={15})
    assert isinstance(a, Refuse) and "search_exception_tables" in a.reason
    a = _answer("optprobes@6.1", PLAIN, 1, sites={4: ("static_call",)})
    assert isinstance(a, Refuse) and "static_call_text_reserved" in a.reason
    a = _answer("optprobes@6.1", PLAIN, 1, sites={4: ("fentry",)})
    assert isinstance(a, Refuse) and "ftrace_text_reserved" in a.reason


def test_a_jump_into_the_retpoline_thunk_range_is_an_indirect_jump_in_6_1_only():
    # jmp rel32 from +6 to the thunk range (as a tail call through __x86_indirect_thunk_rax)
    code = "4889f8 90 90 90 e9 00100000"
    thunk = START + 11 + 0x1000
    a = _answer("optprobes@6.1", code, 0, thunks=(thunk, thunk + 0x100))
    assert isinstance(a, Refuse) and "__indirect_thunk_start" in a.reason
    assert isinstance(_answer("optprobes@6.12", code, 0, thunks=(thunk, thunk + 0x100)), RelocateBlock)


def test_the_vex_opcode_77_counts_as_a_jcc_for_insn_jump_into_range():
    """vzeroupper (c5 f8 77): insn_jump_into_range reads opcode.bytes[0] = 0x77 as a jcc short with
    immediate 0, so its 'target' is the next instruction.  Here that is A+5: refused, as the kernel
    does (and can_boost refuses it as a jcc, 0x70...0x7f, when it is in the copied run)."""
    code = "90 90 c5f877 4889f8 90 c3"
    a = _answer("optprobes@6.1", code, 0)
    assert isinstance(a, Refuse) and "the jump at +0x2 aims into" in a.reason
    a = _answer("optprobes@6.1", "4889f8 c5f877 90 90 c3", 0)  # its 'target' A+6 is past the range
    assert isinstance(a, Refuse) and "can_boost refuses opcode 77" in a.reason


def test_mutants_of_the_block_are_refuted():
    from relocverify.tracers.optprobes import Optprobes

    a = _answer("optprobes@6.1", PLAIN, 1)
    insns = list(a.block.instructions)
    raw = [i.raw for i in insns]
    # __copy_instruction without the displacement fixup (the bug class of kinst's truncated displacement)
    unfixed = Optprobes.block(insns, raw, T)
    r = prove_answer(insns[0], RelocateBlock(unfixed, unfixed.trampoline, "", a.cite), T)
    assert r.verdict is Verdict.REFUTED, r.reason
    # the jmp back one byte short
    short = a.block.trampoline[:-4] + ((int.from_bytes(a.block.trampoline[-4:], "little") - 1) & 0xFFFFFFFF
                                       ).to_bytes(4, "little")
    from dataclasses import replace

    r = prove_answer(insns[0], RelocateBlock(replace(a.block, trampoline=short), short, "", a.cite), T)
    assert r.verdict is Verdict.REFUTED, r.reason


def test_an_entry_into_the_overwritten_bytes_is_refuted_with_what_the_cpu_finds_there():
    entry = Entry(START + 1 + 3, START + 0x5000, "branch", "f.cold")
    a = _answer("optprobes@6.1", PLAIN, 1, entries=lambda addr, n: [entry])
    assert isinstance(a, RelocateBlock) and a.entries == (entry,)
    r = prove_answer(a.block.instructions[0], a, T)
    assert r.verdict is Verdict.REFUTED and r.method == "patched-range entry"
    (d,) = r.counterexample.differences
    assert "f.cold" in d.original and "mov" in d.original and "3 byte(s) into the probe's jmp" in d.relocated


def test_a_lone_instruction_is_not_enough_to_answer():
    insn = decode(bytes.fromhex("4889e5"), START)
    assert isinstance(get_model("optprobes").answer(insn, T), Unmodelled)


@pytest.mark.parametrize("spec", ["6.1", "6.12"])
def test_can_optimize_s_tests_decide_as_opt_c_compiled(spec):
    """``__insn_is_indirect_jump`` and ``insn_jump_into_range``, cut out of opt.c and compiled with the
    kernel's decoder, against the model over every one- and two-byte opcode, ff's ModRM forms and VEX."""
    from relocverify.tracers.compiled import compare_optprobes

    items, a = [], 0xFFFFFFFF81000000
    for op in range(256):
        for tail in (b"\x05\x10\x20\x30\x40\x50\x60\x70", b"\xe0\xf0\x00\x00\x00\x00", b"\xfe" * 8,
                     b"\x00\x00\x00\x80"):
            for pre in (b"", b"\x0f", b"\x66", b"\xc4\xe1\x78", b"\xc5\xf8"):
                items.append((a, pre + bytes([op]) + tail))
                a += 0x40
        items.append((a, b"\xff" + bytes([op]) + b"\x00" * 6))
    result = compare_optprobes(spec, items)
    assert result["differ"] == 0, result["examples"]
    assert result["checked"] > 3000 and result["indirect"] > 50 and result["jumps"] > 100


OPT_ASM = """
    .text
    .globl f_hot
    .type f_hot, @function
f_hot:
    test %edi, %edi
    jne f_hot.cold
    mov %edi, %eax
    add $3, %eax
2:  imul %eax, %eax
    lea 1(%rax), %eax
    ret
    .size f_hot, .-f_hot
    .type f_hot.cold, @function
f_hot.cold:
    mov $7, %eax
    jmp 2b
    .size f_hot.cold, .-f_hot.cold
    .type f_ind, @function
f_ind:
    mov %rdi, %rax
    add $8, %rax
    jmp *%rax
    .size f_ind, .-f_ind
"""
OPT_LDS = """
SECTIONS {
  . = 0xffffffff81000000;
  .text : { *(.text) }
  /DISCARD/ : { *(.note.gnu.property) *(.comment) }
}
"""


def test_the_audit_finds_a_cold_part_jumping_into_the_overwritten_bytes(tmp_path):
    import elfbuild

    image = elfbuild.build_elf(tmp_path, OPT_ASM, OPT_LDS)
    out = tmp_path / "summary.json"
    args = ["audit", str(image), "--db", str(tmp_path / "s.sqlite"), "--summary-json", str(out), "--no-progress",
            "--jobs", "1", "--cache-dir", str(tmp_path / "cache"), "--tracer", "optprobes@6.1",
            "--tracer", "optprobes@6.12"]
    assert main(args, out=open(os.devnull, "w"), err=sys.stderr) == 1
    summary = json.loads(out.read_text())
    n = summary["instructions"]
    assert n == 12
    for name, t in summary["tracers"].items():
        assert t["instructions"] == n and sum(t["buckets"].values()) == n and t["totals_add_up"], name
    (wrong,) = summary["tracers"]["optprobes@6.1"]["groups"]["tracer-wrong"]
    assert "patched-range entry" in wrong["group"] and wrong["examples"][0]["function"] == "f_hot+0x6"  # imul at +0x9
    assert "f_hot.cold" in wrong["detail"]["counterexample"]["differences"][0]["original"]
    opt61, opt612 = (summary["tracers"][f"optprobes@{v}"]["buckets"] for v in ("6.1", "6.12"))
    assert opt612["agree"] > opt61["agree"]  # f_ind: 6.12 optimizes past the indirect jump
    # a warm audit remembers every function's outcomes: nothing is judged again
    main(args, out=open(os.devnull, "w"), err=sys.stderr)
    again = json.loads(out.read_text())
    assert again["counts"]["proofs_made"] == 0
    assert {k: t["buckets"] for k, t in again["tracers"].items()} == {k: t["buckets"] for k, t in
                                                                     summary["tracers"].items()}


# -- modules and packages (slow: a real Debian kernel and its modules) --------------------------------

@pytest.mark.slow
def test_modules_and_a_package_are_audited_image_by_image_and_added_up(tmp_path):
    from relocverify.image.fetch import extract_modules, fetch

    kernel = fetch("debian-6.1-cloud")
    (ko,) = extract_modules("debian-6.1-cloud", ["tcp_bbr.ko"])
    out = tmp_path / "m.json"
    base = ["--no-progress", "--tracer", "kprobes@6.1", "--tracer", "optprobes@6.1", "--summary-json", str(out)]
    code = main(["audit", str(kernel.vmlinux), "--module", str(ko), "--db", str(tmp_path / "m.sqlite")] + base,
                out=open(os.devnull, "w"), err=sys.stderr)
    doc = json.loads(out.read_text())
    assert code in (0, 1) and list(doc["images"]) == [str(ko)]
    n = doc["instructions"]
    assert n > 500
    for name, t in doc["tracers"].items():
        assert t["instructions"] == n and sum(t["buckets"].values()) == n and t["totals_add_up"], name
    code = main(["audit", "--package", "debian-6.1-cloud", "--limit-modules", "2", "--limit", "40",
                 "--db", str(tmp_path / "p.sqlite")] + base, out=open(os.devnull, "w"), err=sys.stderr)
    doc = json.loads(out.read_text())
    assert code in (0, 1) and list(doc["images"])[0] == "vmlinux" and len(doc["images"]) == 3
    n = doc["instructions"]
    assert n == sum(i["instructions"] for i in doc["images"].values())
    for name, t in doc["tracers"].items():
        assert t["instructions"] == n and t["totals_add_up"], name
        assert t["buckets"] == {b: sum(i["tracers"][name][b] for i in doc["images"].values()) for b in t["buckets"]}
