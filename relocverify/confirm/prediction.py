"""What the optprobes models predict for a probed kernel site, beside what the running kernel listed.

For a probe placed optimized (``--tracer optprobes``, or kprobes with ``--optimized on``) in the
kernel's own text, ``optprobes_predictions(site, guest)`` answers the site with each optprobes model
of the kernel's version that differs in the boot variant it judges (``tracers.optprobes``:
``optprobes@6.1`` the file's return thunk jumps, ``optprobes@6.1+ret`` the ``ret; int3`` that
``apply_returns`` leaves without X86_FEATURE_RETHUNK), as the audit does: the function's bytes, the
kernel sites in it (``store.image_index``), the kprobes boundary walk, the thunk range.  Each is
``optimized`` or ``not optimized: <the model's reason>``; ``Prediction.agrees`` compares it with
``kprobes/list`` (``[OPTIMIZED]`` or not), so a confirmation says which variant the guest runs.
Only the boot variants the models know are applied; the site's entries from other code are not
(they decide tracer-wrong, not whether the kernel optimizes).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..tracers import get_model, linux_facts
from ..x86.instruction import Instruction
from ..x86.registers import MASK64

#: The optprobes models confirm compares, per kernel version (the same code, another boot variant).
MODELS = {"6.1": ("optprobes@6.1", "optprobes@6.1+ret")}


@dataclass(frozen=True)
class Prediction:
    model: str
    optimized: bool | None  # None: the model cannot answer (unmodelled)
    why: str

    def agrees(self, listed: bool | None) -> bool | None:
        return None if listed is None or self.optimized is None else listed == self.optimized

    def as_json(self, listed: bool | None) -> dict:
        return {"model": self.model, "optimized": self.optimized, "why": self.why, "agrees": self.agrees(listed)}


def optprobes_predictions(site, guest, version: str = "6.1") -> tuple[Prediction, ...]:
    """See the module doc; () for a module's site or a version without models here."""
    from ..image.functions import iter_instruction_spans
    from ..store.image_index import indexed
    from ..tracers.model import Context, Refuse, RelocateBlock

    if site.module is not None or version not in MODELS:
        return ()
    index = indexed(guest.vmlinux, guest.system_map)
    fn = index.functions.containing(site.address)
    if fn is None or index.sites is None:
        return ()
    data = index.image.read(fn.start, fn.end - fn.start)
    kinds: dict[int, tuple] = {}
    for s in index.sites.sites_at(fn.start, fn.end - fn.start):
        if fn.start <= s.address < fn.end:
            kinds[s.address - fn.start] = kinds.get(s.address - fn.start, ()) + (s.kind,)
    thunks = _thunks(guest.vmlinux, guest.system_map)
    off = site.address - fn.start
    file_offsets = [a - fn.start for a, _ in iter_instruction_spans(index.image, fn)]
    out = []
    for name in MODELS[version]:
        model = get_model(name)
        live = model.live_bytes(data, kinds)
        offsets = _offsets(live, fn.start) if live != data else file_offsets
        gaps = set(offsets) - linux_facts.boundaries(model.spec, live, offsets)
        extable = frozenset(o for o, k in kinds.items() if "extable" in k)
        walk = model.function_walk(live, fn.start, offsets, extable, thunks)
        answer = model.answer_in(walk, live, off, 0xFFFFFFFFC0001000 & MASK64,
                                 Context(off not in gaps, kinds.get(off, ()), fn.name), extable,
                                 lambda o: kinds.get(o, ()), None)
        if isinstance(answer, RelocateBlock):
            out.append(Prediction(name, True, "optimized"))
        elif isinstance(answer, Refuse):
            out.append(Prediction(name, False, answer.reason))
        else:
            out.append(Prediction(name, None, getattr(answer, "reason", answer.kind)))
    return tuple(out)


@lru_cache(maxsize=2)
def _thunks(vmlinux: str, system_map: str | None) -> tuple[int, int] | None:
    """``__indirect_thunk_start..end`` (the image index keeps only the thunks' own symbols)."""
    from ..image.loader import load_image

    image = load_image(vmlinux, system_map)
    lo, hi = image.symbol_address("__indirect_thunk_start"), image.symbol_address("__indirect_thunk_end")
    return None if lo is None or hi is None else (lo, hi)


def _offsets(data: bytes, start: int) -> list[int]:
    from ..x86.decode import decode

    out, pos = [], 0
    while pos < len(data):
        d = decode(data[pos:pos + 15], start + pos)
        out.append(pos)
        pos += d.length if isinstance(d, Instruction) else 1
    return out
