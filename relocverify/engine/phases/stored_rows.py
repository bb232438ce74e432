"""A pass over the stored rows (``engine.passes.StoredPass``) for one image: the image's functions with rows, by
their positions in function order, cut into chunks of ``sizes.STORED_CHUNK``, each worker its share, each
worker reading its chunks from the store itself (``passes.StoredReader``); every chunk's value handed to the
pass's ``StoredMerge`` in function order, a chunk that comes back early kept until those before it are in.
Its product is the pass's section of the image's summary (``section``, once driven).

A worker that dies in a chunk takes that chunk's value with it: the chunk goes again whole, to the fresh
worker in its place, so the merged values are those of a run where nothing died; a second death in the same
chunk is an error (a function that kills every worker that reads it)."""

from __future__ import annotations

from ...schedule.local_pool import Task, WorkerError
from ...schedule.phase import Phase
from . import sizes


class StoredRows(Phase):
    unit = "functions"

    def __init__(self, image, image_id: int, index: int, p, functions: int):
        """``p``: the job's ``index``-th stored pass; ``functions``: how many functions of the image, at most, have
        stored rows (its functions in the store, or fewer with a limit): a range past the last is empty."""
        self.image_id, self.index, self.p = image_id, index, p
        self.label = p.name
        self.ranges = [(lo, min(lo + sizes.STORED_CHUNK, functions)) for lo in range(0, functions, sizes.STORED_CHUNK)]
        self.number = {lo: j for j, (lo, _) in enumerate(self.ranges)}  # a range's first position -> its chunk
        self.merge = p.merger(image, image_id)
        self.waiting: dict[int, object] = {}  # chunk number -> its value, come back before an earlier chunk's
        self.next = 0  # the chunk whose value the merge takes next
        self.deaths: dict[int, int] = {}
        self.pool = None
        self.section: dict | None = None

    def queues(self, pool) -> list[list[Task]]:
        if not pool.pinned:
            raise WorkerError(f"the stored pass {self.p.name} reads the store in its workers: run it on a local pool")
        self.pool = pool
        tasks = [Task("stored_rows", (self.index, self.image_id, lo, hi), j % pool.n)
                 for j, (lo, hi) in enumerate(self.ranges)]
        return [[t for t in tasks if t.tag == w] for w in range(pool.n)]

    def size(self) -> int:
        return self.ranges[-1][1] if self.ranges else 0

    def shown(self, items: int) -> int:
        return min(items, self.size())

    def done(self, task: Task, value) -> None:
        self.waiting[self.number[task.args[2]]] = value
        while self.next in self.waiting:
            self.merge.add(self.waiting.pop(self.next))
            self.next += 1

    def crashed(self, task: Task, at: int, pid: int) -> list[Task]:
        lo, hi = task.args[2:4]
        self.deaths[lo] = self.deaths.get(lo, 0) + 1
        if self.deaths[lo] > 1:
            raise WorkerError(f"the stored pass {self.p.name}: a worker died twice in the functions at positions "
                              f"{lo}..{hi - 1} (again at position {lo + at})")
        return [task]  # its value died with the worker: the whole chunk again, first in the fresh worker's queue

    def finish(self) -> None:
        self.pool.broadcast("stored_rows_done", lambda w: ())
        if self.next != len(self.ranges):
            raise WorkerError(f"the stored pass {self.p.name}: {len(self.ranges) - self.next} chunk(s) never merged")
        self.section = self.merge.section()


__all__ = ["StoredRows"]
