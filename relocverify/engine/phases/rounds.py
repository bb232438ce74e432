"""A phase's shards merged into the store in rounds while the workers go on (``Store.merge_shards_behind``),
the last with the phase's own merge (``Board.merge``): the survey's (what it writes: a warm cache's copied
rows, the functions whose every key the cache answers) and the rows'.  Any number of rounds gives the same
store; more mean smaller merges, each in its own transaction (``sizes.ROWS_ROUNDS``)."""

from __future__ import annotations

from ...schedule.local_pool import Task
from ...store.store import Store
from . import sizes


class RoundMerges:
    """Each worker's tasks with a ``close_shard`` task after each round but the last (``cut``), and each round's
    shards merged once every worker's came back (``arrived``)."""

    def __init__(self, store: Store, workers: int):
        self.store, self.workers = store, workers
        self.closed: dict[int, list[str]] = {}  # round -> the shards closed in it
        self.came: list[int] = []  # round -> workers whose shards of it came back

    def cut(self, pool, tasks: list[list[Task]]) -> list[list[Task]]:
        """``tasks[w]`` (worker w's), cut into rounds: at most a round per task of the shortest queue (a package's
        modules, a task or two each, merge once), one round when any worker may take any task."""
        rounds = max(1, min(sizes.ROWS_ROUNDS, *map(len, tasks))) if pool.pinned else 1
        self.came = [0] * rounds
        return [in_rounds(tasks[w], rounds, w) for w in range(len(tasks))]

    def arrived(self, task: Task, value) -> None:
        """A ``close_shard`` task's value: its shard (or None); the round merged when it is the round's last."""
        r = task.tag[1]
        if value:
            self.closed.setdefault(r, []).append(value)
        self.came[r] += 1
        if self.came[r] == self.workers and r in self.closed:
            self.store.merge_shards_behind(self.closed.pop(r))


def in_rounds(tasks: list[Task], rounds: int, w: int) -> list[Task]:
    """Worker ``w``'s tasks with a ``close_shard`` task (tagged (w, round)) after each of the first ``rounds - 1``
    of ``rounds`` equal parts.  Every worker's queue is cut at the same fractions, so a round's shards hold
    neighbouring functions (the workers' chunks alternate), and the round's merge appends to the store's
    B-trees as one merge at the end did."""
    out: list[Task] = []
    n = len(tasks)
    cut = 0
    for r in range(1, rounds):
        end = n * r // rounds
        out += tasks[cut:end]
        out.append(Task("close_shard", (), (w, r - 1)))
        cut = end
    return out + tasks[cut:]


__all__ = ["RoundMerges", "in_rounds"]
