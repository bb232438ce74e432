"""Where a run's tasks execute: a pool of forked local worker processes.

``LocalPool(kind, job, n)`` forks ``n`` processes that each build one worker
(``kind.make``: the engine's is ``engine.worker.Worker``) from the job and
keep it for the whole run, so what a worker learns in one
phase (its survey's keys, the findings it was given or made) serves the
next.  A task is a call of a worker's method, sent to a chosen worker, or
with ``shared=True`` to whichever worker is free; each worker runs its
tasks one at a time, in the order given.  A worker has its next task in its
pipe before it ends the one in hand (``IN_FLIGHT``), so it never waits while
the parent takes a result in; ``IN_FLIGHT`` 1 gives the same results, later.

Faults: a worker that dies (a crash in a native library, an OOM kill) is
replaced by a fresh fork, told again what the run has learned so far, and
the task it was on is handed to ``on_crash`` together with the index of the
item in hand (which the worker publishes before each item) and the dead
process's id, so the caller decides what to retry and what to mark as
crashed.  ``jobs=1`` runs in
process, without forking.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
import traceback
from collections import deque
from dataclasses import dataclass, replace
from multiprocessing.connection import wait
from multiprocessing.reduction import ForkingPickler
from typing import Callable

from ..errors import RelocverifyError
from ..processes import REFUSED_EXIT, StderrTap, die_with_parent, ended_why, refused, refused_worker
from .kinds import WorkerKind
from .smt_helper import helper_checker


@dataclass
class Task:
    method: str
    args: tuple
    tag: object = None  # the caller's own label, handed back with the result
    # more arguments, made when the task is sent to its worker (what other workers learned meanwhile)
    late: Callable[[], tuple] | None = None
    # another worker may run it when its own queue is empty (a pinned pool: ``_Dispatch.steal``)
    stealable: bool = False

    def call_args(self) -> tuple:
        return self.args + self.late() if self.late is not None else self.args


#: Tasks sent to a worker and not answered yet, at most: the one in hand and the next.
IN_FLIGHT = 2
#: The largest message sent to a worker that is busy: well inside a socket's buffer (212,992 bytes on Linux).
PIPE_SAFE = 64 * 1024


class WorkerError(RelocverifyError):
    """A task raised an exception inside a worker (a bug): its traceback's last line."""


def _serve(kind: WorkerKind, job, conn, progress, current, index: int, smt_address: str | None = None,
           tap: StderrTap | None = None) -> None:
    if tap is not None:
        tap.attach()
    die_with_parent()  # a run killed with SIGKILL leaves no worker behind (once its task is done, if refused)
    try:
        kind.in_process()
        worker = kind.make(job, helper_checker(smt_address))  # its SMT checks go to the session's helper, if one runs
    except Exception as exc:
        if refused(exc) is None:
            raise
        os._exit(REFUSED_EXIT)  # the parent names the limit (``died``), not this process's traceback

    def tell(n: int) -> None:
        progress[index] += n

    def hand(i: int) -> None:
        current[index] = i

    worker.progress, worker.current = tell, hand
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                break
            method, args = msg
            current[index] = 0
            # What a worker keeps for the run (keys, findings) only grows: freezing it takes it out of
            # the collector's way, which otherwise walks millions of long-lived tuples in every full pass.
            gc.freeze()
            try:
                value = getattr(worker, method)(*args)
                if method in kind.harvested_with:  # what it proved travels with its value (no harvest task waits for it)
                    conn.send(("harvested", (value, worker.harvest())))
                else:
                    conn.send(("ok", value))
            except Exception as exc:
                conn.send(("refused" if refused(exc) is not None else "error", traceback.format_exc()))
    except (EOFError, KeyboardInterrupt):
        pass
    finally:
        worker.close()
        conn.close()


class LocalPool:
    #: Each worker runs its own queue's tasks, in order: a worker may keep what its tasks found for a later task.
    pinned = True

    def __init__(self, kind: WorkerKind, job, jobs: int, smt_address: str | None = None):
        """``smt_address``: where the session's SMT helper listens (``smt_helper``), for the workers forked."""
        self.kind = kind
        self.job = job
        self.smt_address = smt_address
        self.n = max(1, jobs)
        self.inline = jobs <= 1
        self._stopped = False  # ``stop``: its workers were told to end
        self._replay: list[tuple[str, tuple]] = []  # calls every fresh worker gets before its next task
        self._harvested = kind.empty_harvest()  # what tasks in ``kind.harvested_with`` brought back with their values
        if self.inline:
            self.worker = kind.make(job, None)
            self.done_items = 0
            self.worker.progress = self._inline_progress
            return
        ctx = multiprocessing.get_context("fork")
        self._ctx = ctx
        self.progress = ctx.Array("q", self.n, lock=False)
        self.current = ctx.Array("q", self.n, lock=False)
        self.procs: list = [None] * self.n
        self.conns: list = [None] * self.n
        self.taps: list[StderrTap | None] = [None] * self.n  # each worker's standard error (``processes.StderrTap``)
        for i in range(self.n):
            self._spawn(i)

    def _inline_progress(self, n: int) -> None:
        self.done_items += n

    def _spawn(self, i: int) -> None:
        parent, child = self._ctx.Pipe()
        self.taps[i] = StderrTap()
        args = (self.kind, self.job, child, self.progress, self.current, i, self.smt_address, self.taps[i])
        proc = self._ctx.Process(target=_serve, args=args, daemon=True)
        proc.start()
        child.close()
        self.procs[i], self.conns[i] = proc, parent
        for method, args in self._replay:
            try:
                parent.send((method, args))
                status, value = parent.recv()
            except (EOFError, OSError):
                proc.join(timeout=5)
                tap, self.taps[i] = self.taps[i], None
                raise ended_why(proc.exitcode, tap.close()) from None
            if status == "refused":
                raise refused_worker()
            if status != "ok":
                raise WorkerError(value.strip().splitlines()[-1])

    def items_done(self) -> int:
        return self.done_items if self.inline else sum(self.progress)

    def set_job(self, job) -> None:
        """The next image of a session (``engine.run.Session``): every worker keeps what it learned
        (keys, findings, proofs) and takes the new job; what the last run taught is forgotten."""
        self.job = job
        self._replay = []
        light = self.kind.light(job)
        if self.inline:
            self.worker.reset(light)
            return
        self.broadcast("reset", lambda i: (light,))

    def close_shards(self) -> list[str]:
        """Every worker's shard closed (the run merges them); their paths."""
        paths: list[str] = []
        self.run([[Task("close_shard", ())] for _ in range(self.n)], lambda task, path: paths.append(path))
        return [p for p in paths if p]

    def harvest(self) -> tuple[dict, dict, dict, dict]:
        """What the workers proved since the last harvest: (findings, proofs, derivations, jump answers
        by tag), merged by ``kind.merge_harvest``."""
        out = self.harvested()

        def got(task, value):
            self.kind.merge_harvest(out, value)

        self.run([[Task("harvest", ())] for _ in range(self.n)], got)
        return out

    def harvested(self) -> tuple[dict, dict, dict, dict]:
        """What the tasks of ``kind.harvested_with`` brought back since the last harvest, without asking the workers
        (what other tasks proved stays with them until the next ``harvest``)."""
        out, self._harvested = self._harvested, self.kind.empty_harvest()
        return out

    def remember(self, method: str, args: tuple) -> None:
        """A call every worker started from now on gets first (what the run has learned)."""
        self._replay.append((method, args))

    def broadcast(self, method: str, args_for: Callable[[int], tuple]) -> None:
        """Call ``method`` on every worker (``args_for(i)`` gives worker i's arguments), and wait."""
        self.run([[Task(method, args_for(i))] for i in range(self.n)], lambda task, value: None)

    def run(self, queues: list[list[Task]], on_result: Callable[[Task, object], None],
            on_crash: Callable[[Task, int, int], list[Task]] | None = None, tick: Callable[[], None] | None = None,
            tick_s: float = 0.5, shared: bool = False) -> None:
        """Run ``queues[i]`` on worker i, each task after the previous one; ``on_result(task, value)``
        for each result, in completion order; ``tick()`` every ``tick_s`` while waiting.  ``shared``:
        the tasks of all queues, in order, each to the first worker free, and the task handed to
        ``on_result`` has the worker's index as its tag."""
        if self._stopped:
            raise RuntimeError("a stopped pool runs no more tasks")
        if shared:
            queues = [[task for queue in queues for task in queue]]
        if self.inline:
            self._run_inline(queues, on_result, tick, shared)
        else:
            _Dispatch(self, queues, shared).run(on_result, on_crash, tick, tick_s)

    def _run_inline(self, queues: list[list[Task]], on_result, tick, shared: bool) -> None:
        for queue in queues:
            for task in queue:
                value = getattr(self.worker, task.method)(*task.call_args())
                if task.method in self.kind.harvested_with:
                    self.kind.merge_harvest(self._harvested, self.worker.harvest())
                on_result(replace(task, tag=0) if shared else task, value)
                if tick:
                    tick()

    def stop(self) -> None:
        """Tell every worker to end, without waiting for them (``close`` waits): a run's summary is made
        while they tear down."""
        if self.inline or self._stopped:
            return
        self._stopped = True
        for conn in self.conns:
            try:
                conn.send(None)
            except (OSError, BrokenPipeError):
                pass

    def close(self) -> None:
        if self.inline:
            self.worker.close()
            return
        self.stop()
        for i, proc in enumerate(self.procs):
            if proc is not None:
                proc.join(timeout=5)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
            if self.taps[i] is not None:
                self.taps[i].release()
                self.taps[i] = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False



class _Dispatch:
    """One ``LocalPool.run`` over forked workers: the tasks each worker has in its pipe (``flight``), the one
    pickled and held back (``held``), the tasks whose message never reached a dead worker (``lost``)."""

    def __init__(self, pool: LocalPool, queues: list[list[Task]], shared: bool):
        self.pool, self.shared = pool, shared
        self.queues = [deque(q) for q in queues] + [deque() for _ in range(pool.n - len(queues))]
        self.flight: list[deque[Task]] = [deque() for _ in range(pool.n)]  # sent to worker i, not answered yet
        self.held: list[tuple[Task, bytes] | None] = [None] * pool.n  # pickled for worker i, too big to send yet
        self.lost: set[int] = set()  # id() of tasks whose message never reached their worker: it had died

    def queue_of(self, i: int) -> deque[Task]:
        return self.queues[0] if self.shared else self.queues[i]

    def feed(self, i: int) -> None:
        """Keep ``IN_FLIGHT`` tasks in worker i's pipe.  A task goes behind another only when its message is
        small (``PIPE_SAFE``: the worker reads it only once it ends the task in hand, and meanwhile the
        parent must be free to read that task's result).  A task's ``late`` arguments are made when it is
        sent, one task ahead of the worker."""
        q, flight, held = self.queue_of(i), self.flight[i], self.held
        while len(flight) < IN_FLIGHT:
            if held[i] is None:
                task = q.popleft() if q else None if self.shared else self.steal(i)
                if task is None:
                    return
                held[i] = (task, bytes(ForkingPickler.dumps((task.method, task.call_args()))))
            task, message = held[i]
            if flight and len(message) > PIPE_SAFE:
                return
            held[i] = None
            flight.append(task)
            try:
                self.pool.conns[i].send_bytes(message)
            except OSError:  # the worker died (a broken pipe): the loop below finds it dead
                self.lost.add(id(task))
                return

    def steal(self, i: int) -> Task | None:
        """For worker i, whose own queue is empty: the last task of the longest other queue, when that task is
        ``stealable`` (the workers of a pinned pool then end a phase together, not one waiting on the other)."""
        queues = [q for j, q in enumerate(self.queues) if j != i and q and q[-1].stealable]
        return max(queues, key=len).pop() if queues else None

    def run(self, on_result, on_crash, tick, tick_s: float) -> None:
        pool, flight = self.pool, self.flight
        while True:
            for i in range(pool.n):
                self.feed(i)
            if not any(flight):
                return
            waiting = {pool.conns[i]: i for i in range(pool.n) if flight[i]}
            waiting.update({pool.procs[i].sentinel: i for i in range(pool.n) if flight[i]})
            ready = wait(list(waiting), timeout=tick_s)
            if tick:
                tick()
            for handle in ready:
                i = waiting[handle]
                if flight[i]:
                    self.take(i, on_result, on_crash)

    def take(self, i: int, on_result, on_crash) -> None:
        """Worker i's answer to its oldest task in flight, if it has one: its value handed on, its error
        raised, or its death handled (``died``)."""
        pool, task = self.pool, self.flight[i][0]
        conn = pool.conns[i]
        if conn.poll():
            try:
                status, value = conn.recv()
            except (EOFError, OSError):
                status, value = "died", None
        else:
            status, value = ("died", None) if not pool.procs[i].is_alive() else ("wait", None)
        if status == "wait":
            return
        self.flight[i].popleft()
        if status == "harvested":
            value, harvest = value
            pool.kind.merge_harvest(pool._harvested, harvest)
            status = "ok"
        if status == "ok":
            self.feed(i)  # keep the worker busy while its result is taken in
            on_result(replace(task, tag=i) if self.shared else task, value)
        elif status == "refused":
            pool.close()
            raise refused_worker()
        elif status == "error":
            pool.close()
            raise WorkerError(f"a worker failed in {task.method}: {value.strip().splitlines()[-1]}")
        else:
            self.died(i, task, on_crash)

    def died(self, i: int, task: Task, on_crash) -> None:
        """Worker i died in ``task``: a fresh one is forked in its place, and the task (with what was sent or
        held for it and never begun) goes again, as ``on_crash`` decides, or as it was when its message never
        reached the dead worker."""
        pool = self.pool
        at, pid = pool.current[i], pool.procs[i].pid
        unstarted = list(self.flight[i]) + ([self.held[i][0]] if self.held[i] is not None else [])  # never begun
        self.flight[i].clear()
        self.held[i] = None
        pool.procs[i].join(timeout=1)
        tap, pool.taps[i] = pool.taps[i], None
        said = tap.close()
        why = ended_why(pool.procs[i].exitcode, said)
        if isinstance(why, OSError):  # the system's limit, not a crash: forking again would meet it too
            pool.close()
            raise why
        if said:  # a crash the run goes on past: what the worker said (a fault handler's dump) is shown
            sys.stderr.write(said)
        pool._spawn(i)
        if on_crash is None:
            pool.close()
            raise WorkerError(f"a worker died in {task.method}")
        q = self.queue_of(i)
        never = id(task) in self.lost  # it died before this task reached it: nothing of the task ran
        self.lost.difference_update(id(t) for t in [task] + unstarted)  # each is sent again
        if never:
            q.extendleft(reversed([task] + unstarted))
        else:
            q.extendleft(reversed(on_crash(task, at, pid) + unstarted))


def default_jobs() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
