"""An external decoder command behind ``protocol.Adapter``.

The command reads lines ``ADDR_HEX BYTES_HEX`` (at most 15 bytes) on stdin
and writes, for each, one JSON object per line on stdout:

    {"length": int, "disp_offset": int|null, "disp_size": int,
     "imm_offset": int|null, "imm_size": int, "target": int|null}

or ``{"error": str}`` for bytes it cannot decode.  Absent fields are null,
not 0: ``"disp_offset": null`` says the instruction has no displacement.
A key left out of the object altogether says the decoder does not know
(a decoder without field offsets, such as capstone 4): that field is then
not compared.  A line that breaks this protocol becomes an error answer naming the
problem (the gate then reports it against that instruction); a command that
cannot be started, dies, or answers a different number of lines is the
caller's mistake: ``InputError``.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import threading

from ...errors import InputError
from .protocol import Facts, delta, error

MAX_BYTES = 15


def parse_answer(line: str, address: int) -> Facts:
    """One output line as ``Facts``; protocol violations become error answers."""
    try:
        doc = json.loads(line)
    except ValueError:
        return error(f"protocol: not JSON: {line[:80]!r}")
    if not isinstance(doc, dict):
        return error(f"protocol: not a JSON object: {line[:80]!r}")
    if "error" in doc:
        return error(str(doc["error"]))
    ints = {k: doc.get(k) for k in ("length", "disp_offset", "disp_size", "imm_offset", "imm_size", "target")}
    bad = [k for k, v in ints.items() if v is not None and (not isinstance(v, int) or isinstance(v, bool))]
    if bad or not isinstance(ints["length"], int):
        return error(f"protocol: length must be an int, other fields int or null: {line[:80]!r}")
    disp_size = ints["disp_size"] or 0
    imm_size = ints["imm_size"] or 0
    return Facts(ints["length"], doc.get("prefixes") if isinstance(doc.get("prefixes"), int) else None,
                 ints["disp_offset"], disp_size if ints["disp_offset"] is not None else 0,
                 ints["imm_offset"], imm_size if ints["imm_offset"] is not None else 0,
                 delta(ints["target"], address), None, _unreported(doc))


_KEYS = {"disp": ("disp_offset",), "imm": ("imm_offset",), "target": ("target",)}


def _unreported(doc: dict) -> frozenset[str]:
    return frozenset(f for f, keys in _KEYS.items() if any(k not in doc for k in keys))


class ExternalAdapter:
    """Any command speaking the line protocol above."""

    fields = frozenset({"length", "disp", "imm", "target"})

    def __init__(self, command: str, name: str = "external") -> None:
        self.command = command
        self.name = name

    def version(self) -> str:
        """The command line itself: answers are cached per command."""
        return self.command

    def decode_many(self, items):
        items = list(items)
        if not items:
            return []
        for _, raw in items:
            if not 0 < len(raw) <= MAX_BYTES:
                raise InputError(f"external decoder input must be 1..{MAX_BYTES} bytes, got {len(raw)}")
        text = "".join(f"{address & 0xFFFFFFFFFFFFFFFF:x} {raw.hex()}\n" for address, raw in items)
        try:
            proc = subprocess.Popen(shlex.split(self.command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        except OSError as e:
            raise InputError(f"--decoder-cmd {self.command!r} cannot be started: {e}") from None
        writer = threading.Thread(target=_feed, args=(proc, text), daemon=True)
        writer.start()
        out = proc.stdout.read()
        err = proc.stderr.read()
        writer.join()
        rc = proc.wait()
        lines = out.splitlines()
        if rc != 0 or len(lines) != len(items):
            raise InputError(f"--decoder-cmd {self.command!r} exited {rc} after {len(lines)} answers for "
                             f"{len(items)} inputs: {err.strip()[-200:] or 'no message'}")
        return [parse_answer(line, address) for line, (address, _) in zip(lines, items)]


def _feed(proc, text: str) -> None:
    try:
        proc.stdin.write(text)
        proc.stdin.close()
    except BrokenPipeError:
        pass
