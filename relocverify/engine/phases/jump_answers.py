"""The jump probes: every stored function without jump-probe answers gets them (``engine.jumps``), with the
block proofs they need; what one worker learns of blocks goes to the others with their next task.  The
summary's ``jump_probe`` section is made from the store (``jump_summary``)."""

from __future__ import annotations

from functools import partial

from ...schedule.local_pool import Task
from ...schedule.phase import Phase
from ...store.cache import merge_jump_entries
from ...store.jump_rows import pack_jump_row
from ...store.store import Store
from ..keys import KeyMaker
from ..worker import stored_bytes
from . import sizes


class JumpAnswers(Phase):
    label, unit = "jump probes", "instructions"

    def __init__(self, pool, store: Store, image_id: int):
        self.job, self.store = pool.job, store
        self.fids = store.functions_without_jump_probes(image_id)
        self.proofs = 0  # block proofs made
        self.inboxes: list[dict] = [{} for _ in range(pool.n)]  # what each worker has not heard from the others

    def queues(self, pool) -> list[list[Task]]:
        chunks = sizes.chunks(self.fids, sizes.JUMP_CHUNK)
        return [[Task("jump_probes", (c,), w, partial(self._news, w)) for c in chunks[w::pool.n]]
                for w in range(pool.n)]

    def size(self) -> int:
        return sum(self.job.functions[f].size for f in self.fids) // 4 or 1

    def done(self, task: Task, value) -> None:
        rows, examples, proofs, learned = value
        self.store.write_jump_probes(rows, examples)
        self.proofs += proofs
        if learned:
            for w, inbox in enumerate(self.inboxes):
                if w != task.tag:
                    merge_jump_entries(inbox, learned)

    def crashed(self, task: Task, at: int, pid: int) -> list[Task]:
        """A worker died on function ``task.args[0][at]``: its instructions are refused as
        ``error:crashed`` (the int3 verdicts stand), and the task's other functions go again."""
        job = self.job
        fid = task.args[0][at]
        fn = job.functions[fid]
        skip = job.skip.get(fid, ())
        data = stored_bytes(job.image, fn)
        row = pack_jump_row(fid, [(off, "error:crashed") for off, _, _ in KeyMaker(job.tramp).keys(data, fn.start)
                                  if fn.start + off not in skip])
        self.store.write_jump_probes([row], {"error:crashed": "the worker crashed while answering for this function"})
        rest = task.args[0][:at] + task.args[0][at + 1:]  # the task's answers die with the worker
        return [Task(task.method, (rest,), task.tag)] if rest else []

    def _news(self, w: int) -> tuple[dict]:
        inbox, self.inboxes[w] = self.inboxes[w], {}
        return (inbox,)


def jump_summary(store, image_id: int, instructions: int, proofs: int | None,
                 unchecked: tuple[str, ...] = ()) -> dict:
    """The summary's ``jump_probe``: eligible, and refusals by bucket, adding up to the instructions;
    ``block_proofs``: the proofs the phase made (whole blocks, and the pieces of blocks composed from
    them: ``engine.jumps``); ``unchecked``: the range rules not asked of this image, with why
    (``PatchRanges.unchecked``)."""
    counts = store.jump_probe_counts(image_id)
    eligible = counts.pop("eligible", 0)
    out = {"eligible": eligible, "refused": counts, "instructions": instructions,
           "totals_add_up": eligible + sum(counts.values()) == instructions,
           "share": round(eligible / instructions, 4) if instructions else 0.0,
           "examples": {k: v for k, v in store.jump_probe_examples().items() if k in counts}}
    if proofs is not None:
        out["block_proofs"] = proofs
    if unchecked:
        out["unchecked"] = list(unchecked)
    return out


__all__ = ["JumpAnswers", "jump_summary"]
