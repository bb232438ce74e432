"""``objdump -d`` from GNU binutils behind ``protocol.Decoder``: length and
branch target, read from its text output.

A batch is written as one flat binary, each byte string in its own 32-byte
slot padded with ``nop`` (0x90), and disassembled by one
``objdump -D -b binary -m i386:x86-64`` run.  Only the line at each slot's
start is read: an instruction is at most 15 bytes, so a decoder that reads
too far resynchronises on the one-byte NOPs before the next slot.  Branch
targets are read as slot-relative, hence address-independent (the
protocol's ``target_delta``).  A prefix objdump does not attribute to the
instruction prints as its own line (``f0  lock``): its length is 1.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

from ...errors import InputError
from .protocol import Facts, error

SLOT = 32
_LINE = re.compile(r"^\s*([0-9a-f]+):\t((?:[0-9a-f]{2} )+)\s*\t?(.*)$")
_BRANCH = re.compile(r"^(?:(?:bnd|notrack|data16|addr32|rex\.?\w*|[a-z]s)\s+)*"
                     r"(j\w+|call\w*|loop\w*|xbegin)\s+(?:0x)?([0-9a-f]+)(?:\s|$)")


def _objdump() -> str:
    path = shutil.which("objdump")
    if path is None:
        raise InputError("objdump not found: install GNU binutils (apt-get install binutils)")
    return path


def _parse(text: str) -> dict[int, tuple[int, str]]:
    """Address -> (length, instruction text) of every line objdump printed."""
    lines: dict[int, tuple[int, str]] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            lines[int(m.group(1), 16)] = (len(m.group(2).split()), m.group(3).strip())
    return lines


def _facts(length: int, text: str, slot: int) -> Facts:
    if "(bad)" in text or not text:
        return error(f"objdump: {text or 'no instruction'}")
    target = None
    m = _BRANCH.match(text)
    if m:
        target = (int(m.group(2), 16) - slot) & 0xFFFFFFFFFFFFFFFF
    return Facts(length, None, None, 0, None, 0, target)


def decode_blob(items) -> list[Facts]:
    blob = b"".join(raw[:15].ljust(SLOT, b"\x90") for _, raw in items)
    fd, path = tempfile.mkstemp(suffix=".bin", prefix="relocverify-objdump-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        proc = subprocess.run([_objdump(), "-D", "-b", "binary", "-m", "i386:x86-64", "--insn-width=16",
                               "-w", path], capture_output=True, text=True)
    finally:
        os.unlink(path)
    if proc.returncode != 0:
        raise InputError(f"objdump failed: {proc.stderr.strip()[:200]}")
    lines = _parse(proc.stdout)
    out = []
    for i in range(len(items)):
        slot = i * SLOT
        length, text = lines.get(slot, (0, ""))
        out.append(_facts(length, text, slot) if length else error("objdump: no instruction starts here"))
    return out


def version() -> str:
    proc = subprocess.run([_objdump(), "--version"], capture_output=True, text=True)
    return proc.stdout.splitlines()[0].rsplit(" ", 1)[-1] if proc.stdout else "unknown"


class ObjdumpAdapter:
    """GNU objdump behind ``protocol.Decoder``: length and branch target only."""

    name = "objdump"
    fields = frozenset({"length", "target"})

    def version(self) -> str:
        return version()

    def decode_many(self, items):
        items = list(items)
        out: list[Facts] = []
        for start in range(0, len(items), 200_000):
            out += decode_blob(items[start:start + 200_000])
        return out
