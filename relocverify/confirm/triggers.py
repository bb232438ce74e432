"""Triggers as data: the programs that make the guest execute a probed site, one row each.

A trigger is a C program in ``programs/`` built statically into the cached guest as
``/rv/bin/NAME`` (or a guest command, reading a test module's /proc file), with the arguments it runs
with, the kernel modules it needs (loaded in both boots, before any probe; a test module built
against the package's headers among them), the tracer and audit groups it is the shipped trigger of,
and why it reaches them.  ``--trigger NAME`` names a row; ``--trigger PROGRAM [ARGS...]`` runs a statically
linked program of the user's instead (copied into that boot's initramfs).  Every shipped trigger
prints only what the kernel's answers decide (no PIDs, no times), so the boot without the probe
and the boot with it print the same bytes unless the probe changed what ran.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Trigger:
    name: str
    program: str  # programs/<program>.c
    args: tuple[str, ...]
    modules: tuple[str, ...]  # kernel modules (by name) it needs, their dependencies found from .modinfo
    tracer: str  # the tracer whose sites it is shipped for
    groups: tuple[str, ...]  # audit group causes (``for_group``) it is the shipped trigger of
    reason: str
    functions: tuple[str, ...] = ()  # kernel functions it runs: where controls are taken from
    stand_ins: tuple["StandIn", ...] = ()  # sites of its classes it runs, probed where the audit's own cannot be
    via: str = "events"  # how the stand-ins are probed
    command: tuple[str, ...] = ()  # the argv in the guest when it runs a guest program, not programs/<program>.c
    test_module: str = ""  # programs/<test_module>.c, a module built against the package's headers, loaded first


@dataclass(frozen=True)
class StandIn:
    """A site a trigger runs that stands for an audit class: for ``tracer`` (kprobes, optprobes, uprobes), a
    group whose class (``group_class``) contains ``word``."""

    tracer: str
    word: str
    site: str
    why: str


TRIGGERS: tuple[Trigger, ...] = (
    Trigger("syscalls", "syscalls", ("all", "3"), (), "kprobes",
            ("call", "agree"),
            "readdir of /, /proc, /proc/self, /sys and /dev (dcache_readdir, proc_pident_readdir, proc_readdir_de, "
            "kernfs_fop_readdir: their dir_emit actor calls are cs-prefixed retpoline calls), a pipe's poll and "
            "select (pipe_poll), every clock's getres and gettime, ptrace GETREGS/GETFPREGS/PEEKUSER, sysctl "
            "reads (__do_proc_dointvec), uname and stat: the common system calls a kernel site is reached from",
            functions=("dcache_readdir", "iterate_dir", "filldir64", "__x64_sys_getdents64", "pipe_poll",
                       "do_sys_poll", "do_select", "proc_pident_readdir", "kernfs_fop_readdir", "proc_readdir_de",
                       "__do_proc_dointvec", "proc_sys_call_handler", "ksys_read", "vfs_read",
                       "__x64_sys_clock_getres", "do_sys_openat2", "path_openat"),
            stand_ins=(StandIn("kprobes", "call via kprobe_emulate_call", "dcache_readdir+0x8f",
                               "a cs-prefixed call to __x86_indirect_thunk_r10 (dir_emit's actor) that readdir of / "
                               "runs; the audit's first instances are ptrace requests the trigger does not make"),)),
    Trigger("afalg", "afalg", (), ("af_alg", "algif_hash", "sha256_ssse3"), "kprobes",
            ("vex",),
            "a SHA-256 digest through AF_ALG by every x86 driver (sha256-avx2, -avx, -ssse3) and the generic one: "
            "sha256_transform_rorx and sha256_transform_avx (module sha256_ssse3) are asm full of VEX "
            "instructions whose opcode bytes are 70-7f (vmovdqa stores, vpshufd, vpsrld/vpslld/vpsrlq), which "
            "kprobes' prepare_emulation reads as jcc; kprobe_events refuses these notrace functions, so probe "
            "them with --via module",
            stand_ins=(StandIn("kprobes", "vex", "sha256_ssse3:sha256_transform_rorx+0xd8",
                               "vmovdqa %ymm9,(%rsp,%rdi,1): VEX 0f 7f, read as jg"),), via="module"),
    Trigger("lret", "", (), (), "kprobes",
            ("retf", "lret", "far return", "computed exit"),
            "reads /proc/rv-test, whose handler (test module rvtest, built against the package's headers) calls "
            "rv_far_return 1,000 times: push CS, push the next instruction's address, lretq, as startup_64 "
            "reloads CS; kprobes emulates lretq as a near ret, and optprobes copies push and lretq into its slot "
            "while the far return lands inside the jump it wrote. No kernel path runs startup_64 after boot",
            stand_ins=(StandIn("kprobes", "retf", "rvtest:rv_far_return+0xa", "lretq, emulated as a near ret"),
                       StandIn("optprobes", "patched-range exit", "rvtest:rv_far_return+0x9",
                               "push %rax before lretq: the copied run's far return comes back into the bytes the "
                               "optimized jump overwrote")),
            via="module", command=("/bin/cat", "/proc/rv-test"),
            test_module="rvtest"),
    Trigger("strlen", "strlen", ("20",), (), "uprobes",
            ("vex",),
            "glibc's strlen over every length 0..300 at 64 alignments; static, so glibc's ifunc picks "
            "__strlen_avx2 under QEMU's -cpu max, whose vpcmpeqb (VEX 0f 74) and vzeroupper (VEX 0f 77) "
            "have opcode bytes uprobes' branch_setup_xol_ops reads as jcc",
            stand_ins=(StandIn("uprobes", "vex", "__strlen_avx2+0x19", "vpcmpeqb (%rdi): VEX 0f 74, read as je"),)),
)

BY_NAME = {t.name: t for t in TRIGGERS}
#: The programs every guest carries: the helper and the shipped triggers.
PROGRAMS = ("rvctl",) + tuple(sorted({t.program for t in TRIGGERS if t.program}))


def group_class(group: str, raw: bytes = b"") -> str:
    """The class of an audit group, as the ``groups`` of a row name it: 'vex' for an instruction with a
    VEX or EVEX prefix (its bytes say so; the group names its mnemonic and the emulator), else the
    group's own words (``call via kprobe_emulate_call: ...``)."""
    if raw[:1] in (b"\xc4", b"\xc5", b"\x62"):
        return "vex"
    return group.lower()


def for_group(tracer: str, cause: str | None) -> Trigger:
    """The shipped trigger for a site of ``tracer`` whose group class (``group_class``) mentions one of a
    row's ``groups`` words (``cause`` None: a site given by hand), else the tracer's first row."""
    rows = [t for t in TRIGGERS if t.tracer == tracer] or list(TRIGGERS)
    if cause:
        text = cause.lower()
        for row in rows:
            if any(word in text for word in row.groups):
                return row
    return rows[0]


def needed_modules() -> tuple[str, ...]:
    """Every module a shipped trigger needs: the guest carries them."""
    return tuple(sorted({m for t in TRIGGERS for m in t.modules}))
