"""The local pool's scheduling: two tasks in each worker's pipe, tasks shared by whichever worker is free,
and no task lost or run twice when a worker dies with a task in hand and another behind it.

The workers are real forked processes; the task is ``Worker.count``, replaced (before the fork) by one that
returns its argument after a short sleep, or kills its process on the items it is told to."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relocverify.engine.worker_kind import ENGINE_WORKERS
from relocverify.schedule import local_pool
from relocverify.schedule.local_pool import LocalPool, Task
from relocverify.engine.worker import Job, Worker


def _job() -> Job:
    return Job(image=None, functions={}, tramp=0xFFFFFFFFC0000000, timeout_s=1.0, sites=None, cached={},
               cache_dir=None, tag=b"test")


@pytest.fixture
def counting(monkeypatch, tmp_path):
    """``Worker.count(items)``: ``items`` back after 5 ms each, or the process killed at an item in ``DEATHS``
    the first time it meets it (a file marks it met, so the fresh worker that takes the task over lives)."""

    def count(self, items):
        for i, item in enumerate(items):
            self.current(i)
            mark = tmp_path / f"died-at-{item}"
            if item in DEATHS and not mark.exists():
                mark.touch()
                os._exit(1)
            time.sleep(0.005)
        return list(items)

    monkeypatch.setattr(Worker, "count", count)


DEATHS = frozenset({7, 30})


def _rest_after(results: list[int], crashed: list[int]):
    """An ``on_crash`` as the run's: the items before the one in hand done (their rows are in the dead
    worker's shard), that one noted as crashed, the later ones run again."""
    def on_crash(task, at, pid):
        results.extend(task.args[0][:at])
        crashed.append(task.args[0][at])
        rest = task.args[0][at + 1:]
        return [Task("count", (rest,), task.tag)] if rest else []
    return on_crash


def _tasks(items: list[int], size: int, tag=None) -> list[Task]:
    return [Task("count", (items[i:i + size],), tag) for i in range(0, len(items), size)]


@pytest.mark.parametrize("shared", [False, True])
def test_every_item_is_answered_or_crashed_exactly_once_when_workers_die(counting, shared):
    results: list[int] = []
    crashed: list[int] = []
    tags: set = set()

    def on_result(task, value):
        results.extend(value)
        tags.add(task.tag)

    pool = LocalPool(ENGINE_WORKERS, _job(), 2)
    try:
        queues = [_tasks(list(range(40)), 3, "a"), _tasks(list(range(40, 60)), 3, "b")]
        pool.run(queues, on_result, _rest_after(results, crashed), shared=shared)
    finally:
        pool.close()
    assert sorted(crashed) == sorted(DEATHS)
    assert sorted(results + crashed) == list(range(60))  # none lost, none twice
    assert tags == ({0, 1} if shared else {"a", "b"})  # shared: the worker that ran it


@pytest.mark.parametrize("stealable", [True, False])
def test_a_worker_done_with_its_queue_takes_the_stealable_end_of_another(counting, monkeypatch, stealable):
    """A pinned run whose first queue is twenty times the second: the second worker, done with its own, takes
    tasks from the end of the first when they are ``stealable`` (and none otherwise); a queue ending in a task
    that is not stealable keeps all of its tasks; every item is answered once (no item here kills its worker)."""
    count = Worker.count
    monkeypatch.setattr(Worker, "count", lambda self, items: (os.getpid(), count(self, items)))
    ran: dict[int, list[int]] = {}
    results: list[int] = []
    crashed: list[int] = []

    def on_result(task, value):
        pid, items = value
        ran.setdefault(pid, []).extend(items)
        results.extend(items)

    def on_crash(task, at, pid):
        results.extend(task.args[0][:at])
        crashed.append(task.args[0][at])
        rest = task.args[0][at + 1:]
        return [Task("count", (rest,), task.tag, stealable=task.stealable)] if rest else []

    def tasks(items, stealable):
        return [Task("count", (items[i:i + 2],), None, stealable=stealable) for i in range(0, len(items), 2)]

    pool = LocalPool(ENGINE_WORKERS, _job(), 2)
    try:
        pool.run([tasks(list(range(200, 240)), stealable), tasks([240, 241], False)], on_result, on_crash)
        stolen_first = sum(1 for items in ran.values() if set(items) & set(range(200, 240)))
        ran.clear()
        pool.run([tasks(list(range(300, 340)), True) + [Task("count", ([340],))], tasks([341], False)], on_result,
                 on_crash)
    finally:
        pool.close()
    assert not crashed and sorted(results) == list(range(200, 242)) + list(range(300, 342))  # none lost, none twice
    assert stolen_first == (2 if stealable else 1)  # both workers ran tasks of the first queue, or one did
    assert any(set(range(300, 341)) <= set(items) for items in ran.values())  # a fixed end: nothing taken


def test_a_big_message_waits_until_its_worker_is_free(counting, monkeypatch):
    """A message over ``PIPE_SAFE`` is not put behind a task in hand, so neither side blocks on a full
    socket; the answers are the same."""
    monkeypatch.setattr(local_pool, "PIPE_SAFE", 64)  # every message of more than one item is big
    results: list[int] = []
    crashed: list[int] = []
    pool = LocalPool(ENGINE_WORKERS, _job(), 2)
    try:
        pool.run([_tasks(list(range(30)), 5), _tasks(list(range(30, 40)), 1)],
                 lambda task, value: results.extend(value), _rest_after(results, crashed))
    finally:
        pool.close()
    assert sorted(crashed) == sorted(DEATHS) and sorted(results + crashed) == list(range(40))


def test_the_inline_pool_tags_shared_tasks_with_its_one_worker(counting):
    pool = LocalPool(ENGINE_WORKERS, _job(), 1)
    pool.worker.current = lambda i: None
    seen = []
    try:
        pool.run([_tasks([1, 2], 1, "x"), _tasks([3], 1, "y")], lambda task, value: seen.append((task.tag, value)),
                 shared=True)
    finally:
        pool.close()
    assert seen == [(0, [1]), (0, [2]), (0, [3])]


def test_a_worker_that_dies_between_tasks_loses_none_and_is_blamed_for_none(counting, monkeypatch):
    """A worker gone after its last answer (killed here while it idles) makes sending it the next task fail
    with a broken pipe: the task is sent again to the worker forked in its place, and no item is reported
    crashed (nothing of it ran).  CI once saw the broken pipe escape the pool when a worker died between two
    tasks."""
    monkeypatch.setattr(local_pool, "IN_FLIGHT", 1)  # the worker idles between tasks, its answer ready
    results: list[int] = []
    crashed: list[int] = []
    killed: list[int] = []
    pool = LocalPool(ENGINE_WORKERS, _job(), 2)

    def tick():
        if not killed and pool.conns[0].poll():  # worker 0's first answer waits: it is idle now
            proc = pool.procs[0]
            killed.append(proc.pid)
            proc.kill()
            proc.join()

    try:
        pool.run([_tasks([1, 2, 3, 4], 1), _tasks([], 1)], lambda task, value: results.extend(value),
                 _rest_after(results, crashed), tick=tick, tick_s=0.01)
    finally:
        pool.close()
    assert killed and pool.procs[0].pid != killed[0]  # it was replaced
    assert crashed == [] and sorted(results) == [1, 2, 3, 4]


def test_a_stopped_pool_ends_its_workers_and_runs_nothing_more(counting):
    """``stop`` tells the workers to end without waiting (a run makes its summary meanwhile); ``close`` then
    waits for them; a stopped pool refuses tasks instead of waiting for ever on workers that are gone."""
    pool = LocalPool(ENGINE_WORKERS, _job(), 2)
    try:
        got: list[int] = []
        pool.run([_tasks([1, 2], 1), _tasks([3], 1)], lambda task, value: got.extend(value))
        pool.stop()
        pool.stop()  # twice: nothing more is sent
        for proc in pool.procs:
            proc.join(timeout=10)
            assert not proc.is_alive() and proc.exitcode == 0
        with pytest.raises(RuntimeError, match="stopped"):
            pool.run([_tasks([4], 1)], lambda task, value: None)
    finally:
        pool.close()
    assert sorted(got) == [1, 2, 3]


# -- what travels between the processes ----------------------------------------------------------------

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


@st.composite
def _findings(draw):
    from relocverify.proof.verdict import Counterexample, Difference, Finding, Verdict

    cex = None
    if draw(st.booleans()):
        cex = Counterexample((("rax", draw(st.integers(0, 2**64 - 1))),), ((0x1000, draw(st.integers(0, 255))),),
                             (Difference("rax", 1, 2),), "90", 0xFFFFFFFF81000000, 0xFFFFFFFFC0000000)
    return Finding(draw(st.sampled_from(list(Verdict))), draw(_TEXT), draw(_TEXT), draw(_TEXT), draw(_TEXT),
                   draw(_TEXT), draw(st.integers(0, 2**40)), draw(st.booleans()), cex, draw(st.none() | _TEXT))


@settings(max_examples=300, deadline=None)
@given(_findings(), st.booleans(), st.none() | st.integers(0, 2**64 - 1), st.integers(0, 3), _findings())
def test_a_learned_finding_crosses_a_pipe_as_it_was(finding, shareable, address, shape, other):
    """``Learned`` (and the ``CachedFinding``, ``CachedProof`` it travels with) come out of a pickle equal to what
    went in: the representative's own finding, counterexample and fresh mark included, whether it is the one
    its cached finding gives back (then only its fresh mark travels), another one, absent, or made lazily."""
    import pickle
    from multiprocessing.reduction import ForkingPickler

    from relocverify.engine.worker import Learned, from_cached, to_cached
    from relocverify.store.cache import CachedProof

    cached = to_cached(finding, shareable)
    own = {0: finding, 1: None, 2: other, 3: finding.fresh}[shape]  # 3: made from the cached one when asked
    learned = Learned(cached, address, own)
    expected = from_cached(cached, own) if shape == 3 else own
    proof = CachedProof(finding.verdict.value, finding.reason, finding.method, finding.proof_us)
    message = bytes(ForkingPickler.dumps((learned, {b"k": cached}, {b"f": proof})))
    back, findings, proofs = pickle.loads(message)
    assert back.cached == cached and back.address == address and back.finding == expected
    assert findings == {b"k": cached} and findings[b"k"] is back.cached  # one object, as it was sent
    assert proofs == {b"f": proof}
    assert back.shared == (None if cached.per_instance else from_cached(cached))
    derivable = expected is not None and expected.counterexample is None and expected == from_cached(
        cached, expected.fresh)
    sent = expected is not None and not derivable  # one its cached finding gives back travels as its fresh mark
    assert (b"relocverify.proof.verdict" in message) == sent
    assert pickle.loads(bytes(ForkingPickler.dumps(back))).finding == expected  # and sent on again (``accept``)


def test_a_worker_ends_with_its_killed_parent(tmp_path):
    """A parent killed with SIGKILL runs no cleanup; its ``fork_map`` workers end with it (issue 44: they ran on)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pids = tmp_path / "pids"
    script = ("import os, time\n"
              "from relocverify.processes import fork_map\n"
              "def pid(_):\n"
              f"    open({str(pids)!r}, 'a').write(f'{{os.getpid()}} ')\n"
              "    time.sleep(60)\n"
              "fork_map(pid, range(2), 2)\n")
    parent = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 60
    while not (pids.exists() and len(pids.read_text().split()) == 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    workers = [int(p) for p in pids.read_text().split()]
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    alive = workers
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [w for w in workers if _alive(w)]
    assert len(workers) == 2 and not alive, f"workers {alive} outlived their killed parent"


def _same(x):
    return x


def _pid(_):
    import os

    return os.getpid()


def test_renewed_workers_answer_in_order_and_end():
    """Workers past ``renew_after`` are replaced by the parent, from its own thread (``multiprocessing.Pool``
    forked them from its handler thread, whose end killed them through ``PR_SET_PDEATHSIG`` while one held the
    task queue's lock: the 20,000-pair selftest hung after its last candidate)."""
    import os

    from relocverify.processes import fork_map

    before = set(_children_alive())  # what earlier tests of this process left running (an SMT helper, a cluster)
    for chunk in (1, 3):
        assert fork_map(_same, range(40), 2, chunksize=chunk, renew_after=1) == list(range(40))
    pids = fork_map(_pid, range(12), 2, renew_after=2)
    assert len(set(pids)) >= 6 and os.getpid() not in pids  # each worker served two items, at most
    assert not set(_children_alive()) - before


def _children_alive() -> list[int]:
    import os

    here = os.getpid()
    out = []
    for pid in os.listdir("/proc"):
        try:
            stat = open(f"/proc/{pid}/stat").read().split(") ")[1].split()
        except (OSError, IndexError):
            continue
        if int(stat[1]) == here and stat[0] != "Z":
            out.append(int(pid))
    return out


def _dies(how):
    """A task that ends its worker in one of the ways a worker ends without answering."""
    import os
    import signal

    def task(x):
        if x != how[0]:
            return x
        kind = how[1]
        if kind == "exit":
            os._exit(3)
        if kind == "refused":
            from relocverify.processes import REFUSED_EXIT

            os._exit(REFUSED_EXIT)
        if kind == "raise":
            raise KeyError(x)
        if kind == "refused-raise":
            raise BlockingIOError(11, "Resource temporarily unavailable")
        os.kill(os.getpid(), getattr(signal, kind))
        return x

    return task


@settings(max_examples=12, deadline=None)
@given(n=st.integers(5, 30), jobs=st.integers(2, 3), chunk=st.integers(1, 4), renew=st.sampled_from([None, 1, 5]),
       at=st.integers(0, 29), kind=st.sampled_from(["SIGKILL", "SIGABRT", "SIGSEGV", "exit", "refused", "raise",
                                                     "refused-raise"]))
def test_a_worker_that_ends_without_answering_is_an_error_not_a_hang(n, jobs, chunk, renew, at, kind):
    """However a worker ends in the middle of an item (a signal, a native abort, an exit, a refused thread, an
    exception), ``fork_map`` raises at once and leaves no worker behind; ``multiprocessing.Pool`` waited for the
    lost answer for ever.  A refusal is the ``OSError`` the command line names as the system's limit."""
    import errno

    from relocverify.processes import WorkerDied, fork_map, refused

    at %= n
    before = set(_children_alive())
    try:
        fork_map(_dies((at, kind)), range(n), jobs, chunksize=chunk, renew_after=renew)
    except WorkerDied as exc:
        assert kind in ("SIGKILL", "SIGABRT", "SIGSEGV", "exit") and "--jobs 1" in str(exc)
        if kind.startswith("SIG"):
            assert kind in str(exc)
    except KeyError as exc:
        assert kind == "raise" and exc.args == (at,)
    except OSError as exc:
        assert kind in ("refused", "refused-raise") and exc.errno == errno.EAGAIN and refused(exc) is not None
    else:
        raise AssertionError(f"{kind} at item {at} of {n} was not reported")
    assert not set(_children_alive()) - before


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (reaped by init later) is not running
        return open(f"/proc/{pid}/stat").read().split(") ")[1][0] != "Z"
    except OSError:
        return False
