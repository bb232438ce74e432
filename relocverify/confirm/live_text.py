"""The live text of the guest's kernel, brought out: the bytes of chosen functions as they run after boot,
and the ``/proc/kallsyms`` lines that place them, for ``relocverify check --live-text DUMP --kallsyms FILE``.

``capture(guest, functions, cmdline)`` boots the guest with a run script that reads each function's
bytes from ``/proc/kcore`` (``rvctl peek``, 64 bytes a read, before anything else runs) and prints the
kallsyms lines of ``_stext``, ``_text`` and the functions, all on the serial console.  A console line can
come out with a character lost or another line's inside it (seen once in CI, a piece one hex digit short),
so every piece is read twice and taken only when two copies say the same whole hex of the length asked for
and outnumber every other whole value (``whole``); a piece without that boots the guest again (``BOOTS`` in
all, every boot's copies counted), and nothing is cached until every piece is taken.  The console is read back into a dump (lines ``ADDR HEX``, ``kernel.live``'s format) and a kallsyms file.  Both are cached in
``<cache>/confirm/live-<release>-<key>/`` (the key digests the guest's kernel, the command line and the
functions) and reused.  The guest boots without KASLR (``guest.py``), so the slide is 0; the files carry
it anyway, as a dump from a machine would.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from . import initramfs, qemu
from .confirmation import BASE_CMDLINE
from .console import read_console
from .guest import Guest, confirm_cache, run_initrd, scratch
from .probe import RVCTL

PEEK = 64  # the most ``rvctl peek`` reads at once
BOOT_LIMIT_S = 120.0
BOOTS = 3  # boots at most, until every piece came out whole
COPIES = 2  # reads of each piece in one boot
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
    for a, n in pieces(ranges):
        lines += [f"{RVCTL} peek {a:#x} {n}"] * COPIES
    names = "|".join(["_stext", "_text"] + sorted({name for name, _, _ in ranges}))
    lines.append(f"grep -E ' ({names})$' /proc/kallsyms | while read a t n; do echo \"RVC:note ksym $a $t $n\"; "
                 f"done")
    return "\n".join(lines) + "\n"


def pieces(ranges: list[tuple[str, int, int]]) -> list[tuple[int, int]]:
    """(address, size) of every ``rvctl peek`` read of the (name, address, size) ranges, in order."""
    return [(a, min(PEEK, address + size - a)) for _, address, size in ranges for a in range(address, address + size, PEEK)]


def whole(asked: list[tuple[int, int]], read: list[tuple[int, str]]) -> tuple[dict[int, str], list[str]]:
    """The pieces read whole (address -> hex): a value of the size asked for, in hex, that at least two
    copies say and more copies say than every other whole value together; and what is wrong with each
    other piece (too few whole copies, copies that differ, unreadable in the guest)."""
    copies: dict[int, list[str]] = {}
    for a, h in read:
        copies.setdefault(a, []).append(h)
    good: dict[int, str] = {}
    problems: list[str] = []
    for a, n in asked:
        seen = copies.get(a, [])
        fine = Counter(h for h in seen if len(h) == 2 * n and all(c in "0123456789abcdef" for c in h))
        best, count = fine.most_common(1)[0] if fine else ("", 0)
        if count >= 2 and 2 * count > sum(fine.values()):
            good[a] = best
        elif len(fine) > 1:
            problems.append(f"{a:#x}: its copies differ")
        elif any(h.startswith("unreadable") for h in seen):
            problems.append(f"{a:#x}: {next(h for h in seen if h.startswith('unreadable'))}")
        else:
            problems.append(f"{a:#x}: {count} whole copy of its {n} bytes on the console (2 wanted)")
    return good, problems


def capture(guest: Guest, functions: list[tuple[str, int, int]], cmdline: str, accel: str = "tcg",
            cache_dir: str | None = None, say=None) -> Capture:
    """The live text of ``functions`` ((name, address, size) in the guest's kernel) booted with ``cmdline``
    (after ``confirmation.BASE_CMDLINE``), from the cache or one boot."""
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
    asked = pieces(functions)
    read: list[tuple[int, str]] = []  # every boot's copies
    seconds = 0.0
    for _ in range(BOOTS):
        with scratch(cache_dir) as work:
            initrd = run_initrd(guest, [initramfs.file("rv/run.sh", script(functions).encode())], work)
            boot = qemu.boot(guest.kernel, initrd, full, accel, BOOT_LIMIT_S)
        seconds += boot.seconds
        con = read_console(boot.console)
        read += [(a, h) for phase, a, h in con.live if phase == "begin"]
        good, problems = whole(asked, read)
        ksyms = [rest.split(" ", 1)[1] for kind, rest, _ in con.listing if kind == "note" and rest.startswith("ksym ")]
        if len(good) == len(asked) and ksyms:
            break
        if any("unreadable" in p for p in problems):  # the guest cannot read it: another boot would not either
            break
    if problems or not ksyms:
        raise InputError(f"the guest did not give its live text ({boot.ended} after {boot.seconds:.1f} s): "
                         f"{problems[0] if problems else 'no kallsyms line on its console'}")
    directory.mkdir(parents=True, exist_ok=True)
    head = f"# live text of {guest.release} ({Path(guest.kernel).name}) booted with: {full}\n"
    _write(dump, head + "".join(f"{a:x} {good[a]}\n" for a, _ in asked))
    _write(kallsyms, "".join(line + "\n" for line in ksyms))
    return Capture(str(dump), str(kallsyms), full, seconds)


def _write(path: Path, text: str) -> None:
    partial = path.with_name(f"{path.name}.{os.getpid()}.part")
    partial.write_text(text)
    os.replace(partial, path)
