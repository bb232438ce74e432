"""A phase: one round of tasks on a pool, as the scheduler drives it; it knows no verdicts.

A run is a sequence of phases (the engine's are in ``engine/phases``).  A phase says what each worker is
to do (``queues``), what becomes of each task's value (``done``), and, when a worker dies on an item of a
task, which tasks go again instead (``crashed``: a phase without it lets the pool raise).  ``drive`` runs
one phase on a pool: its progress line (``label`` None: none), its ticks while the workers work, what the
phase does after its tasks whether they ended or raised (``settle``), and after they ended (``ended``,
before its progress line closes; ``finish``, after).  It returns the phase's seconds, everything included.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable

from .local_pool import Task
from .progress import Progress


class Phase(ABC):
    """The base of a phase; a subclass gives ``queues`` and ``done``, and whatever else it needs."""

    label: str | None = None  # its progress line's label; None: the phase shows no progress
    unit: str = ""  # what its progress counts
    shared: bool = False  # every task to the first worker free, tagged with that worker's index
    crashed: Callable[[Task, int, int], list[Task]] | None = None  # (task, item's index, dead pid) -> again

    @abstractmethod
    def queues(self, pool) -> list[list[Task]]:
        """Worker i's tasks, in order, as ``queues(pool)[i]`` (``shared``: one list for all)."""

    @abstractmethod
    def done(self, task: Task, value) -> None:
        """One task's value, in the order they come back."""

    def size(self) -> int:
        """The progress line's total (asked once the queues are made)."""
        return 0

    def shown(self, items: int) -> int:
        """What the progress line shows when the workers have done ``items`` items of this phase."""
        return items

    def settle(self) -> None:
        """After the tasks, whether they ended or raised."""

    def ended(self, progress: Progress) -> None:
        """After the tasks ended, before the progress line closes."""

    def finish(self) -> None:
        """After the progress line closed (a phase's merges): counted in its seconds."""


def drive(pool, phase: Phase, progress: Progress) -> float:
    """Run ``phase`` on ``pool``; its seconds, from its queues made to its ``finish`` done."""
    t0 = time.monotonic()
    queues = phase.queues(pool)
    base = pool.items_done()
    tick = None
    if phase.label is not None:
        progress.phase(phase.label, phase.size(), phase.unit)
        tick = lambda: progress.update(phase.shown(pool.items_done() - base))  # noqa: E731
    try:
        pool.run(queues, phase.done, phase.crashed, tick=tick, shared=phase.shared)
    finally:
        phase.settle()
    if phase.label is not None:
        phase.ended(progress)
        progress.end()
    phase.finish()
    return time.monotonic() - t0


__all__ = ["Phase", "drive"]
