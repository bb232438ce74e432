"""The tracer audit: models checked against the known bugs, hand-checked source rows and the kernels'
own compiled decision code; the audit's buckets; the --tracer-cmd protocol."""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path

import pytest

from relocverify.cli.main import main
from relocverify.errors import InputError
from relocverify.plan.effects import effects_from_json
from relocverify.plan.plan import DEFAULT_TRAMP
from relocverify.proof.prove import prove_effects, prove_relocation
from relocverify.tracers import get_model
from relocverify.tracers.judge import proof_key, prove_answer
from relocverify.tracers.model import Context, Emulate, Refuse, Relocate, Unmodelled, machine_of
from relocverify.x86.decode import decode


@pytest.fixture(autouse=True, scope="module")
def _sources(linux_sources):
    """The Linux models decode with the kernel's own decoder, built from the source packages."""


ROOT = Path(__file__).resolve().parent.parent
A = 0xFFFFFFFF81234560
T = DEFAULT_TRAMP
KNOWN = tomllib.loads((ROOT / "corpora" / "known_bugs.toml").read_text())
ENTRIES = {e["id"]: e for e in KNOWN["entry"]}


def _answer(model: str, hexbytes: str, tramp: int = T, context: Context = Context(), at: int = A):
    insn = decode(bytes.fromhex(hexbytes.replace(" ", "")), at)
    return insn, get_model(model).answer(insn, tramp, context)


def _verdict(model: str, hexbytes: str, tramp: int = T, context: Context = Context()):
    insn, ans = _answer(model, hexbytes, tramp, context)
    return ans, prove_answer(insn, ans, tramp, where=machine_of(get_model(model)))


def _whats(result) -> set[str]:
    return {d.what.split("[")[0] for d in result.counterexample.differences}


def _corpus_result(entry: dict):
    insn = decode(bytes.fromhex(entry["hex"].replace(" ", "")), A)
    tramp = int(entry.get("tramp", KNOWN["defaults"]["tramp"]), 16)
    if "reloc" in entry:
        return prove_relocation(insn, bytes.fromhex(entry["reloc"].replace(" ", "")), tramp)
    return prove_effects(insn, effects_from_json(entry["effects"]), tramp)


# -- 4. history: a version before the fix is wrong the same way, the fixed version agrees -----------------

#: known_bugs.toml entry -> (the version before the fix, the fixed version or None when there is none yet)
HISTORY = {
    "bug1-kprobes-jle-and": ("kprobes@5.19", "kprobes@6.1"),
    "bug1-kprobes-jg-and": ("kprobes@5.19", "kprobes@6.1"),
    "bug2-kprobes-jcc-rel8-unsigned": ("kprobes@6.2", "kprobes@6.12"),
    "bug2-kprobes-jle-rel8-unsigned": ("kprobes@6.2", "kprobes@6.12"),
    "bug3-kprobes-call-r11-ip5": ("kprobes@6.6", "kprobes@6.1"),
    "bug4-kprobes-ret-imm16": ("kprobes@6.1", None),  # c2 shares kprobe_emulate_ret in 6.1 and 6.12
    "bug5-loop-test-before-decrement": ("kprobes@6.12", None),  # (cx--) != 0 in 6.1 and 6.12
    "bug6-kinst-sib-index4-as-rsp": ("kinst", None),
    "bug6-kinst-sib-index4-disp8": ("kinst", None),
    "bug6-kinst-sib-base5-mod1-dropped": ("kinst", None),
    "bug6-kinst-sib-base5-mod0-no-disp32": ("kinst", None),
    "bug7-kinst-loop-copied": ("kinst", None),
    "bug8-kinst-disp-truncated": ("kinst", None),
    "bug9-copied-call": ("kinst@2022", "kinst"),
}


@pytest.mark.parametrize("entry_id", sorted(HISTORY))
def test_history_before_the_fix_is_refuted_like_the_corpus_and_the_fix_agrees(entry_id):
    entry = ENTRIES[entry_id]
    before, fixed = HISTORY[entry_id]
    tramp = int(entry.get("tramp", KNOWN["defaults"]["tramp"]), 16)
    ans, result = _verdict(before, entry["hex"], tramp)
    corpus = _corpus_result(entry)
    assert corpus.verdict.value == entry["verdict"] == "refuted"
    assert result.verdict.value == "refuted", result.reason
    assert result.counterexample.replayed is not False
    assert _whats(result) == _whats(corpus)  # the same counterexample class: the same state differs
    if fixed is not None:
        _, now = _verdict(fixed, entry["hex"], tramp)
        assert now.verdict.value == "proved", now.reason


def test_bug8_is_latent_with_kinst_s_own_trampoline_placement():
    """kinst allocates its trampolines above KERNBASE: in reach, the same instruction is proved, on
    FreeBSD's kernel, which enforces no IBT (kinst's absolute jump back is an indirect branch): the proof
    says so."""
    _, result = _verdict("kinst", ENTRIES["bug8-kinst-disp-truncated"]["hex"], T)
    assert result.verdict.value == "proved"
    assert any("IBT" in a for a in result.assumes)
    insn, ans = _answer("kinst", ENTRIES["bug8-kinst-disp-truncated"]["hex"], T)
    assert prove_answer(insn, ans, T).verdict.value == "unknown", "on a kernel that may enforce IBT"


def test_kinst_copies_xbegin_and_the_verdict_is_unknown_as_the_corpus_says():
    _, result = _verdict("kinst", ENTRIES["bug7-kinst-xbegin-copied"]["hex"])
    assert result.verdict.value == ENTRIES["bug7-kinst-xbegin-copied"]["verdict"] == "unknown"


#: Model answers written independently in corpora/known_bugs.toml: the models must produce them exactly.
SAME_AS_CORPUS = {
    "bug1-kprobes-jle-and": "kprobes@5.19", "bug1-kprobes-jg-and": "kprobes@5.19",
    "bug2-kprobes-jcc-rel8-unsigned": "kprobes@6.2", "bug2-kprobes-jle-rel8-unsigned": "kprobes@6.2",
    "bug3-kprobes-call-r11-ip5": "kprobes@6.6", "bug4-kprobes-ret-imm16": "kprobes@6.1",
    "bug5-loop-test-before-decrement": "kprobes@6.1", "bug6-kinst-sib-index4-as-rsp": "kinst",
    "bug6-kinst-sib-index4-disp8": "kinst", "bug6-kinst-sib-base5-mod1-dropped": "kinst",
    "bug6-kinst-sib-base5-mod0-no-disp32": "kinst", "bug7-kinst-loop-copied": "kinst",
    "bug7-kinst-xbegin-copied": "kinst", "bug8-kinst-disp-truncated": "kinst", "bug9-copied-call": "kinst@2022",
}


@pytest.mark.parametrize("entry_id", sorted(SAME_AS_CORPUS))
def test_models_write_what_the_corpus_wrote_by_hand(entry_id):
    entry = ENTRIES[entry_id]
    tramp = int(entry.get("tramp", KNOWN["defaults"]["tramp"]), 16)
    _, ans = _answer(SAME_AS_CORPUS[entry_id], entry["hex"], tramp)
    if "reloc" in entry:
        assert isinstance(ans, Relocate) and ans.code.hex() == entry["reloc"].replace(" ", "")
    else:
        got = [(type(e).__name__, e) for e in ans.effects]
        want = list(effects_from_json(entry["effects"]))
        assert isinstance(ans, Emulate) and len(got) == len(want)
        for (_, g), w in zip(got, want):
            if hasattr(w, "value") and hasattr(w.value, "address"):  # a load: compare what it addresses
                ga, wa = g.value.address, w.value.address
                assert sorted(filter(None, (ga.base, ga.index))) == sorted(filter(None, (wa.base, wa.index)))
                assert (ga.disp, ga.scale if ga.index and ga.base else 1) == (wa.disp, wa.scale if wa.index and wa.base
                                                                              else 1) or ga == wa
            else:
                assert g == w


def test_fasttrap_loop_and_rax_scratch_are_refuted_like_the_corpus():
    _, loop = _verdict("fasttrap", ENTRIES["bug5-loop-test-before-decrement"]["hex"])
    assert loop.verdict.value == "refuted" and _whats(loop) == {"rip"}
    ans, cmpxchg = _verdict("fasttrap", ENTRIES["fasttrap-scratch-rax-cmpxchg"]["hex"])
    assert ans.fixup.startswith("ripmode: %rax") and cmpxchg.verdict.value == "refuted"
    assert _corpus_result(ENTRIES["fasttrap-scratch-rax-cmpxchg"]).verdict.value == "refuted"


# -- cited rows: hand-checked decisions, each with its source line -----------------------------------

ROWS = [
    # (model, bytes, context sites, expected kind, what the reason or answer must say, source)
    ("kinst", "9d", (), "refuse", "popf/sti", "kinst_isa.c kinst_make_probe: instrsize == 1 && KINST_POPF"),
    ("kinst", "fb", (), "refuse", "popf/sti", "kinst_isa.c kinst_make_probe: KINST_STI"),
    ("kinst", "e3 10", (), "refuse", "jrcxz", "kinst_isa.c kinst_instr_dissect: case 0xe3: return (EINVAL)"),
    ("kinst", "eb 10", (), "relocate", "e9", "kinst_isa.c: template[opcidx] = 0xe9; tinstlen = 5; disp -= 3"),
    ("kinst", "74 10", (), "relocate", "0f84", "kinst_isa.c: template = 0x0f, bytes[opcidx] + 0x10; tinstlen 6"),
    ("kinst", "e8 00 01 00 00", (), "emulate", "push", "kinst_isa.c kinst_invop: KINST_F_DIRECT_CALL"),
    ("kprobes@6.1", "cc", (), "refuse", "int3", "core.c __copy_instruction: INT3_INSN_OPCODE"),
    ("kprobes@6.1", "8e d0", (), "refuse", "insn_masking_exception", "core.c __copy_instruction"),
    ("kprobes@6.1", "ff 14 24", (), "refuse", "memory", "core.c prepare_emulation: X86_MODRM_MOD(opcode) != 3"),
    ("kprobes@6.1", "ff 1c 24", (), "refuse", "far", "core.c prepare_emulation: far call"),
    ("kprobes@6.1", "0f 01 c1", (), "refuse", "VM extensions", "core.c prepare_emulation: 0f 01 reg 0 mod 3"),
    ("kprobes@6.1", "0f 0b", (), "relocate", "resume_singlestep", "6.1 can_probe has no is_exception_insn"),
    ("kprobes@6.12", "0f 0b", (), "refuse", "INT and UD", "6.12 core.c can_probe: is_exception_insn"),
    ("kprobes@6.1", "90", ("kprobe_blacklist",), "refuse", "within_kprobe_blacklist", "kernel/kprobes.c"),
    ("kprobes@6.1", "e8 00 01 00 00", ("fentry",), "refuse", "ftrace", "kernel/kprobes.c check_ftrace_location"),
    ("kprobes@6.1", "fa", (), "unmodelled", "ifmodifiers", "core.c prepare_emulation: cli -> ifmodifiers"),
    ("uprobes@6.1", "f0 ff 05 10 00 00 00", (), "refuse", "is_prefix_bad", "uprobes.c is_prefix_bad: LOCK"),
    ("uprobes@6.1", "66 e8 10 00 90 90 90", (), "refuse", "66 prefix", "uprobes.c branch_setup_xol_ops: p == 0x66"),
    ("uprobes@6.1", "41 55", (), "emulate", "push", "uprobes.c push_setup_xol_ops: rex 0x41"),
    ("uprobes@6.1", "0f 05", (), "relocate", "", "uprobes.c: good_insns_64[0x0f] = 1 lets every 0f xx through"),
    ("uprobes@6.1", "f4", (), "refuse", "good_insns", "uprobes.c good_insns_64: f4 (hlt) is 0"),
    ("fasttrap", "cd 80", (), "refuse", "int", "fasttrap_isa.c fasttrap_tracepoint_init: FASTTRAP_INT"),
    ("fasttrap", "55", (), "emulate", "push", "fasttrap_isa.c: FASTTRAP_PUSHL_EBP"),
]


@pytest.mark.parametrize("model,hexbytes,sites,kind,says,source", ROWS)
def test_cited_rows(model, hexbytes, sites, kind, says, source):
    _, ans = _answer(model, hexbytes, context=Context(sites=sites))
    assert ans.kind == kind, (ans, source)
    text = json.dumps(ans.as_json())
    assert says.lower() in text.lower(), (text, source)


def test_kprobes_can_probe_boundary_is_a_refusal():
    _, ans = _answer("kprobes@6.1", "90", context=Context(boundary=False))
    assert isinstance(ans, Refuse) and "can_probe" in ans.cite.function


# -- model findings, pinned (docs/audit.md; model findings until confirmed on a running kernel) ---------

def test_kprobes_emulates_vex_opcode_7f_as_a_jcc():
    """prepare_emulation switches on insn->opcode.bytes[0], which for c5 79 7f f2 (vmovdqa) is 0x7f."""
    ans, _ = _verdict("kprobes@6.1", "c5 79 7f f2")
    assert isinstance(ans, Emulate) and ans.effects[0].cond == "g"
    assert ans.effects[0].taken == ans.effects[0].fallthrough == A + 4  # the move is skipped
    ans, result = _verdict("kprobes@6.1", "c5 fa 7f 07")  # vmovdqu %xmm0, (%rdi): the store never happens
    assert isinstance(ans, Emulate) and result.verdict.value == "refuted" and "mem" in _whats(result)


def test_kprobes_pushes_a_plus_5_for_a_prefixed_call():
    """int3_emulate_call pushes ip - 1 + CALL_INSN_SIZE: a 6-byte cs call returns into its own last byte."""
    ans, result = _verdict("kprobes@6.1", "2e e8 00 01 00 00")
    assert ans.effects[0].value.value == A + 5 and result.verdict.value == "refuted"


def test_uprobes_emulates_xchg_r8_eax_as_a_nop():
    ans, result = _verdict("uprobes@6.1", "41 90")
    assert isinstance(ans, Emulate) and result.verdict.value == "refuted"
    _, fasttrap = _verdict("fasttrap", "41 90")  # fasttrap checks REX.B for exactly this
    assert fasttrap.verdict.value == "proved"


def test_fasttrap_reads_a_disp32_past_a_sib_without_one():
    insn = decode(bytes.fromhex("ff14c3"), A)
    model = get_model("fasttrap")
    assert model.reads_past(insn.raw)
    ans = model.answer(insn, T, Context(stream=bytes.fromhex("ff14c3" + "10000000" + "90" * 8)))
    assert ans.effects[0].value.address.disp == 0x10
    assert prove_answer(insn, ans, T).verdict.value == "refuted"


# -- 2. the kernels' own decision code, compiled, against the models --------------------------------

def _samples() -> list[tuple[int, bytes]]:
    """Every one-byte opcode and every 0f xx opcode, with a RIP-relative ModRM, a register ModRM and
    an immediate after, and under the prefixes the models branch on; plus VEX forms."""
    tails = [b"\x05\x10\x00\x00\x00\x7f" + b"\x90" * 8, b"\xc0\x7f" + b"\x90" * 12, b"\x44\x24\x08\x01" + b"\x90" * 8,
             b"\xd3" + b"\x90" * 12, b"\xe1" + b"\x90" * 12]  # the last two: ff /2 and ff /4 through a register
    out = []
    for prefix in (b"", b"\x66", b"\x41", b"\x48", b"\x2e", b"\xf0", b"\x67", b"\x4d"):
        for op in range(256):
            for tail in tails:
                out.append((A, prefix + bytes([op]) + tail))
                out.append((A, prefix + b"\x0f" + bytes([op]) + tail))
    for vex in (b"\xc5\xf9", b"\xc5\x79", b"\xc4\xe2\x79", b"\xc4\x62\x63"):
        for op in range(256):
            out.append((A, vex + bytes([op]) + tails[0]))
    return [(a, raw[:15]) for a, raw in out]


@pytest.mark.parametrize("spec", ["6.1", "6.12"])
def test_models_decide_as_the_compiled_kernel_code(spec):
    from relocverify.tracers.compiled import EMULATORS, compare, compare_emulation, compare_xol

    result = compare(spec, _samples(), T)
    for name, r in result.items():
        assert r["checked"] > 100, name
        assert r["differ"] == 0, (name, r["examples"])
    emulation = compare_emulation(spec, _samples(), T)
    assert emulation["checked"] > 1000 and emulation["differ"] == 0, emulation["examples"]
    assert set(emulation["by_emulator"]) == set(EMULATORS)
    xol = compare_xol(spec, _samples())
    assert xol["checked"] > 1000 and xol["differ"] == 0, xol["examples"]
    assert xol["emulated"]["branch"] > 0 and xol["emulated"]["push"] > 0
    # far away, the displacement no longer fits: both refuse
    far = compare(spec, [(A, bytes.fromhex("488b0510000000"))], 0xFFFFC90000001000)
    assert far["__copy_instruction disp"] == {"checked": 1, "differ": 0, "examples": []}


@pytest.mark.parametrize("spec", ["6.1", "6.12"])
def test_the_compiled_kernel_code_makes_the_model_findings_decisions(spec):
    """The findings of docs/audit.md, decided by the kernel's own prepare_emulation and
    branch_setup_xol_ops compiled from the source package (not by the Python models)."""
    from relocverify.tracers.compiled import EMULATORS, emulation_decisions

    vex, cs_call = emulation_decisions(spec, [(A, bytes.fromhex("c5fa7f07")), (A, bytes.fromhex("2ee800010000"))])
    assert vex[0] == 0 and vex[1] == EMULATORS["kprobe_emulate_jcc"] and vex[3] == 0xF  # vmovdqu taken for jg (cc 0xf)
    assert cs_call[1] == EMULATORS["kprobe_emulate_call"]  # which pushes ip - 1 + CALL_INSN_SIZE = A + 5
    from relocverify.tracers.compiled import xol_library
    import array
    import ctypes

    raws = [bytes.fromhex("c5fa7f07"), bytes.fromhex("4190")]
    out = (ctypes.c_int32 * 10)()
    offsets = array.array("i", [0, 4])
    xol_library(spec).tc_xol(b"".join(raws), offsets.buffer_info()[0], bytes([4, 2]), 2, out)
    assert list(out)[0:2] == [0, 1] and list(out)[3] == 0x7F  # uprobes: a branch_xol_ops "jg"
    assert list(out)[5:7] == [0, 1] and list(out)[8] == 0x90  # uprobes: xchg %eax,%r8d as a nop


# -- shared proofs ------------------------------------------------------------------------------------

def test_a_tracer_relocation_identical_to_our_plan_shares_its_key():
    from relocverify.plan.plan import make_plan
    from relocverify.proof.cache_key import cache_key

    insn, ans = _answer("kprobes@6.1", "48 8b 05 10 00 00 00")
    assert proof_key(insn, ans, T) == cache_key(insn, make_plan(insn, T))
    insn, kin = _answer("kinst", "48 8b 05 10 00 00 00")
    assert proof_key(insn, kin, T) != proof_key(insn, ans, T)  # kinst jumps back absolutely: other bytes


# -- 1, 3. the audit over an image --------------------------------------------------------------------

AUDIT_ASM = """
    .section .text, "ax"
    .globl f_a
    .type f_a, @function
f_a:
    push %rbp
    mov 0x10(%rip), %rax
    loop f_a
    vmovdqu %xmm0, (%rdi)
    .byte 0x2e
    call f_b
    lock incl 0x20(%rip)
    call *(%rsp)
    pop %rbp
    ret
    .size f_a, .-f_a
    .globl f_b
    .type f_b, @function
f_b:
    xor %eax, %eax
    jle 1f
    nop
1:  ret
    .size f_b, .-f_b
"""
AUDIT_LDS = """
SECTIONS {
  . = 0xffffffff81000000;
  .text : { *(.text) }
  /DISCARD/ : { *(.note.gnu.property) *(.comment) }
}
"""


@pytest.fixture()
def audited(tmp_path):
    import elfbuild

    image = elfbuild.build_elf(tmp_path, AUDIT_ASM, AUDIT_LDS)
    out = tmp_path / "summary.json"
    args = ["audit", str(image), "--db", str(tmp_path / "s.sqlite"), "--summary-json", str(out), "--no-progress",
            "--jobs", "1", "--cache-dir", str(tmp_path / "cache")]
    for t in ("kprobes@6.1", "kprobes@6.12", "uprobes@6.1", "kinst", "fasttrap"):
        args += ["--tracer", t]
    code = main(args, out=open(os.devnull, "w"), err=sys.stderr)
    return code, json.loads(out.read_text()), args, tmp_path


def test_every_instruction_in_exactly_one_bucket_per_tracer(audited):
    code, summary, _, _ = audited
    assert code == 1  # tracer-wrong findings
    n = summary["instructions"]
    assert n == 13
    for name, t in summary["tracers"].items():
        assert t["instructions"] == n and sum(t["buckets"].values()) == n and t["totals_add_up"], name
        assert sum(g["count"] for b in t["groups"].values() for g in b) == n
    kp = summary["tracers"]["kprobes@6.1"]
    wrong = {g["group"].split(" via ")[0] for g in kp["groups"]["tracer-wrong"]}
    assert {"loop", "vmovdqu", "call"} <= wrong
    for g in kp["groups"]["tracer-wrong"]:
        assert g["detail"]["counterexample"]["replay"].startswith("relocverify replay")
    kinst = summary["tracers"]["kinst"]
    assert any(g["group"].startswith("call via kinst_invop") for g in kinst["groups"]["tracer-wrong"])
    assert kinst["buckets"]["tracer-refuses-provable"] == 0
    assert summary["tracers"]["uprobes@6.1"]["buckets"]["tracer-refuses-provable"] >= 1  # lock incl: is_prefix_bad


def test_a_warm_audit_proves_nothing_and_answers_the_same(audited):
    _, first, args, tmp_path = audited
    out = tmp_path / "again.json"
    args = args[:args.index("--summary-json") + 1] + [str(out)] + args[args.index("--summary-json") + 2:]
    main(args, out=open(os.devnull, "w"), err=sys.stderr)
    again = json.loads(out.read_text())
    assert again["counts"]["proofs_made"] == 0
    assert {n: t["buckets"] for n, t in again["tracers"].items()} == {n: t["buckets"] for n, t in
                                                                     first["tracers"].items()}


# -- 6. --tracer-cmd --------------------------------------------------------------------------------

def test_an_external_tracer_is_audited_like_a_model(audited, tmp_path):
    _, _, args, _ = audited
    cmd = f"{sys.executable} {ROOT / 'docs' / 'example_tracer.py'}"
    out = tmp_path / "ext.json"
    base = args[:args.index("--tracer")]
    code = main(base[:base.index("--summary-json") + 1] + [str(out)] + base[base.index("--summary-json") + 2:]
                + ["--tracer-cmd", cmd], out=open(os.devnull, "w"), err=sys.stderr)
    t = json.loads(out.read_text())["tracers"][f"cmd:{cmd}"]
    assert code == 1 and t["totals_add_up"]
    assert any(g["group"].startswith("loop") for g in t["groups"]["tracer-wrong"])  # copied verbatim
    assert any("calls are not traced" in g["group"] for g in t["groups"]["tracer-refuses-provable"])


def test_tracer_cmd_protocol_hygiene(tmp_path):
    from relocverify.tracers.external import ExternalTracer

    insn = decode(b"\x90", A)
    stall = tmp_path / "stall.py"
    stall.write_text("import time, sys\nsys.stdin.readline()\ntime.sleep(30)\n")
    with pytest.raises(InputError, match="--tracer-cmd.*stalls"):
        ExternalTracer(f"{sys.executable} {stall}", answer_seconds=1).answer(insn, T)
    flood = tmp_path / "flood.py"
    flood.write_text("import sys\nsys.stdin.read()\nfor _ in range(10): print('refuse x')\n")
    with pytest.raises(InputError, match="floods"):
        ExternalTracer(f"{sys.executable} {flood}").answer(insn, T)
    garbage = tmp_path / "garbage.py"
    garbage.write_text("import sys\nfor line in sys.stdin: print('maybe?')\n")
    assert isinstance(ExternalTracer(f"{sys.executable} {garbage}").answer(insn, T), Unmodelled)
    with pytest.raises(InputError, match="cannot be started"):
        ExternalTracer("/nonexistent/tracer").answer(insn, T)


def test_audit_without_a_tracer_is_a_usage_error(tmp_path):
    assert main(["audit", "--db", str(tmp_path / "x.sqlite")], out=open(os.devnull, "w"),
                err=open(os.devnull, "w")) == 2


# -- the whole Debian 6.1 kernel (slow) ------------------------------------------------------------

@pytest.mark.slow
def test_whole_kernel_models_decide_as_the_compiled_code(debian_kernels):
    from relocverify.image.functions import find_functions, iter_instruction_spans
    from relocverify.image.loader import load_image
    from relocverify.tracers.compiled import compare, compare_emulation, compare_optprobes, compare_xol

    kernel, _ = debian_kernels("debian-6.1-cloud")
    image = load_image(kernel.vmlinux)
    items = []
    for f in find_functions(image):
        for address, raw in iter_instruction_spans(image, f):
            items.append((address, raw))
    result = compare("6.1", items, T)
    assert all(r["differ"] == 0 for r in result.values()), result
    assert compare_emulation("6.1", items, T)["differ"] == 0
    assert compare_xol("6.1", items)["differ"] == 0
    assert compare_optprobes("6.1", items)["differ"] == 0


def test_the_report_has_a_tracer_page_with_the_counterexamples(audited):
    _, summary, args, tmp_path = audited
    out = tmp_path / "report"
    assert main(["report", str(tmp_path / "s.sqlite"), "-o", str(out)], out=open(os.devnull, "w"),
                err=sys.stderr) == 0
    page = (out / "tracers.html").read_text()
    assert 'href="tracers.html"' in (out / "index.html").read_text()
    for name, t in summary["tracers"].items():
        assert name in page
    assert "relocverify replay --orig" in page and "tracer-wrong" in page
    assert "<script" not in page  # static: the report's CSP allows no inline script


def test_a_user_space_elf_is_audited_with_the_user_policy(tmp_path):
    import elfbuild

    image = elfbuild.build_elf(tmp_path, AUDIT_ASM, AUDIT_LDS.replace("0xffffffff81000000", "0x401000"))
    out = tmp_path / "user.json"
    code = main(["audit", str(image), "--db", str(tmp_path / "u.sqlite"), "--summary-json", str(out),
                 "--no-progress", "--jobs", "1", "--cache-dir", str(tmp_path / "cache"), "--tracer", "uprobes@6.1",
                 "--tracer", "fasttrap"], out=open(os.devnull, "w"), err=sys.stderr)
    summary = json.loads(out.read_text())
    assert code == 1 and summary["image"]["policy"] == "user" and summary["instructions"] == 13
    assert int(summary["tramp"], 16) >= 0x401000 + (1 << 20)  # a page past the image, as uprobes' XOL area
    assert all(t["totals_add_up"] for t in summary["tracers"].values())
    fasttrap = summary["tracers"]["fasttrap"]
    assert any(g["group"].startswith("loop") for g in fasttrap["groups"]["tracer-wrong"])  # (cx--) != 0


def test_an_external_tracer_is_remembered_by_its_content(tmp_path):
    """Issue 44: --tracer-cmd answers were kept under the command line alone, so an edited tracer was
    reported with the old one's answers."""
    import sys

    from relocverify.tracers.external import content_tag

    script = tmp_path / "tracer.py"
    script.write_text("print('refuse one')\n")
    command = f"{sys.executable} {script}"
    before = content_tag(command)
    assert content_tag(command) == before
    script.write_text("print('refuse two')\n")
    assert content_tag(command) != before


def _fn(name: str, body: str) -> str:
    return f"""
    .globl {name}
    .type {name}, @function
{name}:
{body}
    .size {name}, .-{name}
"""


def _emulated_cpuid(prefix: str) -> str:
    return _fn("f_xen", f'    ud2\n    .ascii "{prefix}"\n    cpuid\n    ret')  # an emulate prefix, then cpuid


_BUG = _fn("f_bug", "    ud2\n    nop\n    nop\n    nop\n    ret")  # a BUG()'s ud2: the same instance key


@pytest.mark.parametrize("jobs,prefix", [("1", "xen"), ("2", "xen"), ("1", "kvm"), ("2", "kvm")])
def test_a_ud2_the_kernel_decoder_reads_with_the_bytes_after_it_is_judged_by_them(tmp_path, jobs, prefix):
    """Linux's decoder reads "ud2; .ascii xen" (or "kvm") as an emulate prefix of the next instruction
    (``linux_facts.EMULATE_PREFIXES``): such a ud2 shares its instance key with every other ud2, yet the Linux
    tracers answer it otherwise.  Each is judged by its own bytes, whichever the audit meets first (the two
    functions in both orders)."""
    import elfbuild

    answers = {}
    emulated = _emulated_cpuid(prefix)
    for order, body in (("emulated-first", emulated + _BUG), ("bug-first", _BUG + emulated)):
        d = tmp_path / order
        d.mkdir()
        image = elfbuild.build_elf(d, '    .section .text, "ax"\n' + body, AUDIT_LDS)
        out = d / "s.json"
        args = ["audit", str(image), "--db", str(d / "s.sqlite"), "--summary-json", str(out), "--no-progress",
                "--jobs", jobs, "--cache-dir", str(d / "cache"), "--tracer", "kprobes@6.1", "--tracer", "kprobes@6.12"]
        main(args, out=open(os.devnull, "w"), err=sys.stderr)
        for tracer, tally in json.loads(out.read_text())["tracers"].items():
            for bucket, groups in tally["groups"].items():
                for g in groups:
                    for e in g["examples"]:
                        if e["function"] in ("f_xen+0x0", "f_bug+0x0"):
                            answers.setdefault((tracer, e["function"]), set()).add((order, bucket, g["group"]))
    for tracer in ("kprobes@6.1", "kprobes@6.12"):
        xen = {(b, g) for _, b, g in answers[(tracer, "f_xen+0x0")]}
        bug = {(b, g) for _, b, g in answers[(tracer, "f_bug+0x0")]}
        assert len(xen) == 1 and len(bug) == 1, (tracer, answers)  # the same in both orders
        assert "force-emulate prefixed" in next(iter(xen))[1] and xen != bug, (tracer, xen, bug)
