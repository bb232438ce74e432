"""An external decoder command behind ``protocol.Decoder``.

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
import os
import selectors
import shlex
import signal
import subprocess
import threading
import time

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


#: Per-answer limits: a decoder that stays silent this long, or writes more than this, is stopped.
ANSWER_SECONDS = 10.0
MAX_LINE = 4096
STDERR_TAIL = 2048


class ExternalAdapter:
    """Any command speaking the line protocol above.

    The command runs in its own process group.  Its stdin is fed and its stderr drained (keeping only the
    last ``STDERR_TAIL`` bytes) by threads, so a command that writes much to stderr cannot block on a full
    pipe; its answers are read line by line, each within ``ANSWER_SECONDS`` of the last and at most
    ``MAX_LINE`` bytes, no more lines than inputs.  A command that stalls, floods or dies is killed, reaped,
    and reported as one ``InputError`` line naming the command and what it did (exit 2)."""

    fields = frozenset({"length", "disp", "imm", "target"})
    option = "--decoder-cmd"  # how the user named the command, for the messages

    def __init__(self, command: str, name: str = "external", answer_seconds: float = ANSWER_SECONDS) -> None:
        self.command = command
        self.name = name
        self.answer_seconds = answer_seconds

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
        lines = self.exchange(text, len(items))
        return [parse_answer(line, address) for line, (address, _) in zip(lines, items)]

    def exchange(self, text: str, n: int) -> list[str]:
        """Run the command once with ``text`` (``n`` lines) on its stdin: its ``n`` answer lines, under the
        hygiene the class doc describes; every failure an ``InputError`` naming ``self.option``."""
        try:
            argv = shlex.split(self.command)
        except ValueError as e:
            raise InputError(f"{self.option} {self.command!r} is not a command line: {e}") from None
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as e:
            raise InputError(f"{self.option} {self.command!r} cannot be started: {e.strerror or e}") from None
        tail = _Tail(proc.stderr)
        threading.Thread(target=_feed, args=(proc, text.encode()), daemon=True).start()
        try:
            lines = self._answers(proc, n, tail)
            rc = proc.wait(timeout=self.answer_seconds)
        except subprocess.TimeoutExpired:
            self._stop(proc)
            raise InputError(f"{self.option} {self.command!r} answered every input but did not exit within "
                             f"{self.answer_seconds:g} s: killed") from None
        finally:
            if proc.poll() is None:
                self._stop(proc)
            tail.join()
        if rc != 0:
            raise InputError(f"{self.option} {self.command!r} exited {rc} after {len(lines)} answers for "
                             f"{n} inputs: {tail.text() or 'no message'}")
        return lines

    def _answers(self, proc, n: int, tail: "_Tail") -> list[str]:
        lines: list[str] = []
        buf = b""
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + self.answer_seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._stop(proc)
                if len(lines) == n and not buf:
                    raise InputError(f"{self.option} {self.command!r} answered every input but did not exit "
                                     f"within {self.answer_seconds:g} s: killed")
                raise InputError(f"{self.option} {self.command!r} gave no answer for {self.answer_seconds:g} s "
                                 f"after {len(lines)} of {n} (it stalls): killed")
            if not sel.select(left):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                lines.append(line.decode("utf-8", "replace"))
                deadline = time.monotonic() + self.answer_seconds
                if len(lines) > n:
                    self._stop(proc)
                    raise InputError(f"{self.option} {self.command!r} wrote more answers than the {n} inputs "
                                     f"(it floods): killed")
            if len(buf) > MAX_LINE:
                self._stop(proc)
                raise InputError(f"{self.option} {self.command!r} wrote a line longer than {MAX_LINE} bytes "
                                 f"(answer {len(lines) + 1}): killed")
            # every answer in: read on to the end of its output, so that an extra line is seen as a flood
            # (and a command that keeps its output open is stopped at the deadline)
        if buf.strip():
            lines.append(buf.decode("utf-8", "replace"))
        if len(lines) != n:
            try:
                rc = proc.wait(timeout=1)
                what = f"exited {rc}"
            except subprocess.TimeoutExpired:
                what = "closed its output"
            self._stop(proc)
            tail.join(timeout=1)
            raise InputError(f"{self.option} {self.command!r} {what} after {len(lines)} answers for {n} inputs: "
                             f"{tail.text() or 'no message'}")
        return lines

    @staticmethod
    def _stop(proc) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class _Tail(threading.Thread):
    """Drains a pipe, keeping its last ``STDERR_TAIL`` bytes."""

    def __init__(self, pipe) -> None:
        super().__init__(daemon=True)
        self.pipe, self.data = pipe, b""
        self.start()

    def run(self) -> None:
        try:
            for chunk in iter(lambda: self.pipe.read1(65536), b""):
                self.data = (self.data + chunk)[-STDERR_TAIL:]
        except (OSError, ValueError):
            pass

    def text(self) -> str:
        return " ".join(self.data.decode("utf-8", "replace").split())[-200:]


def _feed(proc, data: bytes) -> None:
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass
