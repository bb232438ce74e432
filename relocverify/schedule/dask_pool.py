"""Where a run's tasks execute on Dask distributed: ``--scheduler ADDRESS`` or ``--dask-local N``.

``DaskPool`` has the local pool's interface (``local_pool.LocalPool``), so
``engine.run`` drives both the same way; only where the work happens moves.

* **The client keeps the store.**  The run's own process deals the tasks,
  takes their results in, merges rows into the store and writes the proof
  cache, as with the local pool.  Workers never open the store: a task's
  rows come back as the bytes of the shard it wrote in a directory of its
  own, and the client writes them next to the store and merges them like a
  local worker's shard (``store.shard``), so one store serves workers on
  other machines.
* **Workers load the image themselves.**  A task gets a ``JobSpec``: the
  job without the image and its site index, plus the image's source (path
  and sha256, ``image.source``).  The worker loads the image once, checks
  its identity, finds the sites again, and keeps the ``Worker`` it built
  for every later task of the run.  The spec is scattered to every worker
  once, so tasks carry a reference to it.
* **What a run learns reaches every worker.**  ``remember``/``broadcast``
  (outcome ids, the proofs phase's findings) scatter the call once; every
  task carries the list of references, and a worker makes the calls it has
  not made yet before its task.  A fresh worker (one started to replace a
  killed one) makes them all.
* **Nothing is lost with a worker.**  Each task returns its rows and what
  it proved (the worker's harvest) together with its value, so nothing
  held only by a worker is needed later.  Dask reschedules the tasks of a
  worker that dies, and a rescheduled task gives the same rows: merging a
  function twice replaces its rows.  A task that kills worker after worker
  (``KilledWorker``) is split into one task per item, and an item that
  still kills is handed to ``on_crash``, as with the local pool.
"""

from __future__ import annotations

import atexit
import gc
import itertools
import logging
import os
import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass
from typing import Callable

from ..store.shard import shard_path
from .kinds import WorkerKind
from .local_pool import Task, WorkerError


@dataclass(frozen=True)
class JobSpec:
    """A job as a Dask worker rebuilds it (``WorkerKind.detach`` and ``attach``)."""

    token: str
    kind: WorkerKind
    source: object
    job: object  # what cannot travel left out

    def build(self, images: dict):
        return self.kind.attach(self.job, self.source, images, os.path.join(_private_dir(), "store"))


# What a worker process keeps between tasks: its Worker, the job it was built for, the replays made.
_STATE: dict = {"worker": None, "token": None, "applied": 0, "images": {}, "dir": None}


def _private_dir() -> str:
    """This worker's own directory for its shard: inside the Dask worker's local directory (which
    Dask, or the pool that started the cluster, removes), else a temporary one removed at exit."""
    if _STATE["dir"] is None:
        try:
            import distributed

            base = distributed.get_worker().local_directory
            _STATE["dir"] = tempfile.mkdtemp(prefix="relocverify-", dir=base)
        except (ImportError, ValueError, OSError):
            _STATE["dir"] = tempfile.mkdtemp(prefix="relocverify-dask-")
            atexit.register(shutil.rmtree, _STATE["dir"], True)
    return _STATE["dir"]


def run_task(spec: JobSpec, method: str, args: tuple, replays: list) -> tuple:
    """One task on a Dask worker: (value, shard bytes or None, harvest, items done)."""
    worker = _STATE["worker"]
    if worker is None or _STATE["token"] != spec.token:
        job = spec.build(_STATE["images"])
        if worker is None:
            worker = spec.kind.make(job, None)
        else:
            worker.reset(job)
        _STATE.update(worker=worker, token=spec.token, applied=0)
    for m, a in replays[_STATE["applied"]:]:
        getattr(worker, m)(*a)
    _STATE["applied"] = len(replays)
    gc.freeze()  # what the worker keeps only grows: out of the collector's way (as local_pool._serve)
    done = [0]
    worker.progress = lambda n: done.__setitem__(0, done[0] + n)
    value = getattr(worker, method)(*args)
    shard = None
    path = worker.close_shard()
    if path:
        with open(path, "rb") as f:
            shard = f.read()
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.unlink(path + suffix)
    return value, shard, worker.harvest(), done[0]


class DaskPool:
    """``LocalPool``'s interface over a Dask cluster (a scheduler's address, or a LocalCluster)."""

    #: A task runs on any worker: each returns all it found.
    pinned = False

    def __init__(self, kind: WorkerKind, job, scheduler: str | None = None, local_workers: int | None = None):
        import distributed

        logging.getLogger("distributed").setLevel(logging.ERROR)
        self._cluster = None
        self._scratch = None
        if scheduler is None:
            # the workers' scratch space is ours and goes with the cluster (Dask's default,
            # $TMPDIR/dask-scratch-space, would outlive every run)
            import dask

            self._scratch = tempfile.mkdtemp(prefix="relocverify-dask-")
            with dask.config.set({"temporary-directory": self._scratch}):
                self._cluster = distributed.LocalCluster(n_workers=local_workers or 1, threads_per_worker=1,
                                                         processes=True, dashboard_address=None, memory_limit=0,
                                                         silence_logs=logging.ERROR, local_directory=self._scratch)
            scheduler = self._cluster.scheduler_address
        try:
            self.client, info = _answered(lambda: _connect(scheduler), SCHEDULER_WAIT_S,
                                          f"the Dask scheduler at {scheduler}")
        except (OSError, WorkerError) as exc:
            self._close_cluster()
            raise WorkerError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
        self.n = max(1, len(info["workers"]) or (local_workers or 1))
        self._counter = itertools.count(1)
        self._done = 0
        self._shards: list[str] = []
        self.kind = kind
        self._harvested = kind.empty_harvest()
        self.set_job(job)

    # -- the job and what the run learns ----------------------------------------------------
    def set_job(self, job) -> None:
        source, detached = self.kind.detach(job)  # raises WorkerError for a job that cannot travel
        self.job = job
        spec = JobSpec(uuid.uuid4().hex, self.kind, source, detached)
        self._spec = self.client.scatter(spec, broadcast=True, hash=False)
        self._replays: list = []

    def remember(self, method: str, args: tuple) -> None:
        self._replays.append(self.client.scatter((method, args), broadcast=True, hash=False))

    def broadcast(self, method: str, args_for: Callable[[int], tuple]) -> None:
        """Every worker makes the call before its next task (a worker is not addressed by index here)."""
        for i in range(self.n):
            self.remember(method, args_for(i))

    # -- tasks ------------------------------------------------------------------------------
    def items_done(self) -> int:
        return self._done

    def run(self, queues: list[list[Task]], on_result: Callable[[Task, object], None],
            on_crash: Callable[[Task, int, int | None], list[Task]] | None = None,
            tick: Callable[[], None] | None = None, tick_s: float = 0.5, shared: bool = False) -> None:
        """Every task of every queue, in any order and on any worker; ``on_result(task, value)`` for each
        (``shared`` changes nothing here: a task's tag is its own, as no worker has an index)."""
        import distributed

        pending: dict = {}

        def submit(task: Task) -> None:
            future = self.client.submit(run_task, self._spec, task.method, task.call_args(), list(self._replays),
                                        key=f"{task.method}-{next(self._counter)}-{uuid.uuid4().hex[:8]}",
                                        pure=False)
            pending[future] = task

        for task in itertools.chain.from_iterable(queues):
            submit(task)
        while pending:
            try:
                done = distributed.wait(list(pending), timeout=tick_s, return_when="FIRST_COMPLETED").done
            except TimeoutError:
                done = ()
            if tick:
                tick()
            for future in done:
                task = pending.pop(future)
                if future.status == "finished":
                    value, shard, harvest, n = future.result()
                    self._done += n
                    self._keep(shard, harvest)
                    on_result(task, value)
                    continue
                exc = future.exception()
                if isinstance(exc, distributed.KilledWorker):
                    items = task.args[0] if task.args and isinstance(task.args[0], list) else None
                    if items is not None and len(items) > 1:  # find the item that kills: one task each
                        for item in items:
                            submit(Task(task.method, ([item],) + tuple(task.args[1:]), task.tag))
                        continue
                    if on_crash is None:
                        raise WorkerError(f"Dask workers died in {task.method}: {exc}")
                    for again in on_crash(task, 0, None):
                        submit(again)
                    continue
                raise WorkerError(f"a Dask worker failed in {task.method}: {type(exc).__name__}: {exc}")

    def _keep(self, shard: bytes | None, harvest: tuple[dict, dict, dict, dict]) -> None:
        if shard:
            path = shard_path(self.job.store_path, os.getpid(), next(self._counter))
            with open(path, "wb") as f:
                f.write(shard)
            self._shards.append(path)
        self.kind.merge_harvest(self._harvested, harvest)

    def close_shards(self) -> list[str]:
        paths, self._shards = self._shards, []
        return [p for p in paths if os.path.exists(p)]  # a crash handler may have merged some already

    def harvest(self) -> tuple[dict, dict, dict, dict]:
        out, self._harvested = self._harvested, self.kind.empty_harvest()
        return out

    def harvested(self) -> tuple[dict, dict, dict, dict]:
        """Every task's harvest came back with it: the same as ``harvest``."""
        return self.harvest()

    def stop(self) -> None:
        """Nothing to tell ahead (``LocalPool.stop``): the cluster's workers are not this run's to end, and
        ``close`` lets the client go."""

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            self._close_cluster()

    def _close_cluster(self) -> None:
        """Close the LocalCluster this pool started, and remove its scratch space."""
        try:
            if self._cluster is not None:
                self._cluster.close()
        finally:
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


#: How long a scheduler has to answer the connection and the first question (a silent one was waited on for
#: ever: issue 44).
SCHEDULER_WAIT_S = 20.0


def _connect(scheduler):
    import distributed

    client = distributed.Client(scheduler, timeout=f"{SCHEDULER_WAIT_S:g}s")
    return client, client.scheduler_info()


def _answered(call, seconds: float, what: str):
    """``call()``'s value, or WorkerError when it has not returned within ``seconds`` (the call is left on a
    daemon thread, which the process's end takes with it)."""
    box: dict = {}

    def run():
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="relocverify-dask-connect", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise WorkerError(f"{what} did not answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]
