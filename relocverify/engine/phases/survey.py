"""The survey: each worker walks its functions, makes every instruction's instance key (``keys``) and keeps
the keys it cannot answer, the cache's hits and the functions it must write later; it writes at once the
functions whose every key it could answer, or whose rows the cache keeps (``row_memo``).  Also the count of
instructions of functions an earlier run stored (``StoredCount``), for the run's expected total."""

from __future__ import annotations

from ...schedule.local_pool import Task
from ...schedule.phase import Phase
from ...schedule.rounds import RoundMerges
from ...schedule.progress import Progress
from . import sizes
from .board import Board


class Survey(Phase):
    label, unit = "survey", "instructions"

    def __init__(self, board: Board, todo: list[int]):
        self.board, self.todo = board, todo
        n_bytes = sum(board.job.functions[f].size for f in todo)  # the progress unit is instructions, so the
        self.estimate = max(1, n_bytes // 4)                      # total is an estimate until the survey ends
        self.rounds = RoundMerges(board.store.merge_shards_behind, board.pool.n, sizes.ROWS_ROUNDS)

    def queues(self, pool) -> list[list[Task]]:
        """Each worker's surveys, cut into rounds whose shards go into the store while the workers go on (what a
        survey writes: a warm cache's copied rows, the functions whose every key the cache answers)."""
        chunks = sizes.chunks(self.todo, sizes.CHUNK_FUNCTIONS)
        gather = pool.pinned  # each worker keeps its keys until its surveys end (``Worker.survey``)
        return self.rounds.cut(pool, [[Task("survey", (c, gather), w) for c in chunks[w::pool.n]]
                                      for w in range(pool.n)])

    def size(self) -> int:
        return self.estimate

    def shown(self, items: int) -> int:
        return min(self.estimate, items)

    def done(self, task: Task, value) -> None:
        if task.method == "close_shard":  # a round's shards go into the store while the workers go on
            self.rounds.arrived(task, value)
            return
        misses, n, known, later, written, reused = value
        b = self.board
        b.owned[task.tag].update(misses)
        b.hits.update(known)
        b.waiting[task.tag].extend(later)
        b.total += n
        b.rows += written
        b.reused += reused

    def crashed(self, task: Task, at: int, pid: int) -> list[Task]:
        if task.method == "close_shard":
            return []  # the dead worker's shards are merged with the phase's last (``leftover_shards``)
        return self.board.crashed_function(task, at, pid)

    def ended(self, progress: Progress) -> None:
        progress.total = self.board.total

    def finish(self) -> None:
        b = self.board
        if b.pool.pinned:  # the keys each worker kept to the end of its surveys
            b.pool.run([[Task("gathered", (), w)] for w in range(b.pool.n)],
                       lambda task, value: b.owned[task.tag].update(value))
        b.merge()


class StoredCount(Phase):
    """The instructions of the functions stored by an earlier run; ``n`` once driven."""

    def __init__(self, done: list[int]):
        self.fids, self.n = done, 0

    def queues(self, pool) -> list[list[Task]]:
        chunks = sizes.chunks(self.fids, sizes.COUNT_CHUNK)
        return [[Task("count", (c,)) for c in chunks[w::pool.n]] for w in range(pool.n)]

    def done(self, task: Task, value) -> None:
        self.n += value


__all__ = ["Survey", "StoredCount"]
