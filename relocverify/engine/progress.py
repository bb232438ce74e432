"""Progress of a run's phases, on stderr.

On a terminal: one line per phase, redrawn in place (carriage return) at
most twice a second.  Anywhere else (a CI log, a file): a plain line when a
phase starts, then one every 10% or every 30 s, whichever comes first, and
one when it ends; never a carriage return, so a log stays readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, enabled: bool = True, stream: TextIO | None = None, tty: bool | None = None):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty() if tty is None else tty
        self.label = ""
        self.unit = ""
        self.total = 0
        self.start = 0.0
        self.last = 0.0
        self.last_fraction = 0.0
        self.done = 0

    def phase(self, label: str, total: int, unit: str) -> None:
        """Start a phase of ``total`` ``unit``s."""
        self.label, self.total, self.unit = label, total, unit
        self.start = self.last = time.monotonic()
        self.last_fraction, self.done = 0.0, 0
        if self.enabled and not self.tty:
            self._write(f"{label}: {total:,} {unit}\n")

    def update(self, done: int) -> None:
        self.done = done
        if not self.enabled:
            return
        now = time.monotonic()
        fraction = done / self.total if self.total else 1.0
        if self.tty:
            if now - self.last >= 0.5:
                self.last = now
                self._write("\r" + self._line(now) + " ")
        elif fraction - self.last_fraction >= 0.1 or now - self.last >= 30:
            self.last, self.last_fraction = now, fraction
            self._write(self._line(now) + "\n")

    def end(self) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        self.done = max(self.done, self.total)
        self._write(("\r" if self.tty else "") + self._line(now) + f", done in {now - self.start:.1f} s\n")

    def note(self, text: str) -> None:
        if self.enabled:
            self._write(("\n" if self.tty and self.label else "") + text + "\n")

    def _line(self, now: float) -> str:
        elapsed = max(now - self.start, 1e-9)
        rate = self.done / elapsed
        pct = 100.0 * self.done / self.total if self.total else 100.0
        eta = (self.total - self.done) / rate if rate > 0 and self.done < self.total else 0
        text = f"{self.label}: {self.done:,}/{self.total:,} {self.unit} ({pct:.0f}%), {rate:,.0f}/s"
        return text + (f", ETA {eta:,.0f} s" if eta else "")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()
