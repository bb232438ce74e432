"""The proofs: each key no worker could answer is proved once, its representative (its first instance over
all workers) on whichever worker is free, in key order: a key begins with its kind and then the
instruction's bytes, so neighbours share an opcode, and with it the decoders', libVEX's and the admission's
paths (the order changes no finding).  What each worker will be sent (``board.wanted``) is made as the
findings come in; once ``traced`` is False (a worker died while proving: the fresh one lacks what the dead
one proved; or a task came back without its worker's index), each worker is sent every finding of its keys
instead."""

from __future__ import annotations

from ...proof.verdict import Finding, Verdict
from ...schedule.local_pool import Task
from ...schedule.phase import Phase
from ...store.cache import CachedFinding
from ..worker import Learned
from . import sizes
from .board import Board, wanted


class Proofs(Phase):
    label, unit, shared = "proofs", "distinct instance keys", True

    def __init__(self, board: Board, misses: dict[bytes, tuple[bytes, int]]):
        self.board = board
        self.items = [(k, raw, a) for k, (raw, a) in sorted(misses.items())]

    def queues(self, pool) -> list[list[Task]]:
        return [[Task("prove", (c,)) for c in sizes.chunks(self.items, sizes.PROVE_CHUNK)]]

    def size(self) -> int:
        return len(self.items)

    def done(self, task: Task, value) -> None:
        b = self.board
        b.learned.update(value)
        b.traced = b.traced and task.tag is not None
        if b.traced:
            for w in range(b.pool.n):
                if w != task.tag:
                    wanted(value, b.owned[w], b.outbox[w])

    def crashed(self, task: Task, at: int, pid: int) -> list[Task]:
        key, raw, address = task.args[0][at]
        why = "worker crashed while proving this instruction"
        f = Finding(Verdict.UNKNOWN, why, "crash", "", "", "")
        self.board.learned[key] = Learned(CachedFinding(True, f.verdict.value, why, "crash"), address, f)
        self.board.traced = False
        rest = task.args[0][at + 1:]
        return [Task("prove", (rest,))] if rest else []


__all__ = ["Proofs"]
