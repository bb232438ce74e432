"""A phase's shards merged in rounds while the workers go on.  Every worker writes what it finds to a shard of its
own, which its ``close_shard`` task closes (``kinds.WorkerKind``); a phase cut into rounds has each worker close
its shard at the same fractions of its queue, and hands each round's shards to ``merge`` once every worker's
came back (the engine's: ``Store.merge_shards_behind``, on a thread of the store's), the last round's with the
phase's own merge.  Any number of rounds gives the same store; more mean smaller merges, each in its own
transaction.  The engine's survey and rows phases use it (``engine/phases``)."""

from __future__ import annotations

from collections.abc import Callable

from .local_pool import Task


class RoundMerges:
    """Each worker's tasks with a ``close_shard`` task after each round but the last (``cut``), and each round's
    shards handed to ``merge`` once every worker's came back (``arrived``); at most ``rounds`` rounds."""

    def __init__(self, merge: Callable[[list[str]], None], workers: int, rounds: int, last_share: float | None = None):
        """``last_share``: the part of each queue the last round takes (None: an equal part), the rest cut into
        equal rounds.  The last round's merge is the one the workers do not run beside: the smaller it is, the
        sooner the phase ends."""
        self.merge, self.workers, self.rounds, self.last_share = merge, workers, rounds, last_share
        self.closed: dict[int, list[str]] = {}  # round -> the shards closed in it
        self.came: list[int] = []  # round -> workers whose shards of it came back

    def cut(self, pool, tasks: list[list[Task]]) -> list[list[Task]]:
        """``tasks[w]`` (worker w's), cut into rounds: at most a round per task of the shortest queue (a package's
        modules, a task or two each, merge once), one round when any worker may take any task."""
        rounds = max(1, min(self.rounds, *map(len, tasks))) if pool.pinned else 1
        self.came = [0] * rounds
        return [in_rounds(tasks[w], rounds, w, self.last_share) for w in range(len(tasks))]

    def arrived(self, task: Task, value) -> None:
        """A ``close_shard`` task's value: its shard (or None); the round merged when it is the round's last."""
        r = task.tag[1]
        if value:
            self.closed.setdefault(r, []).append(value)
        self.came[r] += 1
        if self.came[r] == self.workers and r in self.closed:
            self.merge(self.closed.pop(r))


def in_rounds(tasks: list[Task], rounds: int, w: int, last_share: float | None = None) -> list[Task]:
    """Worker ``w``'s tasks with a ``close_shard`` task (tagged (w, round)) after each of the first ``rounds - 1``
    of ``rounds`` parts: equal parts, or the last ``last_share`` of the queue (at least one task) and the rest cut
    equally.  Every worker's queue is cut at the same fractions, so a round's shards hold neighbouring functions
    (the workers' chunks alternate), and the round's merge appends to the store's B-trees as one merge at the
    end did."""
    out: list[Task] = []
    n = len(tasks)
    head = n if last_share is None or rounds < 2 else max(rounds - 1, min(n - 1, round(n * (1 - last_share))))
    cut = 0
    for r in range(1, rounds):
        end = n * r // rounds if last_share is None else head * r // (rounds - 1)
        out += tasks[cut:end]
        out.append(Task("close_shard", (), (w, r - 1)))
        cut = end
    return out + tasks[cut:]


__all__ = ["RoundMerges", "in_rounds"]
