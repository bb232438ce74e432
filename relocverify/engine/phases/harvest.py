"""What the workers proved, collected into the persistent proof cache: at once, or by a thread of the
parent's while the workers go on (``Behind``)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ...store.cache import ProofCache
from ...store.forking import sqlite_work


def harvest(pool, cache: ProofCache, tag: bytes, cached: dict, behind: bool = False,
            ask: bool = True) -> Behind | None:
    """Collect what the workers proved since the last harvest into the persistent cache (and into
    ``cached``, the session's copy, which a worker started later is given).  ``behind``: the cache is
    written by a thread of its own (``Behind``: join it), while the workers go on.  ``ask`` False: only what
    came back with the tasks' values (``LocalPool.harvested``: the proofs phase's), without a harvest task."""
    findings, proofs, derivations, jumps = pool.harvest() if ask else pool.harvested()
    cached.update(findings)

    def keep(into: ProofCache) -> None:
        into.add(tag, findings, proofs, derivations)
        for jtag, entries in jumps.items():
            into.add_jump_entries(jtag, entries)

    if not behind or not cache.enabled:
        keep(cache)
        return None
    return Behind(cache.directory, keep)


class Behind(threading.Thread):
    """Writes the proof cache on a connection of its own while the main thread waits on the workers
    (between the proofs and the rows, written in the main thread, its inserts kept both workers waiting);
    ``join`` raises what the writing raised."""

    def __init__(self, directory: str, keep: Callable[[ProofCache], None]):
        super().__init__(name="relocverify-harvest", daemon=True)
        self._directory, self._keep, self._error = directory, keep, None
        self.start()

    def run(self) -> None:
        try:
            with sqlite_work():  # no worker is forked meanwhile (``store.forking``)
                cache = ProofCache(self._directory)
                try:
                    self._keep(cache)
                finally:
                    cache.close()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread by join
            self._error = exc

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self._error is not None:
            error, self._error = self._error, None
            raise error


__all__ = ["harvest", "Behind"]
