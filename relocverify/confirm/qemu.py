"""One boot of a guest under QEMU: its serial console, how long it took, and how it ended.

``boot`` runs Debian's ``qemu-system-x86_64`` in a session of its own (its own process group)
with the kernel ELF booted through its PVH note, the initramfs and the command line given, a
serial console on a pipe and nothing else (``-nodefaults``: no network, no display, no disks).
It ends the guest, however the boot goes, before it returns: the guest powers off (``poweroff
-f``; a panic reboots, which ``-no-reboot`` turns into an exit), or the time limit passes
(``ended='timeout'``; sooner once the console shows a kernel fault: a kernel that oopsed with a lock
held may never power off), or the console passes ``console_cap`` bytes (``ended='flood'``); then the
whole process group is killed with SIGKILL and waited for.  An exception on the host (Ctrl-C)
ends it the same way.  Nothing is left running.

The accelerator: TCG (``-cpu max``: AVX2, no AVX-512) everywhere; KVM (``-cpu host``) only where
a short boot showed that it runs the guest's kernel-mode ``int3`` and ``xrstor`` (``accel``): a
software hypervisor's /dev/kvm may fail on either, or hang.  That answer is remembered per host
boot (``/proc/sys/kernel/random/boot_id``) and QEMU version in ``<cache>/confirm/accel.json``.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import InputError

QEMU = "qemu-system-x86_64"
#: Bytes of console a boot may print; past it the guest is ended (``ended='flood'``).
CONSOLE_CAP = 2 << 20
MEMORY_MB = 512
CPU = {"tcg": "max", "kvm": "host"}


@dataclass(frozen=True)
class Boot:
    """A finished boot as the host saw it."""

    accel: str
    cmdline: str
    console: str  # the serial console, decoded (undecodable bytes replaced), at most CONSOLE_CAP bytes
    seconds: float  # from starting QEMU to its end
    ended: str  # 'exit' (QEMU exited: poweroff or panic) | 'timeout' | 'flood'
    returncode: int | None


def find_qemu() -> str:
    """The path of qemu-system-x86_64; InputError saying how to install it otherwise."""
    path = shutil.which(QEMU)
    if path is None:
        raise InputError(f"{QEMU} not found: install Debian's qemu-system-x86 (apt-get install qemu-system-x86)")
    return path


def command(qemu: str, kernel: str, initrd: str, cmdline: str, accel: str, cpus: int = 1) -> list[str]:
    """The QEMU command line of one boot."""
    return [qemu, "-nodefaults", "-no-user-config", "-machine", "q35", "-accel", accel, "-cpu", CPU[accel],
            "-m", str(MEMORY_MB), "-smp", str(cpus), "-display", "none", "-monitor", "none", "-serial", "stdio",
            "-no-reboot", "-kernel", kernel, "-initrd", initrd, "-append", cmdline]


@dataclass(frozen=True)
class BootSpec:
    """What to boot: the kernel ELF, the initramfs and the command line."""

    kernel: str
    initrd: str
    cmdline: str
    cpus: int = 1  # -smp: with one CPU the kernel rewrites the .smp_locks LOCK prefixes to DS


def boot(kernel: str, initrd: str, cmdline: str, accel: str, limit_s: float, console_cap: int = CONSOLE_CAP,
         qemu: str | None = None) -> Boot:
    """Boot once and return when the guest is gone (see the module doc)."""
    return boot_all([BootSpec(kernel, initrd, cmdline)], accel, limit_s, console_cap, qemu)[0]


def boot_all(specs: list[BootSpec], accel: str, limit_s: float, console_cap: int = CONSOLE_CAP,
             qemu: str | None = None, fault: Callable[[bytes], bool] | None = None,
             after_fault_s: float = 8.0) -> list[Boot]:
    """Boot every spec at once (each its own QEMU, all read by one loop) and return when all are gone;
    each has the time limit and the console cap of ``boot``.  ``fault``: told each piece of a console;
    once it says the kernel faulted, that boot has ``after_fault_s`` more to finish (a kernel that
    oopses with interrupts off or a lock held may never power off)."""
    qemu = qemu or find_qemu()
    start = time.monotonic()
    procs: list[subprocess.Popen] = []
    chunks: list[list[bytes]] = [[] for _ in specs]
    ended = ["interrupted"] * len(specs)
    seconds = [0.0] * len(specs)
    try:
        for spec in specs:
            argv = command(qemu, spec.kernel, spec.initrd, spec.cmdline, accel, spec.cpus)
            try:
                procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, start_new_session=True))
            except OSError as exc:
                raise InputError(f"cannot run {argv[0]}: {exc.strerror}") from None
        _read(procs, chunks, ended, seconds, start, start + limit_s, console_cap, fault, after_fault_s)
    finally:
        for proc in procs:
            _end(proc, 0.0)
            proc.stdout.close()
    return [Boot(accel, spec.cmdline, b"".join(c)[:console_cap].decode("utf-8", "replace"), round(s, 3), e,
                 p.returncode if e == "exit" else None)
            for spec, c, e, s, p in zip(specs, chunks, ended, seconds, procs)]


def _read(procs, chunks, ended, seconds, start: float, deadline: float, cap: int, fault=None,
          after_fault_s: float = 8.0) -> None:
    """Read every console until its QEMU closes it, its deadline passes or it passes ``cap`` bytes."""
    open_fds = {p.stdout.fileno(): i for i, p in enumerate(procs)}
    totals = [0] * len(procs)
    deadlines = [deadline] * len(procs)
    while open_fds:
        now = time.monotonic()
        for fd, i in list(open_fds.items()):
            if deadlines[i] <= now:
                ended[i], seconds[i] = "timeout", now - start
                _end(procs[i], 0.0)
                del open_fds[fd]
        if not open_fds:
            return
        left = min(deadlines[i] for i in open_fds.values()) - now
        ready, _, _ = select.select(list(open_fds), [], [], max(0.0, min(left, 0.5)))
        for fd in ready:
            i = open_fds[fd]
            data = os.read(fd, 1 << 16)
            if data:
                chunks[i].append(data)
                totals[i] += len(data)
                if fault is not None and deadlines[i] > time.monotonic() + after_fault_s and \
                        fault(b"".join(chunks[i][-2:])):
                    deadlines[i] = time.monotonic() + after_fault_s
            if not data or totals[i] > cap:
                ended[i] = "flood" if data else "exit"
                _end(procs[i], 0.0 if data else 5.0)
                seconds[i] = time.monotonic() - start
                del open_fds[fd]


def _end(proc: subprocess.Popen, grace_s: float) -> None:
    """QEMU's process group killed (after ``grace_s`` for a QEMU on its way out) and QEMU reaped.  The group
    is signalled before QEMU is reaped, while its id cannot belong to anything else.  Idempotent."""
    if proc.returncode is not None:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


# -- the accelerator ----------------------------------------------------------------------------

def kvm_present() -> bool:
    return os.access("/dev/kvm", os.R_OK | os.W_OK)


def host_key(qemu: str) -> str:
    """What a remembered KVM answer holds for: this host's boot and this QEMU."""
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot_id = "unknown"
    stat = os.stat(qemu)
    return f"{boot_id}|{os.path.realpath(qemu)}|{stat.st_size}|{stat.st_mtime_ns}"


def accel(requested: str, cache_dir: str, try_kvm: Callable[[], tuple[bool, str]], qemu: str) -> tuple[str, str]:
    """(accelerator, why): ``requested`` 'tcg' or 'kvm' as asked; 'auto' is KVM where ``try_kvm`` (one
    short boot: kernel-mode int3 and xrstor) succeeded on this host boot, else TCG."""
    if requested in ("tcg", "kvm"):
        if requested == "kvm" and not kvm_present():
            raise InputError("--accel kvm: /dev/kvm is missing or not writable here; use --accel tcg")
        return requested, f"--accel {requested}"
    if not kvm_present():
        return "tcg", "no usable /dev/kvm"
    memo = Path(cache_dir) / "accel.json"
    key = host_key(qemu)
    try:
        known = json.loads(memo.read_text())
        if known.get("host") == key:
            return known["accel"], known["why"] + " (remembered for this host boot)"
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    ok, why = try_kvm()
    chosen = "kvm" if ok else "tcg"
    memo.parent.mkdir(parents=True, exist_ok=True)
    partial = memo.with_name(f"{memo.name}.{os.getpid()}.part")
    partial.write_text(json.dumps({"host": key, "accel": chosen, "why": why}))
    os.replace(partial, memo)
    return chosen, why
