"""``schedule.phase.drive`` runs a phase on a real local pool (forked workers): every value reaches ``done``,
a worker that dies on an item is handed to ``crashed`` and what it returns runs again, ``settle`` runs
whether the tasks ended or raised, ``ended`` and ``finish`` only when they ended, and the progress line
counts what ``size`` says.  The task is ``Worker.count``, replaced before the fork by one that returns its
items, or kills its process at an item the first time it meets it."""

from __future__ import annotations

import io
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relocverify.engine.worker import Job, Worker
from relocverify.engine.worker_kind import ENGINE_WORKERS
from relocverify.schedule.local_pool import LocalPool, Task
from relocverify.schedule.phase import Phase, drive
from relocverify.schedule.progress import Progress


def _job() -> Job:
    return Job(image=None, functions={}, tramp=0xFFFFFFFFC0000000, timeout_s=1.0, sites=None, cached={},
               cache_dir=None, tag=b"test")


class Counting(Phase):
    """Items cut into tasks of ``chunk``, each worker its share; a death hands the rest of its task back."""

    label, unit = "counting", "items"

    def __init__(self, items: list[int], chunk: int, events: list, resumes: bool = True):
        self.items, self.chunk, self.events = items, chunk, events
        self.seen: list[int] = []
        self.lost: list[int] = []
        if not resumes:
            self.crashed = None  # the pool raises when a worker dies

    def queues(self, pool):
        chunks = [self.items[i:i + self.chunk] for i in range(0, len(self.items), self.chunk)]
        return [[Task("count", (c,), w) for c in chunks[w::pool.n]] for w in range(pool.n)]

    def size(self):
        return len(self.items)

    def done(self, task, value):
        self.seen.extend(value)

    def crashed(self, task, at, pid):
        self.seen.extend(task.args[0][:at])
        self.lost.append(task.args[0][at])
        rest = task.args[0][at + 1:]
        return [Task("count", (rest,), task.tag)] if rest else []

    def settle(self):
        self.events.append("settle")

    def ended(self, progress):
        self.events.append("ended")

    def finish(self):
        self.events.append("finish")


@pytest.fixture
def dying(monkeypatch, tmp_path):
    """``Worker.count(items)``: ``items`` back, or the process killed at an item in ``deaths`` the first time
    (a file marks it met, so the fresh worker that takes the task over lives)."""
    deaths: set[int] = set()

    def count(self, items):
        for i, item in enumerate(items):
            if self.current is not None:  # a forked worker's: the item in hand, for ``crashed``
                self.current(i)
            mark = tmp_path / f"died-at-{item}"
            if item in deaths and not mark.exists():
                mark.touch()
                os._exit(1)
        return list(items)

    monkeypatch.setattr(Worker, "count", count)
    return deaths, tmp_path


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(0, 60), chunk=st.integers(1, 9), jobs=st.sampled_from([1, 2]),
       deaths=st.sets(st.integers(0, 59), max_size=3))
def test_every_item_is_done_or_crashed_once_and_the_hooks_run_in_order(dying, n, chunk, jobs, deaths):
    wanted, marks = dying
    for mark in marks.glob("died-at-*"):
        mark.unlink()
    wanted.clear()
    wanted.update(d for d in deaths if d < n and jobs > 1)  # one job runs inline, in this process
    events: list[str] = []
    phase = Counting(list(range(n)), chunk, events)
    out = io.StringIO()
    with LocalPool(ENGINE_WORKERS, _job(), jobs) as pool:
        seconds = drive(pool, phase, Progress(enabled=True, stream=out, tty=False))
    assert sorted(phase.seen + phase.lost) == list(range(n))
    assert set(phase.lost) <= wanted
    assert events == ["settle", "ended", "finish"]
    assert out.getvalue().startswith(f"counting: {n:,} items in ") and seconds >= 0


def test_a_phase_that_cannot_resume_raises_after_settling(dying):
    wanted, _ = dying
    wanted.add(3)
    events: list[str] = []
    with LocalPool(ENGINE_WORKERS, _job(), 2) as pool:
        with pytest.raises(Exception):
            drive(pool, Counting(list(range(8)), 2, events, resumes=False), Progress(enabled=False))
    assert events == ["settle"]  # neither ended nor finished


class _Pinned:
    pinned = True


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 12), min_size=1, max_size=3), rounds=st.integers(1, 5),
       last_share=st.one_of(st.none(), st.floats(0.01, 0.9)))
def test_round_merges_hand_each_round_over_once_when_every_worker_closed_it(lengths, rounds, last_share):
    """``schedule.rounds``: every worker's tasks kept in order, the same number of ``close_shard`` tasks in each
    queue (at most a round per task of the shortest), no round empty, and each round's shards merged once, when
    its last came; with a ``last_share`` no larger than an equal round's, a last round no larger than the others."""
    from relocverify.schedule.rounds import RoundMerges

    merged: list[list[str]] = []
    rm = RoundMerges(merged.append, len(lengths), rounds, last_share)
    tasks = [[Task("count", ((w, i),), w) for i in range(n)] for w, n in enumerate(lengths)]
    queues = rm.cut(_Pinned(), tasks)
    closes = [[t for t in q if t.method == "close_shard"] for q in queues]
    assert [[t for t in q if t.method != "close_shard"] for q in queues] == tasks
    assert len({len(c) for c in closes}) == 1 and len(closes[0]) == max(1, min(rounds, *lengths)) - 1
    for q in queues:
        parts = [0]
        for t in q:
            if t.method == "close_shard":
                parts.append(0)
            else:
                parts[-1] += 1
        assert len(parts) == 1 or min(parts) >= 1, parts
        if last_share is not None and last_share <= 1 / len(parts) and len(parts) > 1:
            assert parts[-1] <= max(parts[:-1]), parts
    for w, c in enumerate(closes):  # the workers' shards come back, every worker's round r before r + 1
        for t in c:
            rm.arrived(t, f"shard-{w}-{t.tag[1]}")
    assert [sorted(m) for m in merged] == [[f"shard-{w}-{r}" for w in range(len(lengths))]
                                           for r in range(len(closes[0]))]
