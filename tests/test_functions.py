"""The functions stage (relocverify.functions): bounds from ELF sizes, from a
System.map with int3 trimming, or from a linear sweep; and total coverage of
every function by instruction spans."""

from __future__ import annotations

import time

import pytest

import elfbuild
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import TEST_KERNELS
from relocverify.image.fetch import fetch, stripped_copy, strip_elf
from relocverify.image.functions import (Function, find_functions, iter_instruction_spans,
                                   trim_int3_padding)
from relocverify.image.image import Image, Section, Symbol
from relocverify.image.loader import load_image

TEXT = 0xFFFFFFFF81000000

# f_ret: ends in ret, then int3 padding outside its .size.
# f_ebcc: ends in `eb cc` (jmp .-52), then int3 padding: the cc of the jmp is real.
# f_alias / __f_alias: two names, one address.  f_empty: a size-0 FUNC symbol.
# f_called: ends in a call (noreturn) followed by int3s: no split in the sweep.
ASM = r"""
    .section .text, "ax"
    .globl f_ret
    .type f_ret, @function
f_ret:
    push %rbp
    mov %rsp, %rbp
    pop %rbp
    ret
    .size f_ret, .-f_ret
    .byte 0xcc, 0xcc, 0xcc, 0xcc

    .globl f_ebcc
    .type f_ebcc, @function
f_ebcc:
    xor %eax, %eax
    .byte 0xeb, 0xcc
    .size f_ebcc, .-f_ebcc
    .byte 0xcc, 0xcc

    .globl f_alias
    .globl __f_alias
    .type f_alias, @function
    .type __f_alias, @function
f_alias:
__f_alias:
    mov $1, %eax
    ret
    .size f_alias, .-f_alias
    .size __f_alias, .-__f_alias

    .globl f_empty
    .type f_empty, @function
f_empty:
    .size f_empty, 0
    .globl f_called
    .type f_called, @function
f_called:
    call f_ret
    .byte 0xcc, 0xcc, 0xcc
    nop
    ret
    .size f_called, .-f_called
"""

LINKER_SCRIPT = """
SECTIONS {
  . = 0xffffffff81000000;
  .text : { *(.text) }
  /DISCARD/ : { *(.note.gnu.property) *(.comment) }
}
"""


def build_elf(directory):
    return elfbuild.build_elf(directory, ASM, LINKER_SCRIPT)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_elf(tmp_path_factory.mktemp("functions"))


def system_map_of(image: Image, path) -> str:
    """A System.map written from the ELF's function symbols (what nm -n gives)."""
    lines = [f"{s.address:016x} {'T' if s.kind == 'func' else 'd'} {s.name}" for s in image.symbols]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def by_name(functions):
    return {f.name: f for f in functions}


def assert_total_coverage(image, functions):
    for function in functions:
        spans = list(iter_instruction_spans(image, function))
        position = function.start
        for address, raw in spans:
            assert address == position and raw
            position += len(raw)
        assert position == function.end, function


def test_elf_sizes(tiny):
    image = load_image(tiny)
    functions = find_functions(image)
    names = by_name(functions)
    assert set(names) == {"f_ret", "f_ebcc", "f_alias", "f_called"}  # alias kept once, size 0 dropped
    assert names["f_ret"].size == 6 and names["f_ret"].start == TEXT
    assert image.read(names["f_ebcc"].end - 2, 2) == b"\xeb\xcc"
    assert all(f.section == ".text" for f in functions)
    assert [f.start for f in functions] == sorted(f.start for f in functions)
    assert_total_coverage(image, functions)


def test_system_map_trims_int3_but_not_eb_cc(tiny, tmp_path):
    elf = load_image(tiny)
    image = load_image(tiny, system_map_of(elf, tmp_path / "System.map"))
    assert image.symbol_source == "system.map"
    names = by_name(find_functions(image))
    sized = by_name(find_functions(elf))
    assert names["f_ret"] == sized["f_ret"]  # its 4 int3s of padding trimmed
    assert names["f_ebcc"] == sized["f_ebcc"]  # `eb cc` kept, the `cc cc` after it trimmed
    assert names["f_alias"].name == "f_alias"
    # f_empty and f_called share an address; a map has no sizes, so the alias
    # rule alone decides: fewest leading underscores, then the shorter name.
    assert "f_called" not in names
    assert names["f_empty"].start == sized["f_called"].start
    assert names["f_empty"].end == image.get_section(".text").end
    assert_total_coverage(image, list(names.values()))


def test_sweep_without_symbols_splits_after_ret_and_jmp(tiny, tmp_path):
    stripped = tmp_path / "stripped"
    stripped.write_bytes(strip_elf(tiny.read_bytes()))
    image = load_image(stripped)
    assert image.symbol_source == "none"
    functions = find_functions(image)
    sized = by_name(find_functions(load_image(tiny)))
    starts = [f.start for f in functions]
    assert functions[0].name == f"sub_{TEXT:x}"
    assert functions[0].end == sized["f_ret"].end  # ret + int3 int3 ...: split, padding dropped
    assert functions[1].start == sized["f_ebcc"].start and functions[1].end == sized["f_ebcc"].end
    assert sized["f_alias"].start in starts
    assert len(functions) == 3  # the int3s after `call` do not split
    assert_total_coverage(image, functions)


def make_image(code: bytes, symbols=()) -> Image:
    text = Section(".text", TEXT, code, True, flags=0x6)
    source = "system.map" if symbols else "none"
    return Image("mem", "0" * 64, "elf", None, (text,), tuple(symbols), source)


@pytest.mark.parametrize("code, trimmed", [
    (b"\x31\xc0\xc3\xcc\xcc", 3),          # xor; ret; int3; int3
    (b"\x31\xc0\xeb\xcc", 4),              # xor; jmp .-52: the cc is the jmp's rel8
    (b"\x31\xc0\xeb\xcc\xcc", 4),          # ... then one int3 of padding
    (b"\xb0\xcc", 2),                      # mov $0xcc, %al
    (b"\xcc\xcc", 0),                      # all padding
    (b"\x48\xb8" + b"\xcc" * 8, 10),       # movabs $0xcccc..., %rax
])
def test_trim_int3_padding(code, trimmed):
    section = Section(".text", TEXT, code, True, flags=0x6)
    assert trim_int3_padding(section, TEXT, TEXT + len(code)) == TEXT + trimmed


def test_map_function_runs_to_next_symbol_and_section_end():
    code = b"\x90\xc3\xcc\xcc" + b"\x55\x5d\xc3"
    image = make_image(code, [Symbol("a", TEXT, None, "func"), Symbol("b", TEXT + 4, None, "func"),
                              Symbol("data", TEXT + 1, None, "object")])
    assert find_functions(image) == [Function("a", TEXT, TEXT + 2, ".text"),
                                     Function("b", TEXT + 4, TEXT + 7, ".text")]


def test_undecodable_bytes_still_covered():
    code = b"\x06\x07\x0f\x0b\xc3\x62"  # push es / pop es are invalid in 64-bit mode; a lone EVEX byte
    image = make_image(code)
    (function,) = find_functions(image)
    spans = list(iter_instruction_spans(image, function))
    assert b"".join(raw for _, raw in spans) == code


@settings(max_examples=200, deadline=None)
@given(code=st.binary(min_size=1, max_size=400))
def test_spans_cover_every_byte_exactly_once(code):
    image = make_image(code)
    functions = find_functions(image)
    assert functions and functions[0].start >= TEXT
    covered = b""
    for function in functions:
        spans = list(iter_instruction_spans(image, function))
        assert sum(len(raw) for _, raw in spans) == function.size
        covered += b"".join(raw for _, raw in spans)
    assert len(covered) <= len(code)
    for a, b in zip(functions, functions[1:]):
        assert a.end <= b.start


# --- slow: the real Debian kernels -------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", TEST_KERNELS)
def test_debian_functions_cover_text(name):
    kernel = fetch(name)
    modes = {
        "elf": load_image(kernel.vmlinux),
        "system.map": load_image(kernel.vmlinuz, kernel.system_map),
        "none": load_image(stripped_copy(kernel.vmlinux)),
    }
    counts = {}
    for mode, image in modes.items():
        started = time.perf_counter()
        functions = find_functions(image)
        instructions = 0
        for function in functions:
            size = 0
            for _, raw in iter_instruction_spans(image, function):
                size += len(raw)
                instructions += 1
            assert size == function.size
        counts[mode] = (len(functions), instructions, time.perf_counter() - started)
    elf_functions, elf_instructions, _ = counts["elf"]
    assert elf_functions > 40_000 and elf_instructions > 2_500_000
    assert counts["system.map"][0] > elf_functions * 0.95
    assert counts["none"][1] > elf_instructions  # the sweep covers the text outside FUNC symbols too
    sized = {f.start: f for f in find_functions(modes["elf"])}
    mapped = {f.start: f for f in find_functions(modes["system.map"])}
    common = sized.keys() & mapped.keys()
    assert len(common) > 0.95 * len(sized)
    # a map-derived end never cuts into a function the ELF sizes describe
    assert sum(1 for start in common if mapped[start].end < sized[start].end - 1) < 0.01 * len(common)
