"""What a guest's serial console says, read back into values.

The guest's script (``script.py``) and its helper (``programs/rvctl.c``) report on the console in
lines starting ``RVC:``, each written whole by one ``write(2)``; the kernel's own messages (an oops,
a warning) interleave with them.  ``read_console(text)`` returns a ``Console``: the phases reached,
the live bytes read from ``/proc/kcore`` in each phase, the result of every write to a tracing file,
the tracer's own listings (``kprobes/list``, ``kprobe_profile``, ``uprobe_profile``, ``error_log``),
the trigger's report, and the kernel's fault lines (``FAULT``) with the phase they came in.  A
marker may follow the start of a kernel message on the same line (the console interleaves by
bytes): it is read from where ``RVC:`` starts.  Pure: text in, values out.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, replace

MARK = "RVC:"
#: Kernel lines that report a fault or a failure: an oops, a BUG, a panic, a lockup, a user fault.
FAULT = re.compile(r"BUG: |Oops|general protection fault|kernel BUG at|Kernel panic|invalid opcode|double fault|"
                   r"stack segment|WARNING: CPU|soft lockup|hard LOCKUP|rcu: INFO|rcu_sched self-detected|"
                   r"segfault at|trap invalid opcode|traps: |Unable to handle|unable to handle")
_STAMP = re.compile(r"^\[\s*\d+\.\d+\]\s?")
PHASES = ("begin", "probe", "trigger", "after", "end")


@dataclass(frozen=True)
class Write:
    """One ``rvctl write``: errno 0 when it was accepted, else its number, name and message."""

    file: str
    errno: int
    name: str = ""
    message: str = ""
    probe: str = ""  # the event of the probe being placed (``RVC:probe EVENT``) when it was written


@dataclass(frozen=True)
class TriggerReport:
    status: str  # 'exit' | 'signal' | 'timeout'
    code: int | None  # the exit status or the signal number
    digest: str
    bytes: int
    lines: int
    output: tuple[str, ...]  # its first lines

    def same_as(self, other: "TriggerReport") -> bool:
        return (self.status, self.code, self.digest, self.bytes) == (other.status, other.code, other.digest, other.bytes)

    def describe(self) -> str:
        """``exited 0 (15,216 bytes of output, digest ...)``"""
        how = {"exit": f"exited {self.code}", "signal": f"was killed by signal {self.code}",
               "timeout": "did not finish"}[self.status]
        return f"{how} ({self.bytes:,} bytes of output, digest {self.digest})"


@dataclass(frozen=True)
class Console:
    text: str
    lines: tuple[str, ...]
    phases: tuple[str, ...]  # the phase markers reached, in order
    uptime: float | None  # the guest's uptime when its script started
    live: tuple[tuple[str, int, str], ...]  # (phase, address, hex or 'unreadable ...')
    writes: tuple[tuple[str, Write], ...]  # (phase, write)
    listing: tuple[tuple[str, str, str], ...]  # (kind, line, the probe being placed): list, profile, errlog, ...
    trigger: TriggerReport | None
    faults: tuple[tuple[str, int], ...]  # (phase, index into lines) of each fault line
    times: tuple[tuple[str, float], ...] = ()  # (phase, the guest's uptime when it began)

    def reached(self, phase: str) -> bool:
        return phase in self.phases

    def live_in(self, phase: str) -> tuple[int, str] | None:
        return next(((a, h) for p, a, h in self.live if p == phase), None)

    def listed(self, kind: str, probe: str | None = None) -> tuple[str, ...]:
        """The lines of one kind (of one probe's placement, for errlog)."""
        return tuple(line for k, line, p in self.listing if k == kind and (probe is None or p == probe))

    def live_at(self, phase: str, address: int) -> str | None:
        return next((h for p, a, h in self.live if p == phase and a == address), None)

    def faults_from(self, phase: str) -> tuple[int, ...]:
        """Indices of the fault lines printed in ``phase`` or after it."""
        later = PHASES[PHASES.index(phase):]
        return tuple(i for p, i in self.faults if p in later)

    def excerpt(self, start: int, before: int = 0, after: int = 40) -> tuple[str, ...]:
        """The console lines around line ``start`` (a fault): the report up to its end marker."""
        out = []
        for line in self.lines[max(0, start - before):start + after]:
            out.append(line)
            if "---[ end trace" in line or "---[ end Kernel panic" in line:
                break
        return tuple(out)


def read_console(text: str) -> Console:
    lines = tuple(line.rstrip("\r") for line in text.replace("\r\n", "\n").split("\n"))
    phase = "boot"
    phases: list[str] = []
    live, writes, listing, faults, output, times = [], [], [], [], [], []
    uptime = None
    trigger = None
    current = ""
    for index, line in enumerate(lines):
        at = line.find(MARK)
        if at < 0:
            if FAULT.search(line):
                faults.append((phase, index))
            continue
        if at > 0 and FAULT.search(line[:at]):
            faults.append((phase, index))
        kind, _, rest = line[at + len(MARK):].partition(" ")
        if kind == "phase" and rest.split(" ", 1)[0] in PHASES:
            phase = rest.split(" ", 1)[0]
            phases.append(phase)
            words = rest.split()
            if len(words) > 1 and _float(words[1]) is not None:
                times.append((phase, _float(words[1])))
        elif kind == "up":
            uptime = _float(rest.split()[0] if rest.split() else "")
        elif kind == "live":
            address, _, value = rest.partition(" ")
            live.append((phase, int(address, 16), value.strip()))
        elif kind == "probe":
            current = rest.strip()
        elif kind == "write":
            writes.append((phase, replace(_write(rest), probe=current)))
        elif kind == "out":
            output.append(rest)
        elif kind == "trigger":
            trigger = _trigger(rest, tuple(output))
        elif kind in ("list", "profile", "errlog", "module", "note"):
            listing.append((kind, rest, current))
    return Console(text, lines, tuple(phases), uptime, tuple(live), tuple(writes), tuple(listing), trigger,
                   tuple(faults), tuple(times))


def shows_fault(data: bytes) -> bool:
    """Whether a piece of console output holds a kernel fault line (``FAULT``)."""
    return FAULT.search(data.decode("utf-8", "replace")) is not None


def message(line: str) -> str:
    """A console line without its printk timestamp."""
    return _STAMP.sub("", line)


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _write(rest: str) -> Write:
    # "FILE 0" or "FILE ERRNO NAME: MESSAGE"
    parts = rest.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        return Write(parts[0] if parts else "", -1, "", rest)
    if parts[1] == "0":
        return Write(parts[0], 0)
    name, _, text = (parts[2] if len(parts) > 2 else "").partition(": ")
    number = int(parts[1])
    if name in ("", "-"):  # a shell's report: the number alone
        name = errno.errorcode.get(number, "")
        text = f"{text} ({os.strerror(number)})" if text else os.strerror(number)
    return Write(parts[0], number, name, text)


def _trigger(rest: str, output: tuple[str, ...]) -> TriggerReport | None:
    # "exit N digest HEX bytes N lines N" | "signal N ..." | "timeout digest HEX ..."
    words = rest.split()
    if not words:
        return None
    status = words[0]
    code = int(words[1]) if status in ("exit", "signal") and len(words) > 1 and words[1].isdigit() else None
    fields = {word: words[i + 1] for i, word in enumerate(words[:-1]) if word in ("digest", "bytes", "lines")}
    try:
        return TriggerReport(status, code, fields.get("digest", ""), int(fields.get("bytes", 0)),
                             int(fields.get("lines", 0)), output)
    except ValueError:
        return None
