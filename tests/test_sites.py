"""The sites stage (relocverify.sites).

Fast tests link a tiny kernel whose tables have the Linux 6.1 x86-64 entry
layouts (and, in a second build, the 6.3+ layouts) around labelled
instructions, and check that each label is found as its kind.  Slow tests
compare the per-kind counts on the real Debian kernels with counts derived
independently with pyelftools from section sizes and symbols, and check that
every site address lies in an executable section.
"""

from __future__ import annotations

import struct

import pytest

import elfbuild
from elftools.elf.elffile import ELFFile
from hypothesis import given, settings
from hypothesis import strategies as st

from relocverify.errors import InputError
from conftest import TEST_KERNELS
from relocverify.image.fetch import fetch, strip_elf
from relocverify.image.loader import load_image
from relocverify.kernel.sites import (POLICY_BY_KIND, RANGES, SECTION_RANGES, SITE_POLICY, TABLES, Site,
                               SiteIndex, find_sites)

ASM = r"""
    .section .text, "ax"
    .globl _stext
_stext:
    .globl f_alpha
    .type f_alpha, @function
f_alpha:
site_fentry:
    call __fentry__
site_lock:
    lock incl counter(%rip)
site_extable:
    movl (%rdi), %eax
site_fixup:
site_bug:
    ud2
site_alt:
    .byte 0x0f, 0x1f, 0x44, 0x00, 0x00
site_pv:
    call *pv_ops(%rip)
site_retpoline:
    call __x86_indirect_thunk_rax
site_jump:
    .byte 0x66, 0x90
site_jump_target:
site_static:
    call __SCT__tiny
site_kcfi:
    ud2
site_ret:
    .byte 0xe9
    .long __x86_return_thunk - . - 4
    int3
    .size f_alpha, .-f_alpha

    .globl f_blacklisted
    .type f_blacklisted, @function
f_blacklisted:
    nop
    ret
    .size f_blacklisted, .-f_blacklisted

    .globl __fentry__
__fentry__:
    ret
    .globl __x86_return_thunk
__x86_return_thunk:
    ret
    int3
__x86_indirect_thunk_rax:
    jmp *%rax
__SCT__tiny:
    ret

    .section .noinstr.text, "ax"
    .globl f_noinstr
    .type f_noinstr, @function
f_noinstr:
    nop
    ret
    .size f_noinstr, .-f_noinstr

    .section .entry.text, "ax"
    .globl entry_SYSCALL_64
entry_SYSCALL_64:
    swapgs
    sysretq

    .section .init.text, "ax"
f_init:
    ret

    .section .rodata, "a"
bug_file:
    .asciz "mm/tiny.c"

    .section .data, "aw"
counter:
    .quad 0
pv_ops:
    .quad 0
key_tiny:
    .quad 0
key_sc:
    .quad 0

    .section .return_sites, "a"
    .long site_ret - .
    .section .retpoline_sites, "a"
    .long site_retpoline - .
    .section .smp_locks, "a"
    .long site_lock - .
    .section .kcfi_traps, "a"
    .long site_kcfi - .
    .section __ex_table, "a"
    .long site_extable - .
    .long site_fixup - .
    .long 3
    .section .altinstr_replacement, "ax"
repl_alt:
    clac
    .section __jump_table, "aw"
    .long site_jump - .
    .long site_jump_target - .
    .quad key_tiny + 1 - .
    .section .static_call_sites, "a"
    .long site_static - .
    .long key_sc + 1 - .
    .section __mcount_loc, "a"
    .quad site_fentry
    .quad 0
    .section _kprobe_blacklist, "aw"
    .quad f_blacklisted
"""

# struct bug_entry, alt_instr and paravirt_patch_site, in two generations.
TABLES_61 = r"""
    .section __bug_table, "aw"
    .long site_bug - .
    .long bug_file - .
    .word 42
    .word 0x0901
    .section .altinstructions, "a"
    .long site_alt - .
    .long repl_alt - .
    .word 0x8000 | (9 * 32 + 20)
    .byte 5
    .byte 3
    .section .parainstructions, "a"
    .quad site_pv
    .byte 33
    .byte 6
    .skip 6
"""

# 6 alt_instr entries of 14 bytes are 84 bytes, which 12 divides too: the
# validation, not the size, has to pick the layout.
TABLES_63 = r"""
    .section __bug_table, "aw"
    .long site_bug - .
    .word 0x0901
    .skip 2
    .section .altinstructions, "a"
    .rept 6
    .long site_alt - .
    .long repl_alt - .
    .4byte (1 << 16) | (9 * 32 + 20)
    .byte 5
    .byte 3
    .endr
    .section .parainstructions, "a"
    .long site_pv - .
    .byte 33
    .byte 6
"""

LINKER_SCRIPT = """
SECTIONS {
  . = 0xffffffff81000000;
  .text : {
    _text = .;
    *(.text)
    __noinstr_text_start = .; *(.noinstr.text) __noinstr_text_end = .;
    __entry_text_start = .; *(.entry.text) __entry_text_end = .;
    _etext = .;
  }
  .rodata : {
    *(.rodata)
    . = ALIGN(8);
    __start___jump_table = .; *(__jump_table) __stop___jump_table = .;
    __start_static_call_sites = .; *(.static_call_sites) __stop_static_call_sites = .;
  }
  __ex_table : { __start___ex_table = .; *(__ex_table) __stop___ex_table = .; }
  .data : { *(.data) }
  __bug_table : { __start___bug_table = .; *(__bug_table) __stop___bug_table = .; }
  .init.text : { _sinittext = .; *(.init.text) _einittext = .; }
  .init.data : {
    . = ALIGN(8);
    __start_mcount_loc = .; *(__mcount_loc) __stop_mcount_loc = .;
    __start_kprobe_blacklist = .; *(_kprobe_blacklist) __stop_kprobe_blacklist = .;
  }
  . = ALIGN(8);
  .parainstructions : { __parainstructions = .; *(.parainstructions) __parainstructions_end = .; }
  .retpoline_sites : { __retpoline_sites = .; *(.retpoline_sites) __retpoline_sites_end = .; }
  .return_sites : { __return_sites = .; *(.return_sites) __return_sites_end = .; }
  .kcfi_traps : { *(.kcfi_traps) }
  .altinstructions : { __alt_instructions = .; *(.altinstructions) __alt_instructions_end = .; }
  .altinstr_replacement : { *(.altinstr_replacement) }
  . = ALIGN(64);
  .smp_locks : { __smp_locks = .; *(.smp_locks) . = ALIGN(64); __smp_locks_end = .; }
  /DISCARD/ : { *(.note.gnu.property) *(.comment) }
}
"""


def build_elf(directory, asm):
    return elfbuild.build_elf(directory, asm, LINKER_SCRIPT)


@pytest.fixture(scope="module")
def kernel61(tmp_path_factory):
    return build_elf(tmp_path_factory.mktemp("k61"), ASM + TABLES_61)


@pytest.fixture(scope="module")
def kernel63(tmp_path_factory):
    return build_elf(tmp_path_factory.mktemp("k63"), ASM + TABLES_63)


def labels(image):
    return {s.name: s.address for s in image.symbols}


EXPECTED_AT = {
    "site_fentry": ("fentry", 5),
    "site_lock": ("smp_lock", 7),
    "site_extable": ("extable", 2),
    "site_bug": ("bug", 2),
    "site_alt": ("alternative", 5),
    "site_pv": ("paravirt", 6),
    "site_retpoline": ("retpoline", 5),
    "site_jump": ("jump_label", 2),
    "site_static": ("static_call", 5),
    "site_kcfi": ("kcfi", 2),
    "site_ret": ("return_thunk", 5),
}


def test_every_table_kind_found_at_its_label(kernel61):
    image = load_image(kernel61)
    index = find_sites(image)
    at = labels(image)
    for label, (kind, length) in EXPECTED_AT.items():
        (site,) = list(index.iter_sites(kind))
        assert (site.address, site.length) == (at[label], length), label
        assert kind in index.kinds_at(at[label]), label
    assert index.stray_by_kind() == {kind: 0 for kind in index.count_by_kind()}
    assert index.missing == ()


def test_entry_fields(kernel61):
    image = load_image(kernel61)
    index = find_sites(image)
    at = labels(image)
    (extable,) = index.iter_sites("extable")
    assert extable.target == at["site_fixup"] and extable.tag == 3
    (bug,) = index.iter_sites("bug")
    assert bug.detail == "mm/tiny.c:42 flags 0x901" and bug.tag == 0x901
    (alternative,) = index.iter_sites("alternative")
    assert alternative.target == at["repl_alt"] and alternative.target_length == 3
    assert alternative.tag == 0x8000 | (9 * 32 + 20)
    assert "feature 9*32+20 (ALT_NOT)" in alternative.detail
    (paravirt,) = index.iter_sites("paravirt")
    assert paravirt.tag == 33
    (jump,) = index.iter_sites("jump_label")
    assert jump.target == at["site_jump_target"] and jump.tag == 1
    assert f"key {at['key_tiny']:#x} branch" in jump.detail
    (static,) = index.iter_sites("static_call")
    assert static.target == at["key_sc"] and static.tag == 1 and "tail" in static.detail
    assert [s.address for s in index.iter_sites("fentry")] == [at["site_fentry"]]  # the 0 entry skipped
    (blacklisted,) = index.iter_sites("kprobe_blacklist")
    assert (blacklisted.address, blacklisted.length) == (at["f_blacklisted"], 2)
    assert str(bug).startswith(f"bug at {at['site_bug']:#x}+2: mm/tiny.c:42")


def test_ranges_and_overlap_queries(kernel61):
    image = load_image(kernel61)
    index = find_sites(image)
    at = labels(image)
    (noinstr,) = index.iter_sites("noinstr")
    assert (noinstr.address, noinstr.end) == (at["__noinstr_text_start"], at["__noinstr_text_end"])
    assert index.kinds_at(at["f_noinstr"] + 1) == ("noinstr",)
    assert index.kinds_at(at["entry_SYSCALL_64"]) == ("entry",)
    assert index.kinds_at(at["f_init"]) == ("init_text",)
    assert index.kinds_at(image.get_section(".altinstr_replacement").address) == ("alt_replacement",)
    assert index.kinds_at(at["f_blacklisted"] + 1) == ("kprobe_blacklist",)
    # the half-open bounds: the lock instruction's first and last bytes, and its neighbours
    assert index.kinds_at(at["site_lock"] - 1) == ("fentry",)
    assert index.kinds_at(at["site_lock"]) == ("smp_lock",)
    assert index.kinds_at(at["site_lock"] + 6) == ("smp_lock",)
    assert index.kinds_at(at["site_lock"] + 7) == ("extable",)
    assert index.kinds_at(at["site_fentry"], 6) == ("fentry", "smp_lock")  # SITE_POLICY order
    span = at["site_ret"] + 5 - at["site_extable"]
    assert index.kinds_at(at["site_extable"], span) == ("extable", "bug", "kcfi", "alternative", "paravirt",
                                                   "retpoline", "return_thunk", "static_call",
                                                   "jump_label")
    assert index.kinds_at(0x1000) == ()
    counts = index.count_by_kind()
    assert counts["smp_lock"] == 1  # the page padding of .smp_locks is not a site


def test_newer_layouts_are_detected(kernel63):
    index = find_sites(load_image(kernel63))
    at = labels(load_image(kernel63))
    assert index.count_by_kind()["alternative"] == 6
    assert {s.address for s in index.iter_sites("alternative")} == {at["site_alt"]}
    assert all("ALT_NOT" in s.detail for s in index.iter_sites("alternative"))
    assert [s.address for s in index.iter_sites("paravirt")] == [at["site_pv"]]
    assert [s.tag for s in index.iter_sites("bug")] == [0x901]
    notes = " | ".join(index.notes)
    assert "14 bytes" in notes and "6 bytes" in notes and "8 bytes" in notes


def test_config_orders_the_bug_layout(kernel61, tmp_path):
    config = tmp_path / "config"
    config.write_text("CONFIG_GENERIC_BUG=y\nCONFIG_DEBUG_BUGVERBOSE=y\n")
    index = find_sites(load_image(kernel61), config)
    assert any("DEBUG_BUGVERBOSE=y" in note for note in index.notes)
    index = find_sites(load_image(kernel61), {"CONFIG_GENERIC_BUG": "y"})
    assert any("expects 8-byte" in note for note in index.notes)
    assert any("contradicts the kernel config" in note for note in index.notes)
    assert index.count_by_kind()["bug"] == 1  # the table still decides
    with pytest.raises(InputError):
        find_sites(load_image(kernel61), tmp_path / "no-config")


def test_stripped_image_keeps_section_tables(kernel61, tmp_path):
    stripped = tmp_path / "stripped"
    stripped.write_bytes(strip_elf(kernel61.read_bytes()))
    index = find_sites(load_image(stripped))
    counts = index.count_by_kind()
    for kind in ("extable", "bug", "alternative", "paravirt", "retpoline", "return_thunk", "smp_lock",
                 "kcfi", "alt_replacement", "init_text"):
        assert counts[kind] == 1, kind
    for kind in ("jump_label", "static_call", "fentry", "kprobe_blacklist", "noinstr", "entry"):
        assert kind not in counts
        assert f"{kind}: no symbols (pass System.map)" in index.missing
    elf = load_image(kernel61)
    system_map = tmp_path / "System.map"
    system_map.write_text("".join(f"{s.address:016x} {'T' if s.kind == 'func' else 't'} {s.name}\n"
                                  for s in elf.symbols))
    with_map = find_sites(load_image(stripped, system_map))
    assert with_map.count_by_kind() == find_sites(elf).count_by_kind()
    assert with_map.missing == ()


def test_a_stray_entry_is_counted(tmp_path):
    asm = ASM + TABLES_61 + '\n    .section .return_sites, "a"\n    .long counter - .\n'
    index = find_sites(load_image(build_elf(tmp_path, asm)))
    assert index.count_by_kind()["return_thunk"] == 2
    assert index.stray_by_kind()["return_thunk"] == 1


def test_policy_table_covers_every_kind():
    kinds = {t.kind for t in TABLES} | {r.kind for r in RANGES} | {k for k, _ in SECTION_RANGES}
    assert kinds == set(POLICY_BY_KIND)
    assert len(POLICY_BY_KIND) == len(SITE_POLICY)
    for row in SITE_POLICY:
        assert row.consequence in ("reject", "mark", "verify-variants")
        assert len(row.reason) > 30
    for kind in ("extable", "bug", "kprobe_blacklist", "noinstr", "entry", "alternative", "paravirt",
                 "retpoline", "return_thunk", "fentry", "static_call", "jump_label", "smp_lock"):
        assert kind in POLICY_BY_KIND
    assert "bytes on disk are not the bytes that run" in POLICY_BY_KIND["return_thunk"].reason
    assert "apply_returns()" in POLICY_BY_KIND["return_thunk"].reason


@settings(max_examples=300, deadline=None)
@given(sites=st.lists(st.tuples(st.sampled_from(["bug", "noinstr", "alternative", "init_text"]),
                                st.integers(0, 400), st.integers(0, 150)), max_size=30),
       query=st.tuples(st.integers(-20, 600), st.integers(0, 20)))
def test_overlap_queries_match_brute_force(sites, query):
    by_kind = {}
    for kind, start, length in sites:
        by_kind.setdefault(kind, []).append(Site(kind, start, length))
    index = SiteIndex(by_kind, [], [], {})
    address, length = query
    end = address + max(length, 1)
    expected = {site for found in by_kind.values() for site in found
                if site.length > 0 and site.address < end and address < site.end}
    assert set(index.sites_at(address, length)) == expected
    assert set(index.kinds_at(address, length)) == {site.kind for site in expected}


def test_site_is_a_frozen_value():
    site = Site("bug", 0x10, 2)
    with pytest.raises(AttributeError):
        site.address = 0
    assert site.end == 0x12


# --- slow: the real Debian kernels -----------------------------------------------------

def independent_counts(vmlinux: str) -> dict[str, int]:
    """Per-kind entry counts straight from pyelftools: section sizes and symbols."""
    with open(vmlinux, "rb") as handle:
        elf = ELFFile(handle)
        sections = {s.name: s for s in elf.iter_sections()}
        symtab = elf.get_section_by_name(".symtab")

        def symbol(name):
            return symtab.get_symbol_by_name(name)[0]["st_value"]

        def between(start, stop):
            low, high = symbol(start), symbol(stop)
            for section in sections.values():
                base = section["sh_addr"]
                if section["sh_flags"] & 2 and base <= low and high <= base + section["sh_size"]:
                    return section.data()[low - base:high - base]
            raise AssertionError(f"{start}..{stop} is in no section")

        def size(name, entry):
            assert sections[name]["sh_size"] % entry == 0, name
            return sections[name]["sh_size"] // entry

        def nonzero(data, fmt):
            return sum(1 for (value,) in struct.iter_unpack(fmt, data) if value)

        return {
            "extable": size("__ex_table", 12),
            "bug": size("__bug_table", 12),
            "alternative": size(".altinstructions", 12),
            "paravirt": size(".parainstructions", 16),
            "retpoline": size(".retpoline_sites", 4),
            "return_thunk": size(".return_sites", 4),
            "smp_lock": nonzero(sections[".smp_locks"].data(), "<i"),
            "jump_label": len(between("__start___jump_table", "__stop___jump_table")) // 16,
            "static_call": len(between("__start_static_call_sites", "__stop_static_call_sites")) // 8,
            "fentry": nonzero(between("__start_mcount_loc", "__stop_mcount_loc"), "<Q"),
            "kprobe_blacklist": nonzero(between("__start_kprobe_blacklist", "__stop_kprobe_blacklist"), "<Q"),
        }


def executable_ranges(vmlinux: str) -> list[tuple[int, int]]:
    with open(vmlinux, "rb") as handle:
        return [(s["sh_addr"], s["sh_addr"] + s["sh_size"]) for s in ELFFile(handle).iter_sections()
                if s["sh_flags"] & 4]


def relocation_mismatches(vmlinux: str, section_name: str, limit: int = 2000) -> tuple[int, int]:
    """Compare the first ``limit`` s32 entries of a site table with the
    R_X86_64_PC32 records ld left in its .rela section (S + A - P)."""
    with open(vmlinux, "rb") as handle:
        elf = ELFFile(handle)
        table = elf.get_section_by_name(section_name)
        relocations = elf.get_section_by_name(".rela" + section_name)
        symtab = elf.get_section_by_name(".symtab")
        data, base = table.data(), table["sh_addr"]
        checked = bad = 0
        for relocation in relocations.iter_relocations():
            if checked == limit:
                break
            assert relocation["r_info_type"] == 2  # R_X86_64_PC32
            place = relocation["r_offset"]
            target = symtab.get_symbol(relocation["r_info_sym"])["st_value"] + relocation["r_addend"]
            stored = struct.unpack_from("<i", data, place - base)[0]
            checked += 1
            bad += stored != target - place
        return checked, bad


@pytest.mark.slow
@pytest.mark.parametrize("name", TEST_KERNELS)
def test_debian_site_counts_match_independent_counts(debian_kernels, name):
    kernel, stripped = debian_kernels(name)
    expected = independent_counts(kernel.vmlinux)
    dbg = find_sites(load_image(kernel.vmlinux), kernel.config)
    packed = find_sites(load_image(kernel.vmlinuz, kernel.system_map), kernel.config)
    bare = find_sites(load_image(stripped))
    for index in (dbg, packed):
        counts = index.count_by_kind()
        assert {kind: counts[kind] for kind in expected} == expected
        assert index.missing == ()
        for kind in ("noinstr", "entry", "irqentry", "softirqentry", "cpuidle", "alt_replacement"):
            assert counts[kind] == 1, kind
    counts = bare.count_by_kind()
    section_kinds = ("extable", "bug", "alternative", "paravirt", "retpoline", "return_thunk", "smp_lock")
    assert {kind: counts[kind] for kind in section_kinds} == {kind: expected[kind] for kind in section_kinds}
    assert len(bare.missing) == 6 and all("pass System.map" in note for note in bare.missing)
    assert expected["return_thunk"] > 40_000 and expected["fentry"] > 30_000
    assert any("DEBUG_BUGVERBOSE=y" in note for note in dbg.notes)


@pytest.mark.slow
@pytest.mark.parametrize("name", TEST_KERNELS)
def test_debian_every_site_lies_in_executable_text(debian_kernels, name):
    kernel, _ = debian_kernels(name)
    image = load_image(kernel.vmlinux)
    index = find_sites(image)
    ranges = sorted(executable_ranges(kernel.vmlinux))
    outside = {}
    for site in index.iter_sites():
        if not any(low <= site.address < high for low, high in ranges):
            outside[site.kind] = outside.get(site.kind, 0) + 1
    assert outside == {}
    assert all(count == 0 for count in index.stray_by_kind().values())
    replacement = image.get_section(".altinstr_replacement")
    for site in index.iter_sites("alternative"):
        assert site.length >= site.target_length
        assert replacement.contains(site.target, site.target_length) or image.is_executable(site.target)
    thunk = image.symbol_address("__x86_return_thunk")
    for site in index.iter_sites("return_thunk"):
        raw = image.read(site.address, 5)
        assert raw[0] == 0xE9 and site.address + 5 + struct.unpack_from("<i", raw, 1)[0] == thunk
    assert {image.read(site.address, 2) for site in index.iter_sites("bug")} == {b"\x0f\x0b"}
    assert {image.read(site.address, 1) for site in index.iter_sites("smp_lock")} == {b"\xf0"}
    fentry = image.symbol_address("__fentry__")
    for site in index.iter_sites("fentry"):
        raw = image.read(site.address, 5)
        assert raw[0] == 0xE8 and site.address + 5 + struct.unpack_from("<i", raw, 1)[0] == fentry


@pytest.mark.slow
@pytest.mark.parametrize("name", TEST_KERNELS)
def test_debian_tables_hold_final_link_values(debian_kernels, name):
    """The -dbg vmlinux keeps .rela records (--emit-relocs); the stored
    self-relative values already equal S + A - P, so no relocation applies."""
    kernel, _ = debian_kernels(name)
    for section_name in (".return_sites", ".retpoline_sites", ".smp_locks"):
        checked, bad = relocation_mismatches(kernel.vmlinux, section_name)
        assert checked > 1000 and bad == 0, section_name


# --- sites in verdicts (batch and check) ---------------------------------------

@pytest.mark.slow
def test_batch_summary_reports_sites_and_verifies_every_replacement(tmp_path):
    from relocverify.engine.run import RunOptions, run
    from relocverify.store.store import Results

    image = load_image(fetch("debian-6.1-cloud").vmlinux)
    db = str(tmp_path / "s.sqlite")
    summary = run(image, db, RunOptions(0xFFFFFFFFC0001000, 2, 10.0, 1500, True, None))
    store = Results(db)
    rows = list(store.iter_rows(store.find_image(image.identity)))
    store.close()
    index = find_sites(image)
    assert set(summary["by_site"]) == set(index.kinds())
    for kind, entry in summary["by_site"].items():
        assert entry["sites"] == index.count_by_kind()[kind]
        assert entry["instructions"] == sum(1 for r in rows if kind in r.sites)
    alt = summary["alternative_replacements"]
    assert alt["sites"] == index.count_by_kind()["alternative"]
    assert sum(alt["by_verdict"].values()) >= alt["instructions"] > 4000
    assert alt["by_verdict"]["refuted"] == 0
    # a rejecting site rejects, whatever the bytes' own proof said
    assert all(r.verdict == "rejected" for r in rows if "extable" in r.sites or "bug" in r.sites)
    # the live variants of a return thunk (jmp __x86_return_thunk, ret) are both verified
    thunk_rows = [r for r in rows if r.sites == ("return_thunk",) and r.raw[:1] == b"\xe9"]
    assert thunk_rows and all(r.verdict == "proved" for r in thunk_rows)


@pytest.mark.slow
def test_check_with_image_prints_sites_and_the_live_variant():
    from relocverify.cli import main

    k = fetch("debian-6.1-cloud")
    image = load_image(k.vmlinux)
    index = find_sites(image)
    site = next(s for s in index.iter_sites("return_thunk"))
    raw = image.read(site.address, site.length)
    import io

    out = io.StringIO()
    code = main(["check", raw.hex(), "--at", hex(site.address), "--image", k.vmlinux, "--json"], out=out)
    import json

    doc = json.loads(out.getvalue())
    assert code == 0 and doc["verdict"] == "proved"
    assert [s["kind"] for s in doc["sites"]][:1] == ["return_thunk"]
