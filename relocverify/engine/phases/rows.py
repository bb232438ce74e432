"""The rows: each worker is sent the findings of its keys that other workers made (``Board.sent``) and writes
its other functions' rows; each instruction takes its key's finding (instances whose key cannot stand for
them are proved one by one), and kernel sites and their variants are applied.  A round's shards go into the
store while the workers go on, and the proof cache is written behind (``harvest.Behind``) from the first
result on, once every worker has its findings (every queue's first task), not before: the writing thread
would slow the making of the messages."""

from __future__ import annotations

from ...schedule.local_pool import Task
from ...schedule.phase import Phase
from ...schedule.rounds import RoundMerges
from . import sizes
from .board import Board
from .harvest import Behind, harvest


class Rows(Phase):
    label, unit = "rows", "instructions"

    def __init__(self, board: Board):
        self.board = board
        self.rounds = RoundMerges(board.store.merge_shards_behind, board.pool.n, sizes.ROWS_ROUNDS,
                                  sizes.ROWS_LAST_SHARE)
        self.keeping: list[Behind | None] = []  # the cache's writer, once started

    def queues(self, pool) -> list[list[Task]]:
        """Each worker's queue: its findings first (a pinned pool: as the first task, so one starts on its rows
        while the parent makes the other's message), then its rows tasks cut into rounds (``RoundMerges``)."""
        b = self.board
        if pool.pinned:
            queues = [[Task("accept", (), w, late=lambda w=w: (b.sent(w),))] for w in range(pool.n)]
        else:
            pool.broadcast("accept", lambda w: (b.sent(w),))
            queues = [[] for _ in range(pool.n)]
        pool.remember("accept", (b.learned,))  # a worker forked in a dead one's place is given every finding
        # a worker with no rows of its own left takes another's last (its surveyed keys are walked again there)
        tasks = [[Task("rows", (c,), w, stealable=True) for c in sizes.chunks(b.waiting[w], sizes.CHUNK_FUNCTIONS)]
                 for w in range(pool.n)]
        return [q + cut for q, cut in zip(queues, self.rounds.cut(pool, tasks))]

    def size(self) -> int:
        return self.board.total - self.board.rows

    def done(self, task: Task, value) -> None:
        self._keep_behind()  # every queue's first task, its findings, was sent before any result came back
        if task.method == "rows":
            self.board.rows += value
        elif task.method == "close_shard":  # a round's shards go into the store while the workers go on
            self.rounds.arrived(task, value)

    def crashed(self, task: Task, at: int, pid: int) -> list[Task]:
        if task.method == "accept":
            return []  # its replacement was given every finding (``remember``)
        if task.method == "close_shard":
            return []  # the dead worker's shards are merged with the phase's last (``leftover_shards``)
        return self.board.crashed_function(task, at, pid)

    def settle(self) -> None:
        self._keep_behind()
        if self.keeping[0] is not None:
            self.keeping[0].join()

    def finish(self) -> None:
        self.board.merge()
        self.board.close()

    def _keep_behind(self) -> None:
        if not self.keeping:
            b = self.board
            self.keeping.append(harvest(b.pool, b.cache, b.tag, b.job.cached, behind=True, ask=False))


__all__ = ["Rows"]
