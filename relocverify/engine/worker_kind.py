"""The engine's workers as the scheduler sees them (``schedule.kinds.WorkerKind``): a ``Worker`` per process,
what it hands back with ``harvest``, and how its job travels to a Dask worker."""

from __future__ import annotations

import os
from dataclasses import replace

from ..kernel.sites import find_sites
from ..schedule.kinds import WorkerKind
from ..schedule.local_pool import WorkerError
from ..schedule.watchdog import own_alarm
from .worker import KEEP, Job, Worker, empty_harvest, merge_harvest


def _light(job: Job) -> Job:
    """The job as sent to live workers: the persistent cache's findings and the policy table, which
    they hold, left out."""
    return replace(job, cached=None, rules=KEEP)


def _detach(job: Job) -> tuple[object, Job]:
    """(the image's source, the job without the image and its sites): a Dask worker loads the image itself."""
    if job.image.source is None:
        raise WorkerError(f"{job.image.path}: the image has no source to load it from on a Dask worker")
    return (job.image.source, job.sites is not None), replace(job, image=None, sites=None)


def _attach(job: Job, source: tuple, images: dict, store_path: str) -> Job:
    """The job rebuilt on a Dask worker: its image loaded (kept in ``images`` for the next task), its sites
    found again, the cache directory kept only if this machine has it, the worker's own store path."""
    from ..image.source import load_source

    source, with_sites = source
    image = images.get(source.identity)
    if image is None:
        # A package run moves from module to module: keep the current image and kernels only.
        kernels = images.setdefault("kernels", {})
        for k in [k for k in images if k != "kernels"]:
            del images[k]
        image = images[source.identity] = load_source(source, kernels)
    sites = find_sites(image) if with_sites else None
    cache_dir = job.cache_dir if job.cache_dir and os.path.isdir(job.cache_dir) else None
    return replace(job, image=image, sites=sites, cache_dir=cache_dir, store_path=store_path)


#: The engine's workers.  ``in_process``: a forked worker runs nothing but its worker, so its proofs' watchdogs
#: keep SIGALRM installed (``schedule.watchdog.own_alarm``).  The proofs phase's tasks (``prove``) send what they proved
#: with their values, so the proof cache is written while the rows are made without a harvest task between.
ENGINE_WORKERS = WorkerKind(make=Worker, in_process=own_alarm, light=_light, empty_harvest=empty_harvest,
                            merge_harvest=merge_harvest, harvested_with=frozenset({"prove"}), detach=_detach,
                            attach=_attach)
