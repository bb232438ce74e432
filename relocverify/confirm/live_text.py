"""The live text of the guest's kernel, brought out: the bytes of chosen functions as they run after boot,
and the ``/proc/kallsyms`` lines that place them, for ``relocverify check --live-text DUMP --kallsyms FILE``.

``capture(guest, functions, cmdline)`` boots the guest once with a run script that reads each function's
bytes from ``/proc/kcore`` (``rvctl peek``, 64 bytes a read, before anything else runs) and prints the
kallsyms lines of ``_stext``, ``_text`` and the functions, all on the serial console; the console is read
back into a dump (lines ``ADDR HEX``, ``kernel.live``'s format) and a kallsyms file.  Both are cached in
``<cache>/confirm/live-<release>-<key>/`` (the key digests the guest's kernel, the command line and the
functions) and reused.  The guest boots without KASLR (``guest.py``), so the slide is 0; the files carry
it anyway, as a dump from a machine would.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from . import initramfs, qemu
from .console import read_console
from .guest import Guest, confirm_cache, run_initrd, scratch
from .probe import RVCTL

PEEK = 64  # the most ``rvctl peek`` reads at once
BOOT_LIMIT_S = 120.0
FORMAT = 1


@dataclass(frozen=True)
class Capture:
    dump: str  # path: lines ADDR HEX
    kallsyms: str  # path: /proc/kallsyms lines
    cmdline: str
    seconds: float | None  # the boot's wall time; None when the capture came from the cache


def script(ranges: list[tuple[str, int, int]]) -> str:
    """``/rv/run.sh``: each (name, address, size) read in PEEK-byte pieces, then their kallsyms lines."""
    lines = ['echo "RVC:phase begin $(cat /proc/uptime)"']
    for _, address, size in ranges:
        lines += [f"{RVCTL} peek {a:#x} {min(PEEK, address + size - a)}" for a in range(address, address + size, PEEK)]
    names = "|".join(["_stext", "_text"] + sorted({name for name, _, _ in ranges}))
    lines.append(f"grep -E ' ({names})$' /proc/kallsyms | while read a t n; do echo \"RVC:note ksym $a $t $n\"; "
                 f"done")
    return "\n".join(lines) + "\n"


def capture(guest: Guest, functions: list[tuple[str, int, int]], cmdline: str, accel: str = "tcg",
            cache_dir: str | None = None, say=None) -> Capture:
    """The live text of ``functions`` ((name, address, size) in the guest's kernel) booted with ``cmdline``
    (after ``confirmation.BASE_CMDLINE``), from the cache or one boot."""
    from .confirmation import BASE_CMDLINE

    full = " ".join([BASE_CMDLINE] + cmdline.split())
    key = hashlib.sha256(json.dumps([FORMAT, Path(guest.kernel).name, os.path.getsize(guest.kernel), full,
                                     sorted(functions)]).encode()).hexdigest()[:16]
    directory = confirm_cache(cache_dir) / f"live-{guest.release}-{key}"
    dump, kallsyms = directory / "live.text", directory / "kallsyms"
    if dump.is_file() and kallsyms.is_file():
        return Capture(str(dump), str(kallsyms), full, None)
    if say:
        say(f"booting the guest with {cmdline or 'its default command line'} to read the live text of "
            f"{len(functions)} functions ({accel}) ...")
    with scratch(cache_dir) as work:
        initrd = run_initrd(guest, [initramfs.file("rv/run.sh", script(functions).encode())], work)
        boot = qemu.boot(guest.kernel, initrd, full, accel, BOOT_LIMIT_S)
    con = read_console(boot.console)
    pieces = [(a, h) for phase, a, h in con.live if phase == "begin"]
    bad = [f"{a:#x}: {h}" for a, h in pieces if h.startswith("unreadable")]
    if bad or not pieces:
        raise InputError(f"the guest did not give its live text ({boot.ended} after {boot.seconds:.1f} s): "
                         f"{bad[0] if bad else 'no RVC:live line on its console'}")
    ksyms = [rest.split(" ", 1)[1] for kind, rest, _ in con.listing if kind == "note" and rest.startswith("ksym ")]
    directory.mkdir(parents=True, exist_ok=True)
    head = f"# live text of {guest.release} ({Path(guest.kernel).name}) booted with: {full}\n"
    _write(dump, head + "".join(f"{a:x} {h}\n" for a, h in pieces))
    _write(kallsyms, "".join(line + "\n" for line in ksyms))
    return Capture(str(dump), str(kallsyms), full, boot.seconds)


def _write(path: Path, text: str) -> None:
    partial = path.with_name(f"{path.name}.{os.getpid()}.part")
    partial.write_text(text)
    os.replace(partial, path)
