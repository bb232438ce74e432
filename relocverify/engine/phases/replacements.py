"""The replacements: every alternative's replacement (``kernel`` sites), verified instruction by instruction at
its live address, into the store; the summary's ``alternative_replacements`` from what the store holds."""

from __future__ import annotations

from ...schedule.local_pool import Task
from ...schedule.phase import Phase
from ...store.store import Store
from ..summary import replacement_summary
from . import sizes


class Replacements(Phase):
    label, unit = "replacements", "alternatives"

    def __init__(self, job, store: Store, image_id: int):
        self.store, self.image_id = store, image_id
        self.indexes = list(range(sum(1 for _ in job.sites.iter_sites("alternative"))))
        self.rows: list[tuple] = []
        self.alternatives: set[int] = set()
        self.summary: dict | None = None

    def queues(self, pool) -> list[list[Task]]:
        chunks = sizes.chunks(self.indexes, sizes.REPLACEMENT_CHUNK)
        return [[Task("replacements", (c,)) for c in chunks[w::pool.n]] for w in range(pool.n)]

    def size(self) -> int:
        return len(self.indexes)

    def shown(self, items: int) -> int:
        return len(self.alternatives)

    def done(self, task: Task, value) -> None:
        self.rows.extend(value)
        self.alternatives.update(r[0] for r in value)

    def finish(self) -> None:
        self.store.write_replacements(self.image_id, self.rows)
        self.summary = replacement_summary(self.store.replacement_rows(self.image_id), len(self.indexes))


__all__ = ["Replacements"]
