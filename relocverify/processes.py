"""Forked worker processes: ``fork_map`` (the selftest, form validation, the gate's samples and answers) and
what the engine's pool (``schedule.local_pool``) shares with it: a worker starts with SIGTERM's default
action, ends with its parent, and says when the system refused it a process or thread.

``fork_map`` replaced ``multiprocessing.Pool``, which failed in three ways this project met.  A worker that
died in a task (a native library's abort) lost its answer, and the pool waited for it for ever.  A worker
killed while it held the task queue's lock (one forked from the pool's handler thread and ended by
``prctl(PR_SET_PDEATHSIG)`` when that thread ended in ``terminate``) kept ``terminate`` waiting for ever
(the 20,000-pair selftest hung after its last candidate).  And a worker that inherited the command line's
SIGTERM handler (it raises ``KeyboardInterrupt``, ``cli.main``) could swallow ``terminate``'s SIGTERM and
wait for a task that never came.  ``fork_map`` sends each worker its own tasks over its own pipe, watches
every worker's pipe and process, raises at once for a worker that ends without answering, replaces workers
from its own thread, and kills the busy ones when it is interrupted.

A worker ends with its parent (``die_with_parent``): a parent killed with SIGKILL runs no cleanup, and its
workers went on running for good (issue 44).  A thread in the worker watches its parent process; a system
that refuses that thread (a limit on processes or threads: ``ulimit -u``, a cgroup's ``pids.max``) does not
stop the worker: it goes without the watch, and still ends when its task is done and its pipe reaches its
end.  What else a worker is refused ends it with ``REFUSED_EXIT``, or, for a native library's abort, with
words on its standard error (``StderrTap``); its parent raises the ``OSError`` the command line names as the
system's limit (``refused``), as it does for its own fork."""

from __future__ import annotations

import errno
import faulthandler
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
from typing import Callable, Sequence

from .errors import RelocverifyError


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts: it cannot be signalled, but it is there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: A forked worker's exit status when the system refused it a process or thread it needed (BSD's EX_TEMPFAIL).
REFUSED_EXIT = 75


def refused(e: BaseException) -> str | None:
    """Why the system would not start a process or thread, when ``e`` says it did not (fork or clone failing
    with EAGAIN or ENOMEM, or Python's "can't start new thread"); None for any other exception."""
    if isinstance(e, OSError) and e.errno in (errno.EAGAIN, errno.ENOMEM) and e.filename is None:
        return "the limit on processes is reached" if e.errno == errno.EAGAIN else "not enough memory"
    if isinstance(e, RuntimeError) and "can't start new thread" in str(e):
        return "the limit on processes or threads is reached"
    return None


def refused_worker() -> OSError:
    """The error a parent raises for a worker that ended with ``REFUSED_EXIT`` (``refused`` names it)."""
    return OSError(errno.EAGAIN, "a worker process was refused a process or thread it needed")


def die_with_parent(period: float = 0.25) -> bool:
    """This process ends (``os._exit``) within ``period`` seconds of its parent process's end, however the
    parent ends: a daemon thread compares ``os.getppid()`` with the parent's (a child whose parent ends is
    given to another).  False when the system refused the thread: no watch then."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(period)
        os._exit(1)

    try:
        threading.Thread(target=watch, name="die-with-parent", daemon=True).start()
    except RuntimeError as exc:
        if refused(exc) is None:
            raise
        return False
    return True


def worker_start() -> None:
    """A forked worker's first step: SIGTERM ends it (not the command line's handler, inherited), and so does
    its parent's end."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent()


class StderrTap:
    """What a forked worker writes to its standard error (file descriptor 2, so native libraries' lines too),
    kept in an unnamed file the parent reads: to tell why a worker ended (``refused_text``) and to pass the rest
    on to the parent's own standard error, whole, once the worker ends (no worker's line in the middle of the
    parent's progress line)."""

    def __init__(self):
        self.file = tempfile.TemporaryFile()

    def attach(self) -> None:
        """In the worker, right after the fork (a fault handler that writes elsewhere is pointed here too)."""
        os.dup2(self.file.fileno(), 2)
        if faulthandler.is_enabled():
            faulthandler.enable(2)

    def text(self) -> str:
        self.file.seek(0)
        return self.file.read().decode(errors="replace")

    def close(self) -> str:
        """In the parent, once the worker has ended: what it wrote, the file gone."""
        text = self.text()
        self.file.close()
        return text

    def release(self) -> None:
        """In the parent, once the worker has ended: what it wrote goes to the parent's standard error."""
        text = self.close()
        if text:
            try:
                sys.stderr.write(text)
                sys.stderr.flush()
            except (OSError, ValueError):
                pass


def refused_text(text: str) -> bool:
    """Whether a worker's last words say the system refused it a thread or process: a native library's
    ``std::system_error`` (z3 starts a thread for each timed check) or Python's own."""
    return "Resource temporarily unavailable" in text or "can't start new thread" in text


def ended_why(exitcode: int | None, text: str) -> BaseException:
    """The error for a worker that ended without answering, from its exit status and what it wrote (``text``):
    the system's refusal (``refused_worker``) when they say so, else ``WorkerDied`` naming the signal or status
    and the worker's last line."""
    if exitcode == REFUSED_EXIT or (exitcode is not None and exitcode < 0 and refused_text(text)):
        return refused_worker()
    how = f"status {exitcode}"
    if exitcode is not None and exitcode < 0:
        try:
            how = f"signal {-exitcode} ({signal.Signals(-exitcode).name})"
        except ValueError:
            how = f"signal {-exitcode}"
    last = [line for line in text.splitlines() if line.strip()]
    said = f": {' '.join(last[-1].split())[:200]}" if last else ""
    return WorkerDied(f"a worker process ended with {how} without answering{said}; rerun with --jobs 1 to see why")


class WorkerDied(RelocverifyError):
    """A worker process of ``fork_map`` ended without answering: a signal, or a native library's abort."""


def fork_map(fn: Callable, items: Sequence, jobs: int, *, chunksize: int = 1, renew_after: int | None = None,
             progress: Callable[[int, int], None] | None = None) -> list:
    """``[fn(x) for x in items]``, in ``jobs`` forked worker processes (in this one when ``jobs`` <= 1).

    The items reach the workers by the fork, not by pickling; each worker takes ``chunksize`` items at a time
    and sends their values back.  A worker is replaced after ``renew_after`` items (what a library keeps
    between calls), by this thread.  An exception ``fn`` raises in a worker is raised here, once the others
    are stopped.  A worker that ends without answering raises ``WorkerDied`` here (``refused_worker`` when the
    system refused it a process or thread): ``multiprocessing.Pool`` waits for its answer for ever, and a
    worker killed holding the task queue's lock stops ``Pool.terminate`` for ever too (both seen when a
    cgroup's ``pids.max`` made z3 abort in a worker).  ``progress(done, total)``: items done, as they come."""
    items = list(items)
    if jobs <= 1 or len(items) <= chunksize:
        out = []
        for k, item in enumerate(items):
            out.append(fn(item))
            if progress:
                progress(k + 1, len(items))
        return out
    return _ForkMap(fn, items, jobs, chunksize, renew_after, progress).run()


class _ForkMap:
    def __init__(self, fn, items, jobs, chunksize, renew_after, progress):
        import multiprocessing

        self.fn, self.items, self.progress = fn, items, progress
        self.ctx = multiprocessing.get_context("fork")
        self.chunks = [(i, min(i + chunksize, len(items))) for i in range(0, len(items), chunksize)]
        self.results: list = [None] * len(self.chunks)
        self.jobs = min(jobs, len(self.chunks))
        self.renew_after = renew_after
        self.workers: dict = {}  # parent's end -> [process, chunk in hand or None, items served, its StderrTap]

    def run(self) -> list:
        from multiprocessing.connection import wait

        todo, done_items = 0, 0
        try:
            for _ in range(self.jobs):
                self._spawn()
            while done_items < len(self.items):
                for conn, w in list(self.workers.items()):
                    if w[1] is None and todo < len(self.chunks):
                        w[1], todo = todo, todo + 1
                        try:
                            conn.send(self.chunks[w[1]])
                        except OSError:
                            self._died(w)
                ready = wait([*self.workers, *(w[0].sentinel for w in self.workers.values())])
                for conn, w in list(self.workers.items()):
                    if conn in ready or w[0].sentinel in ready:
                        done_items += self._take(conn, w)
                if self.progress:
                    self.progress(done_items, len(self.items))
            return [value for part in self.results for value in part]
        finally:
            self._stop()

    def _take(self, conn, w) -> int:
        """The answer of the worker at ``conn`` (its chunk's values kept, its exception raised, its death
        raised), and the number of items it answered for."""
        try:
            status, value = conn.recv() if w[1] is not None and conn.poll() else ("died", None)
        except (EOFError, OSError):
            status, value = "died", None
        if status == "died":
            self._died(w)
        if status == "raise":
            raise value
        lo, hi = self.chunks[w[1]]
        self.results[w[1]], w[1] = value, None
        w[2] += hi - lo
        if self.renew_after is not None and w[2] >= self.renew_after:
            self._retire(conn)
            self._spawn()
        return hi - lo

    def _died(self, w) -> None:
        w[0].join(timeout=5)
        tap, w[3] = w[3], None
        raise ended_why(w[0].exitcode, tap.close() if tap is not None else "")

    def _spawn(self) -> None:
        parent, child = self.ctx.Pipe()
        others = [parent, *self.workers]  # the parent's ends, closed in the child: EOF reaches each worker
        tap = StderrTap()
        proc = self.ctx.Process(target=_fork_serve, args=(self.fn, self.items, child, others, tap), daemon=True)
        proc.start()
        child.close()
        self.workers[parent] = [proc, None, 0, tap]

    def _retire(self, conn) -> None:
        proc, _, _, tap = self.workers.pop(conn)
        try:
            conn.send(None)
        except OSError:
            pass
        conn.close()
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join()
        if tap is not None:
            tap.release()

    def _stop(self) -> None:
        for conn, w in list(self.workers.items()):
            if w[1] is not None:  # still working: not waited for
                w[0].kill()
            self._retire(conn)


def _fork_serve(fn, items, conn, others, tap: StderrTap) -> None:
    """A ``fork_map`` worker: (lo, hi) in, ("ok", values) or ("raise", exception) out, until None or EOF.
    Ends with ``os._exit``: no traceback printed by ``multiprocessing``, no cleanup of the parent's objects."""
    code = 0
    try:
        tap.attach()
        for other in others:
            other.close()
        worker_start()
        while True:
            try:
                chunk = conn.recv()
            except EOFError:
                break
            if chunk is None:
                break
            try:
                answer = ("ok", [fn(items[i]) for i in range(*chunk)])
            except Exception as exc:  # noqa: BLE001 - raised again in the parent
                answer = ("raise", exc)
            try:
                conn.send(answer)
            except (pickle.PicklingError, TypeError, AttributeError):  # an exception that does not pickle
                conn.send(("raise", RuntimeError(f"{type(answer[1]).__name__}: {answer[1]}")))
    except KeyboardInterrupt:
        pass
    except BaseException as exc:  # noqa: BLE001 - told by the exit status
        code = REFUSED_EXIT if refused(exc) is not None else 1
    os._exit(code)
