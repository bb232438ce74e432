"""The kernel's own instruction decoder in the gate (``linux-insn@``): built from Debian's real
``linux-source-6.1`` and ``linux-source-6.12`` packages (installed here when missing and we are
root, as the report tests install Chromium), known answers, the 6.1 -> 6.12 change gated, a
mutated opcode map caught, and the errors a user can meet."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from relocverify.cli import gate as gate_cli
from relocverify.cli.main import _Parser
from relocverify.errors import InputError
from relocverify.gate import linux_insn_classes as classes
from relocverify.gate.compare import compare
from relocverify.gate.samples import Unit
from relocverify.x86.decoders import linux_insn
from relocverify.x86.decoders.adapters import get_adapter
from relocverify.x86.decoders.objdump import ObjdumpAdapter

ROOT = Path(__file__).resolve().parent.parent
CORPUS = str(ROOT / "corpora" / "decoder_facts.toml")
A = 0xFFFFFFFF81234560


def _ensure_source(version: str) -> None:
    from conftest import ensure_linux_source

    ensure_linux_source(version)


@pytest.fixture(scope="module")
def v61():
    _ensure_source("6.1")
    return get_adapter("linux-insn@6.1")


@pytest.fixture(scope="module")
def v612():
    _ensure_source("6.12")
    return get_adapter("linux-insn@6.12")


def gate(*argv: str) -> tuple[int, str]:
    parser = _Parser(prog="relocverify")
    gate_cli.add_parser(parser.add_subparsers(dest="command", required=True, parser_class=_Parser))
    out = io.StringIO()
    try:
        return gate_cli.command(parser.parse_args(["gate", *argv]), out), out.getvalue()
    except InputError as e:
        return 2, str(e)


def _facts(adapter, hexes: str):
    raw = bytes.fromhex(hexes)
    return adapter.decode_many([(A, raw)])[0], adapter.decode_detail([raw])[0]


# ------------------------------------------------------------------ the build


def test_build_from_the_package_in_a_fresh_cache(v61, tmp_path):
    built = linux_insn.build(linux_insn.locate("6.1"), str(tmp_path))
    tarball = linux_insn.PACKAGE_TARBALL.format(version="6.1")
    assert Path(built.directory).name == linux_insn._file_sha256(tarball) == v61.build.sha256
    manifest = json.loads((Path(built.directory) / "manifest.json").read_text())
    # Only NEEDED came out of the tarball, and every kernel file the compiler read is among them.
    assert set(manifest["files"]) <= set(linux_insn.NEEDED)
    assert manifest["headers"] and set(manifest["headers"]) <= set(manifest["files"])
    assert "tools/arch/x86/lib/insn.c" in manifest["headers"]
    assert built.kernel_version.startswith("6.1.")
    # inat-tables.c is the kernel's awk script's output, not ours.
    assert (Path(built.directory) / "inat-tables.c").read_text().startswith("/* x86 opcode map generated from")
    # A second build is the first one, from the cache.
    mtime = os.stat(built.library).st_mtime_ns
    again = linux_insn.build(linux_insn.locate("6.1"), str(tmp_path))
    assert again.library == built.library and os.stat(again.library).st_mtime_ns == mtime
    # The fresh build answers as the one the other tests use.
    fresh = linux_insn.LinuxInsnAdapter("linux-insn@6.1", built)
    raws = [(A, bytes.fromhex(h)) for h in ("48 8b 05 10 00 00 00", "e8 00 00 00 00", "62 f1 65 08 72 c3 10")]
    assert fresh.decode_many(raws) == v61.decode_many(raws)


def test_nothing_of_the_kernel_is_in_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert not [p for p in tracked if p.endswith(("insn.c", "inat.c", "x86-opcode-map.txt", "inat-tables.c"))]


# ------------------------------------------------------------------ known answers

#: (bytes, length, disp (offset, size), imm (offset, size), target delta, Decoded flags that must be set)
KNOWN = [
    ("55", 1, None, None, None, {"force64"}),
    ("f0 ff 05 10 00 00 00", 7, (3, 4), None, None, {"modrm", "rip_relative"}),
    ("48 8b 05 10 00 00 00", 7, (3, 4), None, None, {"rip_relative"}),
    ("81 3d 10 00 00 00 78 56 34 12", 10, (2, 4), (6, 4), None, {"rip_relative", "immediate"}),
    ("80 3d 30 00 00 00 01", 7, (2, 4), (6, 1), None, {"rip_relative"}),
    ("48 b8 88 77 66 55 44 33 22 11", 10, None, (2, 8), None, {"immediate"}),
    ("48 a1 11 22 33 44 55 66 77 88", 10, (2, 8), None, None, {"moffset"}),  # moffs64 as a displacement
    ("67 a1 11 22 33 44", 6, (2, 4), None, None, {"moffset"}),
    ("c8 10 00 01", 4, None, (1, 2), None, {"second_immediate"}),  # enter: the second immediate left out
    ("e8 00 00 00 00", 5, None, (1, 4), 5, {"force64"}),
    ("66 e8 10 00 00 00", 6, None, (2, 4), 0x16, {"force64"}),  # Intel: 0x66 ignored, rel32
    ("e9 fb ff ff ff", 5, None, (1, 4), 0, set()),
    ("eb fe", 2, None, (1, 1), 0, set()),
    ("0f 84 fc ff ff ff", 6, None, (2, 4), 2, set()),
    ("e3 10", 2, None, (1, 1), 0x12, set()),  # jrcxz
    ("c7 f8 10 00 00 00", 6, None, (2, 4), 0x16, {"modrm"}),  # xbegin: Grp11B's 'XBEGIN Jz'
    ("c7 c0 10 00 00 00", 6, None, (2, 4), None, {"modrm"}),  # mov $imm32, %eax: no target
    ("0f b9 cc", 3, None, None, None, {"modrm"}),  # ud1 with its ModRM (capstone 5 leaves it out)
    ("66 0f 1f 44 00 00", 6, (5, 1), None, None, {"modrm"}),
    ("f3 0f 1e fa", 4, None, None, None, set()),  # endbr64
    ("0f 01 e8", 3, None, None, None, {"modrm"}),  # serialize
    ("c4 e2 79 18 05 10 00 00 00", 9, (5, 4), None, None, {"must_vex", "rip_relative"}),
    ("62 f1 65 08 72 c3 10", 7, None, (6, 1), None, {"must_evex"}),
    ("0f 0b 78 65 6e 0f a2", 7, None, None, None, {"emulate_prefix"}),  # Xen's "ud2; .ascii xen; cpuid"
    ("0f 0b 6b 76 6d 0f a2", 7, None, None, None, {"emulate_prefix"}),  # KVM's
]


@pytest.mark.parametrize("hexes,length,disp,imm,target,flags", KNOWN)
def test_known_answers(v61, v612, hexes, length, disp, imm, target, flags):
    for adapter in (v61, v612):
        f, d = _facts(adapter, hexes)
        assert f.ok and f.length == length == d.length
        assert f.field("disp") == disp and f.field("imm") == imm and f.target_delta == target
        assert flags <= d.flags, (adapter.name, d.flags)


#: capstone's own x86-64 test vector (tests/test_x86.c, X86_CODE64, at 0x1000) and the answers its
#: test prints: push, a RIP-relative mov, jmp/call rel32 to 0xffffffffdeadcef7, jmp through the GOT, je rel8.
CAPSTONE_X86_CODE64 = "55 48 8b 05 b8 13 00 00 e9 ea be ad de ff 25 23 01 00 00 e8 df be ad de 74 ff"
CAPSTONE_EXPECTED = [(1, None, None, None), (7, (3, 4), None, None), (5, None, (1, 4), 0xFFFFFFFFDEADCEF7),
                     (6, (2, 4), None, None), (5, None, (1, 4), 0xFFFFFFFFDEADCEF7), (2, None, (1, 1), 0x1019)]


def test_capstones_test_vector_walked_by_the_kernels_lengths(v61, v612):
    raw = bytes.fromhex(CAPSTONE_X86_CODE64)
    for adapter in (v61, v612):
        at, got = 0, []
        while at < len(raw):
            f = adapter.decode_many([(0x1000 + at, raw[at:at + 15])])[0]
            got.append((f.length, f.field("disp"), f.field("imm"), f.target(0x1000 + at)))
            at += f.length
        assert got == CAPSTONE_EXPECTED, adapter.name


def test_offsets_add_up_to_the_length(v61):
    raws = [bytes.fromhex(k[0]) for k in KNOWN]
    for raw, d in zip(raws, v61.decode_detail(raws)):
        parts = d.emulate_prefix + d.prefixes + d.rex + d.vex + len(d.opcode)
        parts += (d.modrm_offset is not None) + (d.sib_offset is not None)
        parts += sum(x[1] for x in (d.disp, d.imm, d.imm2) if x)
        assert parts == d.length, raw.hex(" ")


def test_the_decoder_facts_corpus(v61):
    """linux-insn gives every cross-checked instruction of corpora/decoder_facts.toml its length and
    fields, except the three four-operand forms classes.py names (is4 convention, AMD-only FMA4/XOP)."""
    from relocverify.corpus.runner import load_file

    entries = [e for e in load_file(CORPUS) if e.facts.get("decode") == "instruction"]
    answers = v61.decode_many([(e.at, e.raw) for e in entries])
    off = {e.id for e, f in zip(entries, answers)
           if (f.length, f.field("disp") or (0, 0), f.field("imm") or (0, 0))
           != (e.facts["length"], tuple(e.facts.get("disp", (0, 0))), tuple(e.facts.get("imm", (0, 0))))}
    assert off == {"fact-is4-vblendvpd", "fact-is4-fma4", "fact-is4-xop-vpcmov"}


ASM = r"""
    .text
    .globl f
f:
    push %rbp
    lock incl 0x10(%rip)
    movabs 0x1122334455667788, %rax
    enter $0x10, $1
    vbroadcastss 0x10(%rip), %xmm0
    vpternlogd $0x10, %zmm1, %zmm2, %zmm3
    cmpl $0x12345678, 0x20(%rip)
    movw $0x1234, 0x40(%rbx,%rcx,4)
    crc32q (%rdi), %rax
    xbegin 1f
1:  jmp f
    call f
    ud1 (%rbx), %ecx
    pop %rbp
    ret
"""


def test_lengths_agree_with_objdump(v61, tmp_path):
    """The expectation of the kernel's own arch/x86/tools/insn_decoder_test: insn_get_length agrees
    with objdump on every instruction of an object file."""
    (tmp_path / "a.s").write_text(ASM)
    subprocess.run(["gcc", "-c", "-o", str(tmp_path / "a.o"), str(tmp_path / "a.s")], check=True)
    dump = subprocess.run(["objdump", "-d", "--insn-width=16", str(tmp_path / "a.o")], capture_output=True,
                          text=True, check=True).stdout
    raws = [bytes.fromhex(line.split("\t")[1]) for line in dump.splitlines()
            if line.startswith("  ") and line.count("\t") >= 2]
    assert len(raws) == 15
    answers = v61.decode_many([(A, r) for r in raws])
    assert [f.length for f in answers] == [len(r) for r in raws]
    assert [f.length for f in ObjdumpAdapter().decode_many([(A, r) for r in raws])] == [len(r) for r in raws]


def test_relative_branches_are_the_maps_j_operands(v61):
    """RELATIVE_BRANCHES is exactly what x86-opcode-map.txt gives a Jb/Jz operand (and xbegin)."""
    table = v61.opcode_map()
    j = set()
    for (name, op), line in table.entries.items():
        if any(" J" + k in f" {line}" for k in ("b", "z")):
            escape = {table.tables[0]: b"", table.tables[1]: b"\x0f"}.get(name)
            j.add((name, op) if escape is None else escape + bytes.fromhex(op))
    assert j == set(linux_insn.RELATIVE_BRANCHES) | {("Grp11B", "7")}


def test_versions_differ_where_the_map_changed(v61, v612):
    cmpoxadd = "c4 e2 79 e0 08"  # 6.12's map adds 'e0: CMPOXADD My,Gy,By (66),(v1),(o64)'
    assert not _facts(v61, cmpoxadd)[0].ok and _facts(v612, cmpoxadd)[0].length == 5
    rex2 = "d5 19 01 c0"  # d5 is AAD (i64) in 6.1, the REX2 prefix in 6.12
    assert _facts(v61, rex2)[0].length == 2 and _facts(v612, rex2)[0].length == 4
    assert "rex2" in _facts(v612, rex2)[1].flags
    assert v61.version().startswith("6.1.") and v612.version().startswith("6.12.")


# ------------------------------------------------------------------ errors a user meets


@pytest.mark.parametrize("name,words", [
    ("linux-insn@5.99", ["linux-source-5.99"]),
    ("linux-insn@bogus", ["linux-insn@6.1", "/path/to/linux"]),
    ("linux-insn@/nonexistent/linux", ["no kernel tree"]),
])
def test_unknown_sources_are_one_line_input_errors(name, words):
    with pytest.raises(InputError) as e:
        get_adapter(name)
    assert "\n" not in str(e.value) and all(w in str(e.value) for w in words)
    code, message = gate("--decoder", name, "--corpus", CORPUS, "--baseline", "/nonexistent/b.json",
                         "--update-baseline")
    assert code == 2 and "\n" not in message.strip()


def test_a_tree_that_is_not_a_kernel(tmp_path):
    (tmp_path / "Makefile").write_text("VERSION = 6\n")
    with pytest.raises(InputError, match="no tools/arch/x86/lib/insn.c"):
        get_adapter(f"linux-insn@{tmp_path}")


# ------------------------------------------------------------------ a patched tree, gated


def _tree(v61, path: Path) -> Path:
    """A kernel tree holding the decoder's files (a copy of what the 6.1 build read)."""
    shutil.copytree(Path(v61.build.directory) / "src", path)
    return path


def _edit_map(tree: Path, old: str, new: str, copies=("tools/arch/x86/lib", "arch/x86/lib")) -> None:
    for copy in copies:
        p = tree / copy / "x86-opcode-map.txt"
        text = p.read_text()
        assert text.count(old) == 1
        p.write_text(text.replace(old, new))


def test_a_mutated_opcode_map_fails_the_gate_and_names_the_encoding(v61, tmp_path):
    tree = _tree(v61, tmp_path / "linux")
    base = str(tmp_path / "b.json")
    name = f"linux-insn@{tree}"
    code, out = gate("--decoder", name, "--corpus", CORPUS, "--baseline", base, "--update-baseline")
    assert code == 0, out
    _edit_map(tree, "e8: CALL Jz (f64)", "e8: CALL Jb (f64)")  # rel32 read as rel8
    linux_insn.cached_adapter.cache_clear()
    code, out = gate("--decoder", name, "--corpus", CORPUS, "--baseline", base)
    assert code == 1, out
    assert "decoder change:" in out and "regression" in out
    assert "one byte opcode e8: 'CALL Jz (f64)' -> 'CALL Jb (f64)'" in out
    assert "[regression]" in out and " e8 " in out.split("[regression]", 1)[1].splitlines()[0]
    code, doc = gate("--decoder", name, "--corpus", CORPUS, "--baseline", base, "--json")
    change = json.loads(doc)["change"]
    assert code == 1 and change["counts"]["regression"]["distinct"] >= 1
    assert all(c["map_entries"] == ["one byte opcode e8"] for c in change["changes"])
    # The same edit to one copy only: the tree's two opcode maps differ, which the build refuses.
    _edit_map(tree, "e8: CALL Jb (f64)", "e8: CALL Jz (f64)", copies=("tools/arch/x86/lib",))
    linux_insn.cached_adapter.cache_clear()
    with pytest.raises(InputError, match="arch/x86/lib/x86-opcode-map.txt and tools/"):
        get_adapter(name)


def test_the_6_1_to_6_12_change_is_gated(v61, v612, tmp_path):
    base = str(tmp_path / "b61.json")
    inputs = ("--corpus", CORPUS, "--fuzz", "3000", "--seed", "0")
    assert gate("--decoder", "linux-insn@6.1", *inputs, "--baseline", base, "--update-baseline")[0] == 0
    code, out = gate("--decoder", "linux-insn@6.12", *inputs, "--baseline", base, "--json")
    doc = json.loads(out)
    change = doc["change"]
    assert code == 0 and not doc["failed"] and change["reproduced"]
    counts = change["counts"]
    assert counts["regression"]["distinct"] == 0
    assert counts["fix"]["distinct"] + counts["newly-decoded"]["distinct"] > 0
    assert change["map_entries_changed"] > 100 and change["map_entries_reached"] > 0
    assert all(c["kind"] != "regression" for c in change["changes"])
    code, text = gate("--decoder", "linux-insn@6.12", *inputs, "--baseline", base)
    assert code == 0 and "decoder change: linux-insn@6.1" in text and "change: no regression" in text


# ------------------------------------------------------------------ classification


@pytest.mark.parametrize("hexes,name", [
    ("0f b9 cc", "capstone-known-bug"),
    ("66 89 3d 10 00 00 00", "capstone-known-bug"),
    ("ea a7 08 00 01 08 00", "i64-decoded-in-64-bit-mode"),  # pvh_start_xen's .code32 far jump
    ("42 3e d2 39", "rex-before-another-prefix"),
    ("66 67 0f 38 39 97 c3 77 e1 d4", "mandatory-prefix-not-last"),
    ("f3 66 0f 52 0c da", "mandatory-prefix-not-last"),  # the CPU takes F3 (rsqrtss), the map the last, 66
    ("f3 0f 47 85 4d 2e f8 9a", "unlisted-prefix-variant"),  # rep cmova: the F3 table has no 47
    ("0f 19 25 2b d0 ab ab", "no-opcode-map-line"),  # a hint nop; the map's '19:' line is empty
    ("0f ff 00", "ud0-without-modrm"),
    ("0f 20 93 11 22 33 44", "mov-cr-dr-register-only"),
    ("8f e8 78 a2 c1 10", "amd-only-encoding"),
    ("c4 e3 79 4b c1 20", "is4-register-byte"),
    ("f0 41 ff d3", "accepts-what-the-cpu-rejects"),
    # a 66 before 67, but LOCK on setne: the CPU rejects it whatever the prefix order, so not a prefix-order row
    ("f0 66 67 0f 95 3f", "accepts-what-the-cpu-rejects"),
    ("c4 e2 79 e0 08", "newer-than-this-map"),
])
def test_classes(v61, hexes, name):
    raw = bytes.fromhex(hexes)
    unit = Unit("u", {raw: [A, 1]}, 1)
    others = [get_adapter("capstone"), get_adapter("iced")]
    from relocverify.gate import answers

    table = answers.answers([v61] + others, [(A, raw)])
    (finding,) = compare("u", unit.samples, v61, others, table)
    row = classes.classify(finding, v61.decode_detail([raw])[0], v61.opcode_map())
    assert row.name == name
    assert row.kind in (classes.KNOWN_BUG, classes.LIMITATION, classes.FINDING) and row.reason and row.kprobe


def test_measured_kernel_classes_are_rows():
    names = {c.name for c in classes.CLASSES}
    for counts in classes.MEASURED.values():
        assert set(counts) <= names


@pytest.mark.parametrize("hexes,words", [
    ("42 3e d2 39", "misbehaves: kprobes copies 2 bytes of a 4-byte instruction"),
    ("c4 e2 79 e0 08", "refuses the address"),  # 6.1's insn_decode fails: kprobes refuses
    ("0f 38 5c 1f", "#UD"),  # the kernel decodes what the CPU rejects
    ("0f b9 cc", "no misbehaviour: the length"),  # capstone's ud1: the kernel is right
    ("0f ff 00", "raises #UD whether kprobes copies 2 bytes or the 3"),  # ud0: AMD's length, Intel's
])
def test_what_a_kprobe_does_with_the_kernels_answer(v61, hexes, words):
    raw = bytes.fromhex(hexes)
    others = [get_adapter("capstone"), get_adapter("iced")]
    from relocverify.gate import answers

    table = answers.answers([v61] + others, [(A, raw)])
    (finding,) = compare("u", {raw: [A, 1]}, v61, others, table)
    assert words in classes.kprobe_effect(finding, v61.decode_detail([raw])[0])


def test_a_gate_report_is_classified_with_bytes_answers_and_kprobe(v61, tmp_path):
    code, out = gate("--decoder", "linux-insn@6.1", "--corpus", str(ROOT / "corpora" / "adversary.toml"),
                     "--fuzz", "300", "--baseline", str(tmp_path / "b.json"), "--update-baseline", "--json")
    doc = json.loads(out)
    rows = doc["linux_insn_classes"]
    assert code == 0 and rows and len(rows) == len(doc["cohorts"])
    assert {r["class"] for r in rows} <= {c.name for c in classes.CLASSES}, "every disagreement has a row"
    finding = next(r for r in rows if r["bytes"] == "48 66 01 c0")
    assert finding["class"] == "rex-before-another-prefix" and finding["kind"] == classes.FINDING
    assert finding["answers"] == {"linux-insn@6.1": "len=2 disp=- imm=- target=-",
                                  "capstone": "len=4 disp=- imm=- target=-", "iced": "len=4 disp=- imm=- target=-"}
    assert finding["kprobe"].startswith("misbehaves")
    total = doc["linux_insn_class_counts"]
    assert sum(c["distinct"] for c in total.values()) == len(rows)
    code, text = gate("--decoder", "linux-insn@6.1", "--corpus", str(ROOT / "corpora" / "adversary.toml"),
                      "--fuzz", "300", "--baseline", str(tmp_path / "b.json"))
    assert code == 0 and "rex-before-another-prefix" in text and "48 66 01 c0" in text and "kprobe: misbehaves" in text


# ------------------------------------------------------------------ real code beyond the kernel image


@pytest.mark.parametrize("version", ["6.1", "6.12"])
def test_a_foreign_elf_and_kernel_modules(v61, v612, version, tmp_path):
    """A user-space library and kernel modules go through the kernel's decoder without an internal error;
    every disagreement there has a class that is not a finding."""
    from relocverify.image.fetch import extract_modules

    modules = tmp_path / "modules"
    modules.mkdir()
    for path in extract_modules("debian-6.1-cloud", ["vsock_loopback.ko", "af_key.ko"]):
        shutil.copy(path, modules)
    libc = "/lib/x86_64-linux-gnu/libc.so.6"
    base = str(tmp_path / "b.json")
    argv = ("--decoder", f"linux-insn@{version}", "--image", libc, "--module", str(modules), "--baseline", base)
    code, out = gate(*argv, "--update-baseline", "--json")
    assert code == 0, out
    doc = json.loads(out)
    units = {u["name"] for u in doc["units"]}
    assert f"{tmp_path.name}/modules/*.ko:.text" in units and "libc.so.6:.text" in units
    assert sum(u["instructions"] for u in doc["units"] if "/modules/" in u["name"]) > 5_000
    assert all(r["kind"] != classes.FINDING for r in doc["linux_insn_classes"])
    assert gate(*argv)[0] == 0


def test_module_inputs_that_are_not_modules(tmp_path):
    (tmp_path / "empty").mkdir()
    code, message = gate("--decoder", "iced", "--module", str(tmp_path / "empty"), "--baseline",
                         str(tmp_path / "b.json"), "--update-baseline")
    assert code == 2 and "no .ko" in message
    (tmp_path / "x.ko").write_bytes(b"not an elf")
    code, message = gate("--decoder", "iced", "--module", str(tmp_path / "x.ko"), "--baseline",
                         str(tmp_path / "b.json"), "--update-baseline")
    assert code == 2 and "x.ko" in message and "\n" not in message.strip()


# ------------------------------------------------------------------ whole kernels (slow)


@pytest.mark.slow
def test_the_debian_6_1_kernel_through_linux_insn(v61, debian_kernels, tmp_path):
    """Every disagreement over the whole Debian 6.1 kernel has the class and count ``MEASURED`` keeps."""
    kernel, _ = debian_kernels("debian-6.1-cloud")
    code, out = gate("--decoder", "linux-insn@6.1", "--image", kernel.vmlinux, "--baseline",
                     str(tmp_path / "b.json"), "--update-baseline", "--json")
    assert code == 0
    got = {k: (v["distinct"], v["instructions"]) for k, v in json.loads(out)["linux_insn_class_counts"].items()}
    assert got == classes.MEASURED[("debian-6.1-cloud", "linux-insn@6.1")]
