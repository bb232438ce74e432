"""docs/findings: each reproduced group's real bytes, the tracer before and after its patch.

The bytes are the sites ``relocverify confirm`` reproduced on Debian 6.1.187 (docs/audit.md), read
from the package: the vmlinux (System.map addresses), module sha256-ssse3.ko (symbol offsets; the
module's load address does not enter these decisions, a module-space address stands for it) and the
static ``strlen`` trigger (glibc's ``__strlen_avx2``).  The patched decisions come from the models
(``tracers.findings``) and from the kernel's own code patched and compiled (``findings.library``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from relocverify.errors import InputError
from relocverify.plan.plan import DEFAULT_TRAMP as T
from relocverify.proof.verdict import Verdict
from relocverify.tracers import findings, get_model
from relocverify.tracers.compiled import EMULATORS
from relocverify.tracers.judge import prove_answer, replay_unconfirmed
from relocverify.tracers.model import Emulate, Refuse, Relocate, machine_of
from relocverify.x86.decode import decode

FINDINGS = Path(__file__).resolve().parent.parent / "docs" / "findings"
MODULE = 0xFFFFFFFFC0201000  # sha256-ssse3.ko's .text, laid out in module space

#: (patch, tracer, where, address, bytes): the reproduced sites, held-out ones included.
SITES = (
    ("01", "kprobes", "dcache_readdir+0x8f", 0xFFFFFFFF81381A4F, "2ee82bfea700"),
    ("01", "kprobes", "proc_pident_readdir+0x171", 0xFFFFFFFF813EE231, "2ee84936a100"),
    ("01", "kprobes", "kernfs_fop_readdir+0x1e8", 0xFFFFFFFF813FD1B8, "2ee8c246a000"),
    ("02", "kprobes", "sha256_transform_rorx+0xd8", MODULE + 0xD8, "c57d7f0c3c"),
    ("02", "kprobes", "sha256_transform_rorx+0x1cc", MODULE + 0x1CC, "c5fd70d7fa"),
    ("02", "kprobes", "sha256_transform_avx+0xa6", MODULE + 0x10A6, "c5797f4c2410"),
    ("03", "kprobes", "startup_64+0x41", 0xFFFFFFFF81000041, "48cb"),
    ("05", "uprobes", "__strlen_avx2+0x19", 0x401019, "c5fd740f"),
    ("05", "uprobes", "__strlen_avx2+0x84", 0x401084, "c5fd744f01"),
)


def _judged(name: str, address: int, hexbytes: str):
    insn = decode(bytes.fromhex(hexbytes), address)
    model = get_model(name)
    answer = model.answer(insn, T)
    result = prove_answer(insn, answer, T, where=machine_of(model))
    return answer, (None if result is None else replay_unconfirmed(insn, answer, result))


@pytest.mark.parametrize("patch,tracer,where,address,hexbytes", SITES, ids=[s[2] for s in SITES])
def test_the_site_is_wrong_before_its_patch_and_right_after(patch, tracer, where, address, hexbytes):
    before, verdict = _judged(f"{tracer}@6.1", address, hexbytes)
    assert isinstance(before, Emulate) and verdict.verdict is not Verdict.PROVED
    after, fixed = _judged(f"{tracer}@6.1+findings", address, hexbytes)
    if patch == "03":  # lret: refused, as far call and far jmp are
        assert isinstance(after, Refuse) and after.reason.startswith("-EOPNOTSUPP")
    elif patch == "01":  # still emulated, the return address now A+6
        assert isinstance(after, Emulate) and fixed.verdict is Verdict.PROVED
        assert after.effects[0].value.value == address + 6 and before.effects[0].value.value == address + 5
    else:  # VEX: single-stepped (kprobes) or copied out of line (uprobes), no longer a branch
        assert isinstance(after, Relocate) and fixed.verdict is Verdict.PROVED


def test_a_cs_call_and_a_vex_store_are_refuted_before_their_patch():
    """Two of the groups the judge refutes outright (the others are unknown on unicorn's ymm registers, or
    need the CPU): the pushed return address, and the store the emulated 'jg' skips."""
    _, call = _judged("kprobes@6.1", 0xFFFFFFFF81381A4F, "2ee82bfea700")
    _, store = _judged("kprobes@6.1", MODULE + 0x10A6, "c5797f4c2410")
    assert call.verdict is Verdict.REFUTED and store.verdict is Verdict.REFUTED


def test_the_patched_kernel_code_decides_as_the_patched_models():
    items = [(a, bytes.fromhex(h)) for _, _, _, a, h in SITES] + [
        (0xFFFFFFFF81000040, bytes.fromhex("50")), (0xFFFFFFFF81000000, bytes.fromhex("e800000000")),
        (0xFFFFFFFF81000000, bytes.fromhex("c3")), (0xFFFFFFFF81000000, bytes.fromhex("7405")),
        (0xFFFFFFFF81000000, bytes.fromhex("0f8400010000"))]
    result = findings.compare("6.1", items, T)
    assert all(r["differ"] == 0 for r in result.values()), result
    assert result["kprobe_emulate_call"]["checked"] == 4  # three cs calls and the plain call


def test_the_patches_change_what_the_compiled_kernel_code_decides():
    """The unpatched and patched C, compiled from linux-source-6.1, on the groups' bytes."""
    cs = (0xFFFFFFFF81381A4F, bytes.fromhex("2ee82bfea700"))
    vex = (MODULE + 0xD8, bytes.fromhex("c57d7f0c3c"))
    lret = (0xFFFFFFFF81000041, bytes.fromhex("48cb"))
    old_cs, old_vex, old_lret = findings.kprobes_decisions("6.1", [cs, vex, lret], apply=False)
    new_cs, new_vex, new_lret = findings.kprobes_decisions("6.1", [cs, vex, lret], apply=True)
    assert (old_cs.call_pushed, new_cs.call_pushed) == (cs[0] + 5, cs[0] + 6)  # 01
    assert old_cs.call_ip == new_cs.call_ip == cs[0] + 6 + 0xA7FE2B
    assert old_vex.emulator == EMULATORS["kprobe_emulate_jcc"] and old_vex.byte == 0xF  # "jg"
    assert (new_vex.ret, new_vex.emulator) == (0, 0)  # 02: single-stepped
    assert old_lret.emulator == EMULATORS["kprobe_emulate_ret"] and new_lret.ret == -95  # 03: -EOPNOTSUPP
    assert old_lret.can_boost and not new_lret.can_boost  # 04: not copied into an optimized probe
    strlen = bytes.fromhex("c5fd740f")
    (old,) = findings.uprobes_decisions("6.1", [strlen], apply=False)
    (new,) = findings.uprobes_decisions("6.1", [strlen], apply=True)
    assert old[:2] == (0, 1) and old[3] == 0x74  # branch_xol_ops "je"
    assert new[:2] == (-38, 0)  # 05: -ENOSYS, the default single-step


def test_optprobes_patched_never_copies_a_far_return():
    kp, fixed = get_model("kprobes@6.1"), get_model("kprobes@6.1+findings")
    from relocverify.tracers import linux_facts as lf

    d = lf.insn_of("6.1", bytes.fromhex("48cb"))
    assert kp.can_boost(d, bytes.fromhex("48cb")) and not fixed.can_boost(d, bytes.fromhex("48cb"))
    assert get_model("optprobes@6.1+findings").kprobes is fixed


def _patch_lines(text: str, sign: str) -> list[str]:
    return [line[1:] for line in text.splitlines() if line.startswith(sign) and not line.startswith(sign * 3)]


@pytest.mark.parametrize("edit", findings.EDITS, ids=[e.patch for e in findings.EDITS])
def test_each_patch_file_makes_the_edit_the_models_are_checked_against(edit):
    """The patch sent upstream and the edit compiled here are the same change: every line the edit adds is
    a '+' line of the patch, every line it removes a '-' line."""
    text = (FINDINGS / edit.patch).read_text()
    assert re.search(r"^--- a/" + re.escape(edit.file) + "$", text, re.M)
    old, new = edit.old[0].splitlines(), edit.new[0].splitlines()
    added = [line for line in new if line not in old]
    removed = [line for line in old if line not in new]
    assert added and set(added) <= set(_patch_lines(text, "+")), edit.patch
    assert set(removed) <= set(_patch_lines(text, "-")), edit.patch


def test_a_source_the_patch_does_not_fit_is_one_clear_error():
    with pytest.raises(InputError, match="no single place in prepare_emulation"):
        findings.patched("static int prepare_emulation(struct kprobe *p) { return 0; }", "prepare_emulation")


@pytest.mark.slow
def test_whole_kernel_patched_models_decide_as_the_patched_compiled_code(debian_kernels):
    from relocverify.image.functions import find_functions, iter_instruction_spans
    from relocverify.image.loader import load_image

    kernel, _ = debian_kernels("debian-6.1-cloud")
    image = load_image(kernel.vmlinux)
    items = [(address, raw) for f in find_functions(image) for address, raw in iter_instruction_spans(image, f)]
    result = findings.compare("6.1", items, T)
    assert all(r["differ"] == 0 for r in result.values()), result
