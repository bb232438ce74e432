"""What the verdict phases (survey, proofs, rows) hand each other for one image, and what they share: the
pool, the job, the store and the proof cache, the functions a worker died on, and the merges of the
workers' shards into the store."""

from __future__ import annotations

from dataclasses import dataclass

from ...schedule.local_pool import Task
from ...store.cache import ProofCache
from ...store.shard import leftover_shards
from ...store.store import Store
from ..worker import Job, Learned, Worker


@dataclass(frozen=True)
class PhaseCounts:
    """What the survey, proofs and rows phases did: the instructions of the functions they walked, the
    distinct instance keys (``keys``), of which the persistent cache knew ``cached`` and ``proved`` were
    proved now, and the rows written; ``reused`` functions' rows were copied from the cache
    (``row_memo``), their instance keys not counted (they were not made)."""

    instructions: int = 0
    keys: int = 0
    cached: int = 0
    proved: int = 0
    rows: int = 0
    reused: int = 0


class Board:
    """The verdict phases' shared state.

    ``owned[w]``: the keys worker w surveyed and could not answer, each with its first instance (the
    representative is the first over all workers: ``misses``); ``hits``: the keys the cache knew;
    ``waiting[w]``: the functions worker w writes in the rows phase; ``learned``: every finding the proofs
    made; ``outbox[w]``: those that worker w is sent (made as they come in while ``traced``); ``total``,
    ``rows``, ``reused``: instructions walked, rows written, functions' rows copied from the cache."""

    def __init__(self, pool, job: Job, store: Store, cache: ProofCache, tag: bytes, config: str):
        """``config``: the configuration's text the run's rows are stored under (``engine.run``)."""
        self.pool, self.job, self.store, self.cache, self.tag, self.config = pool, job, store, cache, tag, config
        self.fallback: list[Worker] = []  # the worker of this process that writes what a dead worker left
        self.total = 0
        self.rows = self.reused = 0
        self.merged: dict[int, int] = {}  # provisional outcome id -> store id, of merges since the last ``merge``
        self.owned: list[dict] = [{} for _ in range(pool.n)]
        self.hits: set[bytes] = set()
        self.waiting: list[list[int]] = [[] for _ in range(pool.n)]
        self.learned: dict[bytes, Learned] = {}
        self.outbox: list[dict[bytes, Learned]] = [{} for _ in range(pool.n)]
        self.traced = True

    def counts(self, misses: int) -> PhaseCounts:
        return PhaseCounts(self.total, misses + len(self.hits), len(self.hits), misses, self.rows, self.reused)

    def merge(self) -> None:
        """At the end of a phase: every worker's shard into the store, and the store's ids of the
        provisional outcome ids to every worker."""
        paths = self.pool.close_shards() + [w.close_shard() for w in self.fallback]
        final = self.merged | self.store.merge_shards([p for p in paths if p] + leftover_shards(self.job.store_path))
        self.merged.clear()
        if final:
            self.pool.broadcast("learn_ids", lambda w: (final,))
            self.pool.remember("learn_ids", (final,))
            for w in self.fallback:
                w.learn_ids(final)

    def crashed_function(self, task: Task, at: int, pid: int) -> list[Task]:
        """A worker died on function ``task.args[0][at]``: it is stored as crashed, the dead worker's
        shard (whole functions it finished) is merged, and every function of the task not stored
        yet goes to a fresh worker."""
        fids = task.args[0]
        if not self.fallback:
            self.fallback.append(Worker(self.job))
        w = self.fallback[0]
        n = w.crashed(fids[at], "worker crashed while verifying this function")
        if task.method == "survey":
            self.total += n
        self.merged.update(self.store.merge_shards(leftover_shards(self.job.store_path, pid) + [w.close_shard()]))
        stored = self.store.verified_functions_among(fids, self.config)
        rest = [f for f in fids if f not in stored]
        return [Task(task.method, (rest,) + task.args[1:], task.tag)] if rest else []

    def misses(self) -> dict[bytes, tuple[bytes, int]]:
        """Every key no worker could answer, with its representative: the first instance over all workers."""
        misses: dict[bytes, tuple[bytes, int]] = {}
        for owned in self.owned:
            for key, rep in owned.items():
                if key not in misses or rep[1] < misses[key][1]:
                    misses[key] = rep
        return misses

    def sent(self, w: int) -> dict[bytes, Learned]:
        """What worker ``w`` is sent before its rows: the findings of its keys that it did not make."""
        return self.outbox[w] if self.traced else wanted(self.learned, self.owned[w])

    def close(self) -> None:
        for w in self.fallback:
            w.close()


def wanted(found: dict[bytes, Learned], owned: dict[bytes, tuple[bytes, int]],
           out: dict[bytes, Learned] | None = None) -> dict[bytes, Learned]:
    """The findings of ``found`` that a worker is sent, added to ``out``: those of the keys its functions hold
    (``owned``: its first instance of each key), the representative's own finding (its counterexample, its
    fresh mark) only when the representative is that instance, as no other instance is that one.  Sending a
    worker every finding would give the same rows, later (the messages are made between the phases)."""
    out = {} if out is None else out
    for k, hit in found.items():
        mine = owned.get(k)
        if mine is not None:
            out[k] = hit if hit.address == mine[1] else Learned(hit.cached)
    return out


__all__ = ["Board", "PhaseCounts", "wanted"]
