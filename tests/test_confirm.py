"""``relocverify confirm``: the guest's archive, its console read back, the outcome decided from two boots,
and the user's mistakes (one line, exit 2).  The tests marked slow boot the Debian 6.1 cloud kernel under
QEMU (TCG) for real: one reproduces the cs-prefixed retpoline call group, one is a control the audit
calls agree, and a trigger that hangs or floods the console is refused with no guest left running."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess

import pytest

from relocverify.cli import main
from relocverify.confirm import initramfs
from relocverify.confirm.console import read_console
from relocverify.confirm.outcome import Outcome, Run, Site, decide
from relocverify.confirm.probe import Probe, hits, optimized
from relocverify.confirm.script import RunPlan, run_script
from relocverify.confirm.triggers import BY_NAME, PROGRAMS, TRIGGERS, for_group

A = 0xffffffff81381a4f  # dcache_readdir+0x8f in Debian 6.1.187 cloud: 2e e8 (cs call __x86_indirect_thunk_r10)
CS_CALL = bytes.fromhex("2ee82bfea700")


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def one_line_error(code: int, err: str, *words: str) -> None:
    assert code == 2, (code, err)
    assert err.count("\n") == 1 and err.startswith("relocverify: error: "), err
    for w in words:
        assert w in err, err


# -- the initramfs ------------------------------------------------------------------------------------

def _newc_names(data: bytes) -> list[tuple[str, int, bytes]]:
    """(name, mode, data) of each member, read as the kernel's init/initramfs.c reads newc."""
    out, pos = [], 0
    while True:
        assert data[pos:pos + 6] == b"070701"
        fields = [int(data[pos + 6 + 8 * i:pos + 14 + 8 * i], 16) for i in range(13)]
        namesize, filesize, mode = fields[11], fields[6], fields[1]
        name = data[pos + 110:pos + 110 + namesize - 1].decode()
        pos = (pos + 110 + namesize + 3) // 4 * 4
        body = data[pos:pos + filesize]
        pos = (pos + filesize + 3) // 4 * 4
        if name == "TRAILER!!!":
            return out
        out.append((name, mode, body))


def test_the_archive_reads_back_as_written_and_as_cpio_reads_it(tmp_path):
    entries = [initramfs.directory("rv"), initramfs.file("rv/run.sh", b"echo hi\n"),
               initramfs.file("rv/odd", b"x" * 5, 0o644), initramfs.symlink("bin/sh", "busybox")]
    data = initramfs.archive(entries)
    assert len(data) % 512 == 0
    assert _newc_names(data) == [("rv", 0o040755, b""), ("rv/run.sh", 0o100755, b"echo hi\n"),
                                 ("rv/odd", 0o100644, b"xxxxx"), ("bin/sh", 0o120777, b"busybox")]
    assert initramfs.archive(entries) == data  # the same entries, the same bytes
    if shutil.which("cpio"):
        listed = subprocess.run(["cpio", "-it", "--quiet"], input=data, capture_output=True, check=True).stdout
        assert listed.decode().split() == ["rv", "rv/run.sh", "rv/odd", "bin/sh"]


# -- the console ----------------------------------------------------------------------------------------

def console_text(*, live="2ee82bfea700", placed="0", listing="ffffffff81381a4f  k  dcache_readdir+0x8f",
                 profile="site 1 0", trigger="exit 0 digest 57b0080fda4a98cc bytes 15216 lines 40",
                 out=("readdir /: 10: . .. bin",), fault=(), end=True, probe=True) -> str:
    lines = ["SeaBIOS", "RVC:up 2.95 0.00", "RVC:phase begin 2.95 0.00", f"RVC:live {A:#x} {live}",
             "RVC:phase probe 2.97 0.00"]
    if probe:
        lines += ["RVC:write /proc/sys/debug/kprobes-optimization 0", "RVC:probe site"]
        if placed == "0":
            lines.append("RVC:write /sys/kernel/tracing/kprobe_events 0")
        else:
            lines += [f"RVC:write /sys/kernel/tracing/kprobe_events {placed} EILSEQ: Invalid or incomplete "
                      f"multibyte or wide character",
                      "RVC:errlog [    2.97] trace_kprobe: error: Probe point is not an instruction boundary"]
        lines += [f"RVC:list {listing}", f"RVC:live {A:#x} cc{live[2:]}"]
    lines.append("RVC:phase trigger")
    lines += [f"RVC:out {line}" for line in out]
    lines += list(fault)
    if trigger is not None:
        lines.append(f"RVC:trigger {trigger}")
    lines.append("RVC:phase after")
    if probe:
        lines.append(f"RVC:profile   {profile}")
    if end:
        lines.append("RVC:phase end")
    return "\r\n".join(lines) + "\r\n"


OOPS = ("[    3.114992] BUG: unable to handle page fault for address: 00000000008b8418",
        "[    3.125216] Oops: 0000 [#1] PREEMPT SMP NOPTI",
        "[    3.126744] RIP: 0010:dcache_readdir+0x94/0x250",
        "[    3.135282] ---[ end trace 0000000000000000 ]---",
        "[    3.143429] RIP: 0010:dcache_readdir+0x94/0x250")


def test_the_console_is_read_into_phases_live_bytes_writes_and_the_trigger_report():
    con = read_console(console_text(fault=OOPS, trigger="signal 9 digest cbf29ce484222325 bytes 0 lines 0"))
    assert con.phases == ("begin", "probe", "trigger", "after", "end")
    assert con.uptime == 2.95
    assert con.live_in("begin") == (A, "2ee82bfea700") and con.live_in("probe") == (A, "cce82bfea700")
    assert [w.errno for _, w in con.writes] == [0, 0]
    assert con.trigger.status == "signal" and con.trigger.code == 9
    assert [con.lines[i] for i in con.faults_from("probe")] == list(OOPS[:2])
    assert con.excerpt(con.faults_from("probe")[0])[-1].endswith("---[ end trace 0000000000000000 ]---")


def test_a_marker_after_the_start_of_a_kernel_line_is_still_read():
    con = read_console("RVC:phase trigger\n[    4.4] BUG: unable to handle page fault RVC:trigger exit 0 digest ab bytes 3 "
                       "lines 1\nRVC:phase end\n")
    assert con.trigger is not None and con.trigger.digest == "ab"
    assert con.faults == (("trigger", 1),)


def test_a_refused_write_keeps_its_errno_name_and_message():
    con = read_console(console_text(placed="84"))
    write = con.writes[1][1]
    assert (write.errno, write.name) == (84, "EILSEQ") and "multibyte" in write.message


def test_profile_and_listing_are_read_per_tracer():
    assert hits(("site 297 0",), "kprobes") == (297, 0)
    assert hits(("site 5 1",), "kprobes") == (5, 1)  # the module reports under its event too
    assert hits(("/rv/bin/strlen site 385288",), "uprobes") == (385288, None)
    assert hits((), "kprobes") == (None, None)
    listed = ("ffffffff81381a42  k  dcache_readdir+0x82    [OPTIMIZED]", "ffffffff81381a4f  k  dcache_readdir+0x8f")
    assert optimized(listed[:1]) is True and optimized(listed[1:]) is False and optimized(()) is None
    assert optimized(listed, 0xffffffff81381a4f) is False and optimized(listed, 0xffffffff81381a42) is True
    assert optimized(listed, 0xffffffff81000000) is None
    assert hits(("site0 5 0", "site1 7 0"), "kprobes", "site1") == (7, 0)


# -- the outcome ------------------------------------------------------------------------------------------

SITE = Site("dcache_readdir+0x8f", A, "dcache_readdir+0x8f", CS_CALL,
            (("retpoline: thunk (on disk)", CS_CALL), ("retpoline: call *%r10", bytes.fromhex("41ffd2")),
             ("retpoline: lfence (lfence; indirect)", bytes.fromhex("0faee8"))), "", "dcache_readdir+0x8f")
PROBE = Probe("kprobes", "dcache_readdir+0x8f")


def runs(baseline: str, probed: str, ended: str = "exit") -> tuple[Run, Run]:
    return (Run("tcg", "console=ttyS0", 4.6, "exit", read_console(baseline)),
            Run("tcg", "console=ttyS0", 4.6, ended, read_console(probed)))


def test_an_oops_after_the_probe_is_reproduced_with_its_console_lines():
    base, mine = runs(console_text(probe=False),
                      console_text(fault=OOPS, trigger="signal 9 digest cbf29ce484222325 bytes 0 lines 0"))
    d = decide(SITE, PROBE, base, mine)
    assert d.outcome is Outcome.REPRODUCED
    assert "BUG: unable to handle page fault" in d.evidence and "dcache_readdir+0x94/0x250" in d.evidence
    assert "killed by signal 9" in d.evidence
    assert d.excerpt[0] == OOPS[0] and d.hits == 1 and d.live == CS_CALL


def test_different_output_is_reproduced_and_shows_the_lines_side_by_side():
    base, mine = runs(console_text(probe=False, out=("align 0: 45150",)),
                      console_text(out=("align 0: 0",), trigger="exit 0 digest 11 bytes 10 lines 1"))
    d = decide(SITE, PROBE, base, mine)
    assert d.outcome is Outcome.REPRODUCED
    assert d.excerpt == ("without the probe: align 0: 45150", "with the probe:    align 0: 0")


def test_a_guest_that_stops_after_the_probe_is_reproduced():
    text = console_text()
    base, mine = runs(console_text(probe=False), text[:text.index("RVC:phase trigger") + 20], ended="timeout")
    d = decide(SITE, PROBE, base, mine)
    assert d.outcome is Outcome.REPRODUCED and "stopped responding" in d.evidence


def test_live_bytes_of_a_boot_variant_are_patched_at_boot_and_name_the_variant():
    live = "41ffd20f1f00"
    base, mine = runs(console_text(probe=False, live=live), console_text(live=live, profile="site 297 0"))
    d = decide(SITE, PROBE, base, mine)
    assert d.outcome is Outcome.PATCHED_AT_BOOT and d.live_variant == "retpoline: call *%r10"
    assert "the model's variant 'retpoline: call *%r10'" in d.evidence


def test_a_variant_longer_than_the_files_instruction_is_recognised():
    nop = Site("filldir64+0x8f", A, "filldir64+0x8f", b"\x90",
               (("alternative: original (on disk)", b"\x90"), ("alternative: replacement (cpuid 0x134)",
                                                                  bytes.fromhex("0f01cb"))), "", "filldir64+0x8f")
    base, mine = runs(console_text(probe=False, live="0f01cb"), console_text(live="0f01cb"))
    d = decide(nop, PROBE, base, mine)
    assert d.outcome is Outcome.PATCHED_AT_BOOT and d.live == bytes.fromhex("0f01cb")
    assert d.live_variant == "alternative: replacement (cpuid 0x134)"


def test_freed_init_text_is_not_a_boot_patch():
    from dataclasses import replace

    init = replace(SITE, variants=(("init_text: on disk", CS_CALL),), init_text=True)
    base, mine = runs(console_text(probe=False, live="cc" * 6), console_text(live="cc" * 6, placed="22"))
    d = decide(init, PROBE, base, mine)
    assert d.outcome is Outcome.REFUSED and "init text, freed after boot" in d.evidence


def test_live_bytes_no_variant_predicts_are_a_finding_of_their_own():
    live = "90" * 6
    base, mine = runs(console_text(probe=False, live=live), console_text(live=live))
    d = decide(SITE, PROBE, base, mine)
    assert d.outcome is Outcome.PATCHED_AT_BOOT and d.live_variant is None
    assert "none of the model's variants" in d.evidence


def test_a_refusal_gives_the_errno_and_the_kernels_message():
    base, mine = runs(console_text(probe=False), console_text(placed="84", profile="", listing=""))
    d = decide(SITE, PROBE, base, mine)
    assert d.outcome is Outcome.REFUSED
    assert d.evidence.startswith("EILSEQ") and "not an instruction boundary" in d.evidence


def test_no_hits_is_not_executed_and_hits_with_the_same_output_is_not_reproduced():
    base = console_text(probe=False)
    d = decide(SITE, PROBE, *runs(base, console_text(profile="site 0 0")))
    assert d.outcome is Outcome.NOT_EXECUTED
    d = decide(SITE, PROBE, *runs(base, console_text(profile="site 297 0")))
    assert d.outcome is Outcome.NOT_REPRODUCED and d.hits == 297 and "297 times" in d.evidence


def test_outcomes_are_ordered_by_the_strength_of_their_evidence():
    assert sorted(Outcome) == [Outcome.NOT_EXECUTED, Outcome.NOT_REPRODUCED, Outcome.REFUSED,
                               Outcome.PATCHED_AT_BOOT, Outcome.REPRODUCED]
    assert [o.label for o in Outcome][-1] == "reproduced"


# -- the script and the triggers ---------------------------------------------------------------------------

def test_the_run_script_places_the_probe_between_two_reads_of_the_live_bytes():
    probe = Probe("kprobes", "dcache_readdir+0x8f", optimized=True)
    script = run_script(RunPlan((probe,), ("/rv/bin/syscalls", "all"), 20, ((A, 6),)))
    lines = script.splitlines()
    peeks = [i for i, line in enumerate(lines) if f"peek {A:#x} 6" in line]
    place = next(i for i, line in enumerate(lines) if "kprobe_events 'p:rv/site dcache_readdir+0x8f'" in line)
    assert len(peeks) == 2 and peeks[0] < place < peeks[1]
    assert "/rv/bin/rvctl write /proc/sys/debug/kprobes-optimization 1" in lines
    assert lines[-1].endswith("< /sys/kernel/tracing/kprobe_profile")
    two = run_script(RunPlan((probe, Probe("kprobes", "dcache_readdir+0x82", True, event="site1")),
                             ("/rv/bin/syscalls",), 20))
    assert two.count("kprobe_profile") == 1 and "'p:rv/site1 dcache_readdir+0x82'" in two
    bare = run_script(RunPlan((), ("/rv/bin/syscalls", "all"), 20, ((A, 6),)))
    assert "kprobe_events" not in bare and bare.count("RVC:phase") == 4


def test_every_shipped_trigger_has_its_source_a_reason_and_a_tracer():
    from relocverify.confirm.guest import PROGRAM_DIR

    for name in PROGRAMS:
        assert (PROGRAM_DIR / f"{name}.c").is_file(), name
    for t in TRIGGERS:
        assert t.reason and t.tracer in ("kprobes", "uprobes") and BY_NAME[t.name] is t
        assert bool(t.program) != bool(t.command), t.name  # a shipped program or a guest command
        assert not t.test_module or (PROGRAM_DIR / f"{t.test_module}.c").is_file()
    assert for_group("kprobes", "lret via int3_emulate_ret: differs in rsp").name == "lret"
    assert for_group("uprobes", "VEX instructions with opcode 70-7f").name == "strlen"
    assert for_group("kprobes", None).name == "syscalls"


# -- the user's mistakes, before anything is built or booted ---------------------------------------------------

def test_no_site_an_unknown_tracer_and_options_that_do_not_go_together(tmp_path):
    one_line_error(*run("confirm", "--package", "debian-6.1-cloud", "--tracer", "kprobes")[::2], "--site")
    one_line_error(*run("confirm", "--package", "debian-6.1-cloud", "--tracer", "dtrace", "--site", "f")[::2],
                   "kprobes, optprobes, uprobes")
    one_line_error(*run("confirm", "--package", "x", "--tracer", "uprobes", "--site", "f", "--optimized",
                        "on")[::2], "never optimized")
    one_line_error(*run("confirm", "--package", "x", "--tracer", "kprobes", "--site", "f", "--elf",
                        __file__)[::2], "--tracer uprobes")


def test_a_trigger_that_is_not_a_static_program_is_refused(tmp_path):
    script = tmp_path / "trigger.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    one_line_error(*run("confirm", "--package", "x", "--tracer", "kprobes", "--site", "f", "--trigger",
                        str(script))[::2], "not a statically linked")
    one_line_error(*run("confirm", "--package", "x", "--tracer", "kprobes", "--site", "f", "--trigger",
                        str(tmp_path / "missing"))[::2], "neither a shipped trigger")


def test_a_module_trigger_that_is_not_a_module_is_refused(tmp_path):
    source = tmp_path / "m.c"
    source.write_text("int x;\n")
    one_line_error(*run("confirm", "--package", "x", "--tracer", "kprobes", "--site", "f", "--module-trigger",
                        str(source))[::2], "not a kernel module file")
    fake = tmp_path / "m.ko"
    fake.write_bytes(b"not an ELF")
    one_line_error(*run("confirm", "--package", "x", "--tracer", "kprobes", "--site", "f", "--module-trigger",
                        str(fake))[::2], "not a kernel module")


def test_qemu_missing_is_one_line_that_says_what_to_install(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    one_line_error(*run("confirm", "--package", "debian-6.1-cloud", "--tracer", "kprobes", "--site",
                        "dcache_readdir")[::2], "qemu-system-x86_64 not found", "apt-get install qemu-system-x86")


@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="needs qemu-system-x86 (checked first)")
def test_a_package_without_a_kernel_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("no kernel here\n")
    one_line_error(*run("confirm", "--package", str(tmp_path), "--tracer", "kprobes", "--site", "f")[::2],
                   "not a kernel directory")


# -- on the running kernel (slow: each boots the Debian 6.1 cloud kernel twice under QEMU) ------------------------

def _needs_the_guest_tools():
    missing = [tool for tool in ("qemu-system-x86_64", "busybox", "gcc") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (apt-get install qemu-system-x86 busybox-static gcc)")


def _no_guest_left() -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "qemu-system" in line and "/confirm/run-" in line]


def confirm_json(*argv: str) -> tuple[int, list[dict], str]:
    code, out, err = run("confirm", "--package", "debian-6.1-cloud", "--accel", "tcg", "--json", *argv)
    return code, json.loads(out) if code in (0, 1) else [], err


@pytest.mark.slow
def test_a_kprobe_on_a_cs_prefixed_retpoline_call_oopses_under_spectre_v2_retpoline(debian_kernels):
    _needs_the_guest_tools()
    debian_kernels("debian-6.1-cloud")
    code, (result,), _ = confirm_json("--tracer", "kprobes", "--site", "dcache_readdir+0x8f",
                                      "--cmdline", "spectre_v2=retpoline")
    assert code == 1 and result["outcome"] == "reproduced", result["evidence"]
    assert result["file_bytes"] == result["live_bytes"] == CS_CALL.hex()
    assert any("RIP: 0010:dcache_readdir+0x94/" in line for line in result["console"])  # A+5: the call's last byte
    assert result["hits"] == 1 and result["accel"] == "tcg"
    assert result["trigger_report"]["without_probe"]["status"] == "exit"
    assert max(result["boot_seconds"].values()) < 60
    assert not _no_guest_left()


@pytest.mark.slow
def test_a_control_the_audit_calls_agree_is_not_reproduced(debian_kernels):
    _needs_the_guest_tools()
    debian_kernels("debian-6.1-cloud")
    code, (result,), _ = confirm_json("--tracer", "kprobes", "--site", "dcache_readdir+0x82",
                                      "--cmdline", "spectre_v2=retpoline")
    assert code == 0 and result["outcome"] == "not-reproduced", result["evidence"]
    assert result["hits"] > 0 and result["listed_optimized"] is False
    assert result["trigger_report"]["without_probe"] == result["trigger_report"]["with_probe"]


@pytest.mark.slow
def test_a_uprobe_on_a_vex_instruction_with_opcode_74_corrupts_strlen(debian_kernels):
    _needs_the_guest_tools()
    debian_kernels("debian-6.1-cloud")
    code, (result,), _ = confirm_json("--tracer", "uprobes", "--site", "__strlen_avx2+0x84")
    assert code == 1 and result["outcome"] == "reproduced", result["evidence"]
    assert result["hits"] > 0 and result["probe"].startswith("/rv/bin/strlen:0x")
    assert "without the probe: align 0: sum of strlen(0..300) = 45150" in result["console"]


@pytest.mark.slow
def test_a_site_outside_the_text_is_refused_before_any_boot(debian_kernels):
    _needs_the_guest_tools()
    debian_kernels("debian-6.1-cloud")
    one_line_error(*run("confirm", "--package", "debian-6.1-cloud", "--tracer", "kprobes", "--site",
                        "0xffffffff82000000")[::2], "not in a function of the kernel's text")
    one_line_error(*run("confirm", "--package", "debian-6.1-cloud", "--tracer", "kprobes", "--site",
                        "dcache_readdir+0x83")[::2], "inside an instruction")


def _static(tmp_path, name: str, source: str) -> str:
    path = tmp_path / f"{name}.c"
    path.write_text(source)
    subprocess.run(["gcc", "-static", "-O2", "-o", str(tmp_path / name), str(path)], check=True)
    return str(tmp_path / name)


@pytest.mark.slow
def test_a_trigger_that_hangs_or_floods_the_console_is_refused_and_no_guest_is_left(debian_kernels, tmp_path):
    _needs_the_guest_tools()
    debian_kernels("debian-6.1-cloud")
    hang = _static(tmp_path, "hang", "#include <unistd.h>\nint main(void) { for (;;) pause(); }\n")
    flood = _static(tmp_path, "flood", "#include <fcntl.h>\n#include <unistd.h>\nint main(void) {\n"
                    "  int fd = open(\"/dev/console\", O_WRONLY);\n  char line[200];\n"
                    "  for (int i = 0; i < 199; i++) line[i] = 'x';\n  line[199] = '\\n';\n"
                    "  for (;;) (void)!write(fd, line, sizeof line);\n}\n")
    base = ("confirm", "--package", "debian-6.1-cloud", "--tracer", "kprobes", "--site", "dcache_readdir+0x82",
            "--accel", "tcg")
    one_line_error(*run(*base, "--trigger-timeout", "2", "--trigger", hang)[::2], "did not finish in 2 s")
    assert not _no_guest_left()
    one_line_error(*run(*base, "--trigger", flood)[::2], "floods the console")
    assert not _no_guest_left()
    from relocverify.confirm.guest import confirm_cache

    leftovers = [p for p in os.listdir(confirm_cache()) if p.startswith("run-")]
    assert not leftovers


def test_a_module_site_is_named_as_kprobe_events_names_it():
    from relocverify.confirm.sites import module_of

    assert module_of("sha256_ssse3:sha256_transform_rorx+0xd8") == ("sha256_ssse3", "sha256_transform_rorx+0xd8")
    assert module_of("sha256-ssse3:f") == ("sha256_ssse3", "f")
    assert module_of("kprobe:tcp_v4_rcv+28") == (None, "kprobe:tcp_v4_rcv+28")
    assert module_of("dcache_readdir+0x8f") == (None, "dcache_readdir+0x8f")


def test_the_headers_a_module_is_built_against_follow_the_release():
    from relocverify.confirm.kbuild import header_packages

    assert header_packages("6.1.0-53-cloud-amd64") == ("linux-headers-6.1.0-53-cloud-amd64",
                                                       "linux-headers-6.1.0-53-common", "linux-kbuild-6.1")
    with pytest.raises(Exception, match="not a Debian kernel release"):
        header_packages("6.1-custom")


def test_a_module_placement_reads_register_kprobes_errno_back():
    script = "\n".join(Probe("kprobes", "sha256_ssse3:sha256_transform_rorx+0xd8", via="module").place())
    assert "insmod /rv/modules/rvkprobe.ko symbol=sha256_ssse3:sha256_transform_rorx offset=216" in script
    con = read_console("RVC:phase probe\nRVC:write /proc/rv-module 22 -: register_kprobe refused\n")
    write = con.writes[0][1]
    assert (write.errno, write.name) == (22, "EINVAL") and "Invalid argument" in write.message


def test_an_audit_store_without_a_summary_is_one_line(tmp_path):
    store = tmp_path / "s.sqlite"
    store.write_bytes(b"")
    one_line_error(*run("confirm", "--package", "debian-6.1-cloud", "--audit", str(store))[::2],
                   "no audit summary", "relocverify audit --db")
    (tmp_path / "s.sqlite.audit.json").write_text("[1, 2]")
    one_line_error(*run("confirm", "--package", "debian-6.1-cloud", "--audit", str(store))[::2], "has no tracers")
    one_line_error(*run("confirm", "--package", "x", "--audit", str(store), "--site", "f")[::2], "no --site")


def test_a_group_is_classed_by_its_bytes_and_words():
    from relocverify.confirm.triggers import group_class

    assert group_class("vmovdqu via kprobe_emulate_jcc: differs in mem[]", bytes.fromhex("c5fa7f07")) == "vex"
    assert for_group("kprobes", group_class("vmovdqu via kprobe_emulate_jcc", bytes.fromhex("c5fa7f07"))).name \
        == "afalg"
    assert for_group("kprobes", group_class("call via kprobe_emulate_call: differs in mem[]",
                                            CS_CALL)).name == "syscalls"
    assert BY_NAME["strlen"].stand_ins and BY_NAME["afalg"].via == "module"
    from relocverify.confirm.groups import stand_ins

    vex = group_class("vmovdqu via kprobe_emulate_jcc: differs in mem[]", bytes.fromhex("c5fa7f07"))
    assert [s.site for _, s in stand_ins("kprobes", vex)] == ["sha256_ssse3:sha256_transform_rorx+0xd8"]
    assert [s.site for _, s in stand_ins("uprobes", vex)] == ["__strlen_avx2+0x19"]
    assert [s.site for _, s in stand_ins("kprobes", group_class("retf via kprobe_emulate_ret: differs in rsp"))] \
        == ["rvtest:rv_far_return+0xa"]
    assert [s.site for _, s in stand_ins("kprobes", group_class("call via kprobe_emulate_call: differs in mem[]",
                                                                CS_CALL))] == ["dcache_readdir+0x8f"]


def test_controls_are_spread_over_the_functions():
    from relocverify.confirm.controls import Audited, spread

    sites = [Audited(0x1000 + i, f"f+{i:#x}", "agree", "") for i in range(5)] + \
            [Audited(0x2000 + i, f"g+{i:#x}", "agree" if i != 1 else "tracer-wrong", "") for i in range(3)]
    assert [s.where for s in spread(sites, 4)] == ["f+0x0", "g+0x0", "f+0x1", "g+0x2"]
    assert len(spread(sites, 50)) == 7
