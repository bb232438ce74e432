"""A pass added from outside (``engine.passes.FunctionPass``) over the image's functions it has no rows for,
its rows written as they come; a function a worker dies on gets no rows (a rerun tries it again).  Its
section of the summary is made from every stored row."""

from __future__ import annotations

from ...schedule.local_pool import Task
from ...schedule.phase import Phase
from ...store.store import Store
from . import sizes


class PassRows(Phase):
    unit = "functions"

    def __init__(self, store: Store, image_id: int, index: int, p):
        """``p``: the job's ``index``-th pass."""
        self.store, self.image_id, self.index, self.p = store, image_id, index, p
        self.label = p.name
        self.fids = store.functions_without_pass(image_id, p.name)
        self.summary: dict | None = None

    def queues(self, pool) -> list[list[Task]]:
        chunks = sizes.chunks(self.fids, sizes.PASS_CHUNK)
        return [[Task("pass_rows", (self.index, c), w) for c in chunks[w::pool.n]] for w in range(pool.n)]

    def size(self) -> int:
        return len(self.fids)

    def done(self, task: Task, value) -> None:
        self.store.write_pass_rows(self.p.name, value)

    def crashed(self, task: Task, at: int, pid: int) -> list[Task]:
        rest = task.args[1][at + 1:]
        return [Task(task.method, (self.index, rest), task.tag)] if rest else []

    def finish(self) -> None:
        p = self.p
        self.summary = p.summarize(p.row(*r) for r in self.store.iter_pass_rows(self.image_id, p.name))


__all__ = ["PassRows"]
