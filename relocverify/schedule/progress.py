"""Progress of a run's phases, on stderr, drawn by rich (``rich.progress``).

On a terminal: a bar per phase, redrawn in place at most four times a second
(by ``update`` itself: no refresh thread, so forking workers mid-phase never
copies a lock some thread holds), then one line saying what the phase did.
Anywhere else (a CI log, a file, a pipe): no bar at all, only that closing
line per phase and the run's notes, so a log stays plain text.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

REDRAW_SECONDS = 0.25


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
        self.done = 0
        self._bars = None
        self._task = None

    def phase(self, label: str, total: int, unit: str) -> None:
        """Start a phase of ``total`` ``unit``s."""
        self._close()
        self.label, self.total, self.unit = label, total, unit
        self.start = self.last = time.monotonic()
        self.done = 0
        if self.enabled and self.tty:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bars, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            console = Console(file=self.stream, force_terminal=True, highlight=False)
            self._bars = Bars(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TextColumn(unit), TimeElapsedColumn(), TimeRemainingColumn(),
                              console=console, auto_refresh=False, transient=True)
            self._bars.start()
            self._task = self._bars.add_task(label, total=total)
            self._bars.refresh()

    def update(self, done: int) -> None:
        self.done = done
        if self._bars is None:
            return
        now = time.monotonic()
        if now - self.last >= REDRAW_SECONDS:
            self.last = now
            self._bars.update(self._task, completed=done)
            self._bars.refresh()

    def end(self) -> None:
        self._close()
        if not self.enabled:
            return
        seconds = time.monotonic() - self.start
        self.done = max(self.done, self.total)
        self._write(f"{self.label}: {self.total:,} {self.unit} in {seconds:.1f} s\n")

    def note(self, text: str) -> None:
        if not self.enabled:
            return
        if self._bars is not None:
            self._bars.console.print(text, markup=False, highlight=False, soft_wrap=True)
            self._bars.refresh()
        else:
            self._write(text + "\n")

    def _close(self) -> None:
        if self._bars is not None:
            bars, self._bars = self._bars, None
            bars.stop()

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()
