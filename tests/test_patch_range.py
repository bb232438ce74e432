"""Patched ranges (relocverify.kernel.patch_range): what else in the image reaches into [A, A+L)."""

from __future__ import annotations

import pytest

import elfbuild
from conftest import TEST_KERNELS
from relocverify.image.functions import find_functions, iter_instruction_spans
from relocverify.image.loader import load_image
from relocverify.kernel.patch_range import PatchRanges, RangeRefusal, jump_table_fact
from relocverify.kernel.sites import find_sites
from relocverify.plan.block import BlockPlan, plan_block
from relocverify.proof.block import prove_block
from relocverify.proof.verdict import Verdict
from relocverify.x86.decode import decode

# Every probed function starts with the same 5-byte range: push %rbp (1), mov %rsp,%rbp (3), push %rbx (1).
ASM = r"""
    .macro prologue
    push %rbp
    mov %rsp, %rbp
    push %rbx
    .endm
    .macro function name
    .globl \name
    .type \name, @function
\name:
    .endm

    .section .text, "ax"
    function f_target
    push %rbp
    mov %rsp, %rbp
inner:
    push %rbx
    pop %rbx
    pop %rbp
    ret
    .size f_target, .-f_target

    function f_plain
    prologue
    pop %rbx
    pop %rbp
    ret
    .size f_plain, .-f_plain

    function f_caller
    jmp inner
    call f_plain
    ret
    .size f_caller, .-f_caller

    function f_indirect
    prologue
    jmp *%rax
    .size f_indirect, .-f_indirect

    function f_table
    prologue
    jmp *table(,%rax,8)
    .size f_table, .-f_table

    function f_thunked
    prologue
    jmp __x86_indirect_thunk_rax
    .size f_thunked, .-f_thunked

    function f_returns
    prologue
    pop %rbx
    pop %rbp
    jmp __x86_return_thunk
    .size f_returns, .-f_returns

    function f_pointed
    prologue
    pop %rbx
    pop %rbp
    ret
    .size f_pointed, .-f_pointed

    function f_extable
    prologue
faulting:
    mov (%rdi), %rax
    pop %rbx
    pop %rbp
    ret
    .size f_extable, .-f_extable

    function f_short
    push %rbp
    pop %rbp
    ret
    .size f_short, .-f_short

    function __x86_indirect_thunk_rax
    jmp *%rax
    .size __x86_indirect_thunk_rax, .-__x86_indirect_thunk_rax

    function __x86_return_thunk
    ret
    .size __x86_return_thunk, .-__x86_return_thunk

    .section .rodata, "a"
    .balign 8
table:
    .quad f_plain
    .quad f_pointed + 2

    .section __ex_table, "a"
    .long faulting - .
    .long f_plain - .
    .long 0
"""

LDS = """
SECTIONS {
  . = 0xffffffff81000000;
  .text : { *(.text) }
  . = ALIGN(4096);
  .rodata : { *(.rodata) }
  __ex_table : { *(__ex_table) }
  /DISCARD/ : { *(.note.gnu.property) *(.comment) }
}
"""


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    image = load_image(elfbuild.build_elf(tmp_path_factory.mktemp("patch_range"), ASM, LDS))
    functions = {f.name: f for f in find_functions(image)}
    return image, functions, PatchRanges(image, functions.values(), find_sites(image))


def refusal(small, name, offset=0, length=5):
    image, functions, ranges = small
    f = functions[name]
    return ranges.refusal(f, f.start + offset, length)


def test_a_range_nothing_reaches_into_is_safe_and_a_target_at_a_is_fine(small):
    assert refusal(small, "f_plain") is None  # f_caller calls f_plain: its target is A itself


def test_a_branch_from_another_function_into_the_range_is_refused(small):
    r = refusal(small, "f_target")
    assert isinstance(r, RangeRefusal) and r.key == "branch-target-inside"
    image, functions, _ = small
    assert hex(functions["f_target"].start + 4) in r.reason


def test_indirect_jumps_in_the_function_are_refused(small):
    assert refusal(small, "f_indirect").key == "indirect-jump-in-function"
    assert refusal(small, "f_thunked").key == "indirect-jump-in-function"
    assert refusal(small, "f_returns") is None  # jmp __x86_return_thunk is a return


def test_jump_tables_and_pointers_into_the_range_are_refused(small):
    assert refusal(small, "f_table").key == "jump-table"
    r = refusal(small, "f_pointed")
    assert r.key == "jump-table" and "pointer stored at" in r.reason


def test_a_function_with_an_exception_table_entry_is_refused_whole(small):
    r = refusal(small, "f_extable")
    assert r.key == "exception-table"
    assert refusal(small, "f_extable", 5, 3).key in ("site:extable", "exception-table")


def test_a_range_past_the_function_end_is_refused(small):
    assert refusal(small, "f_short").key == "past-function-end"


def test_without_sites_the_unchecked_questions_are_said(small):
    image, functions, _ = small
    bare = PatchRanges(image, functions.values(), None)
    assert bare.unchecked and bare.refusal(functions["f_extable"], functions["f_extable"].start, 5) is None
    assert bare.refusal(functions["f_target"], functions["f_target"].start, 5).key == "branch-target-inside"


def test_jump_table_fact_counts_the_forms_it_saw(small):
    image, _, ranges = small
    holds, why = jump_table_fact(image, None, ranges)
    assert holds and "1 jmp *disp(,%reg,8)" in why
    holds, why = jump_table_fact(image, {"CONFIG_RETPOLINE": "y", "CONFIG_CC_IS_GCC": "y"}, ranges)
    assert holds and "table jumps are present" in why  # the text wins over the config


# --- slow: the real Debian 6.1 cloud kernel ------------------------------------------------------

@pytest.fixture(scope="module")
def debian(debian_kernels):
    kernel, _ = debian_kernels(TEST_KERNELS[0])
    image = load_image(kernel.vmlinux)
    functions = find_functions(image)
    return kernel, image, {f.name: f for f in functions}, PatchRanges(image, functions, find_sites(image))


def real_block(image, function, offset=0, tramp=0xFFFFFFFFC0001000):
    out = []
    for address, raw in iter_instruction_spans(image, function):
        if address >= function.start + offset:
            out.append(decode(raw, address))
        if len(out) == 6:
            break
    return plan_block(out, tramp)


@pytest.mark.slow
def test_debian_jump_table_fact_has_evidence(debian):
    kernel, image, _, ranges = debian
    holds, why = jump_table_fact(image, kernel.config, ranges)
    assert not holds and "CONFIG_RETPOLINE=y" in why and "0 jmp *disp(,%reg,8)" in why
    assert ranges.counts.thunk > 100  # the indirect jumps are all there, in retpoline form


@pytest.mark.slow
def test_debian_functions_give_sensible_answers(debian):
    kernel, image, functions, ranges = debian
    vfs_read = functions["vfs_read"]
    assert ranges.refusal(vfs_read, vfs_read.start, 5).key == "site:fentry"
    nofault = functions["copy_from_kernel_nofault"]
    assert ranges.refusal(nofault, nofault.start + 9, 5).key == "exception-table"
    assert ranges.refusal(functions["do_syscall_64"], functions["do_syscall_64"].start, 5).key == "site:noinstr"
    with_jump = next(f for f in functions.values() if ranges.indirect_jump(f) is not None
                     and not ranges.sites.kinds_at(f.start, 5) and f.size > 16)
    assert ranges.refusal(with_jump, with_jump.start, 5).key in ("indirect-jump-in-function", "jump-table",
                                                                 "exception-table", "branch-target-inside")
    schedule = functions["__schedule"]  # notrace: no fentry; safe, and its block proves
    block = real_block(image, schedule)
    assert isinstance(block, BlockPlan)
    assert ranges.refusal(schedule, block.address, block.length) is None
    assert prove_block(block).verdict is Verdict.PROVED


@pytest.mark.slow
def test_debian_branch_targets_inside_ranges_exist_and_are_real(debian):
    _, image, functions, ranges = debian
    found = 0
    for f in functions.values():
        if f.size < 8:
            continue
        inside = ranges.targets_inside(f.start, 5)
        if not inside:
            continue
        r = ranges.refusal(f, f.start, 5)
        assert r is not None
        found += r.key == "branch-target-inside"
        if found >= 3:
            break
    assert found >= 1


def _every_range(image, functions, step=1):
    """(function, [(address, length)]) for every instruction of every ``step``-th function, each
    range the whole instructions covering 5 bytes, as the jump-probe phase asks them."""
    from relocverify.engine.keys import KeyMaker

    keys = KeyMaker(0xFFFFFFFFC0001000)
    for f in list(functions)[::step]:
        section = image.get_section(f.section)
        if section is None or not section.data:
            continue
        data = section.data[f.start - section.address:f.start - section.address + f.size]
        spans = [(off, n) for off, n, _ in keys.keys(data, f.start)]
        out = []
        for i, (off, _) in enumerate(spans):
            length, j = 0, i
            while length < 5 and j < len(spans):
                length, j = length + spans[j][1], j + 1
            out.append((f.start + off, max(length, 5)))
        yield f, out


def test_refusals_in_bulk_are_refusal_one_by_one_on_a_small_image(small):
    image, functions, ranges = small
    for f, asked in _every_range(image, functions.values()):
        assert ranges.refusals(f, asked) == [ranges.refusal(f, a, n) for a, n in asked], f.name
        assert ranges.refusals(f, [(a, 1) for a, _ in asked]) == [ranges.refusal(f, a, 1) for a, _ in asked]


def test_refusals_in_bulk_are_refusal_one_by_one_on_the_kernel(debian):
    """Every bucket and reason, on every instruction of a tenth of the Debian kernel's functions (sites,
    exception tables, jump tables, pointers and branch targets all met)."""
    from collections import Counter

    image, ranges = debian[1], debian[3]
    seen: Counter = Counter()
    for f, asked in _every_range(image, ranges.functions, 10):
        want = [ranges.refusal(f, a, n) for a, n in asked]
        assert ranges.refusals(f, asked) == want, f.name
        seen.update(r.key if r else None for r in want)
    assert len(seen) > 15 and seen[None] > 10_000, seen
