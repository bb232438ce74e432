"""What a pool knows of the workers it runs: how to make one and what to merge of theirs, nothing of what they find.

A pool (``local_pool.LocalPool``, ``dask_pool.DaskPool``) runs tasks, each a call of a method of a worker
object it keeps for the run, and hands the values back; it owns processes, pipes, crashes and progress.
Everything it must know about the worker itself is in a ``WorkerKind``: the engine's is
``engine.worker_kind.ENGINE_WORKERS``.  A worker object answers ``reset(job)``, ``harvest()``,
``close_shard()`` and ``close()``, and has the attributes ``progress`` and ``current`` (callables told of
items done and of the item in hand), besides the methods its tasks name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerKind:
    """``make(job, smt)``: a worker for ``job`` whose SMT checks go to ``smt`` (None: its own);
    ``in_process()``: called once in a forked worker process before its worker is made (signal handlers);
    ``light(job)``: the job as sent to workers that live on (what they hold already left out);
    ``empty_harvest()`` and ``merge_harvest(into, harvest)``: what workers hand back with ``harvest()``;
    ``harvested_with``: the methods whose values travel with the worker's ``harvest()``;
    ``detach(job)``: (the image's source, the job without what cannot travel) for a remote worker, and
    ``attach(detached, source, images, store_path)``: the job rebuilt there (``images``: that process's
    cache of loaded images, which ``attach`` may keep and trim)."""

    make: Callable[[object, Callable | None], object]
    in_process: Callable[[], None]
    light: Callable[[object], object]
    empty_harvest: Callable[[], object]
    merge_harvest: Callable[[object, object], None]
    harvested_with: frozenset[str]
    detach: Callable[[object], tuple[object, object]]
    attach: Callable[[object, object, dict, str], object]
