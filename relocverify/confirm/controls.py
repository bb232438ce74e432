"""Control sites: instructions the tracer audit puts in ``agree``, in functions a shipped trigger runs.

A control is confirmed like a finding and must come out ``not-reproduced`` (hit, and nothing
changed); ``not-executed`` says the trigger missed it, anything else says the audit (or the model)
is wrong.  ``audited_sites(store, tracer, functions)`` judges every stored instruction of the named
functions as ``tracers.audit.audit_store`` judges it (the same instance key, relocverify's own
verdict, the site mask, kprobes' ``can_probe`` walk; per-function models through
``Auditor.function_outcomes``), with the audit's proof cache and remembered outcomes, so the bucket
is the audit's for that instruction.  What it does not have: optprobes' image-wide transfers into
a probed range (``tracers.run.image_facts``, a walk over the whole image) are taken as none; only
the thunk range is read.  ``spread(sites, n)`` picks ``n`` of them, taking each function in turn.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from ..store.store import Results, site_kinds
from ..tracers import get_model
from ..x86.registers import MASK64


@dataclass(frozen=True)
class Audited:
    address: int
    where: str  # FUNCTION+0xOFF
    bucket: str
    group: str


def audited_sites(store_path: str, tracer: str, functions: tuple[str, ...], identity: str | None,
                  tramp: int, thunks: tuple[int, int] | None = None) -> list[Audited]:
    """Every stored instruction of ``functions`` (by name) in the image ``identity`` of the store, with the
    bucket and group ``tracer`` (an audit name: kprobes@6.1) gets there; ``thunks``: the image's
    ``__indirect_thunk_start..end`` (optprobes reads it)."""
    from ..engine.keys import KeyMaker
    from ..tracers.audit import Auditor, ImageFacts
    from ..tracers.model import Context

    model = get_model(tracer)
    wanted = set(functions)
    store = Results(store_path)
    try:
        image_id = store.find_image(identity)
        if image_id is None:
            raise InputError(f"{store_path}: holds no image {identity or ''} (audit that kernel into it first)")
        store.check_seals(image_id)  # controls are sites the verdicts call agreed: never altered ones
        chosen = [f for f in store.function_verdicts(image_id) if f[2] in wanted]
    finally:
        store.close()
    auditor = Auditor([model], tramp)
    keys = KeyMaker(auditor.tramp)
    spec = model.decoder.split("@", 1)[1] if getattr(model, "needs_boundary", False) and model.decoder else None
    out = []
    try:
        for _, start, name, data, rows in chosen:
            gaps = auditor.walk(spec, data, start, [r[0] for r in rows]) if spec else frozenset()
            if getattr(model, "per_function", False):
                masks = {off: mask for off, _, _, mask in rows if mask}
                outcomes = auditor.function_outcomes(model, data, start, name, rows, masks, gaps, ImageFacts(thunks))
            else:
                by_offset = {off: key for off, _, key in keys.keys(data, start)}
                outcomes = []
                for off, n, _, mask in rows:
                    key = by_offset.get(off) or keys.key(data[off:off + n], start + off)
                    context = Context((off not in gaps) if spec else None, site_kinds(mask), name)
                    outcomes.append(auditor.outcome(model, key, data[off:off + 15], (start + off) & MASK64, context, n))
            for (off, _, own, _), outcome in zip(rows, outcomes):
                out.append(Audited((start + off) & MASK64, f"{name}+{off:#x}", outcome.bucket(own), outcome.group))
    finally:
        auditor.close()
    return out


def spread(sites: list[Audited], n: int, bucket: str = "agree") -> list[Audited]:
    """``n`` sites of ``bucket``, one function after another (each function's in address order)."""
    per_function: dict[str, list[Audited]] = {}
    for site in sites:
        if site.bucket == bucket:
            per_function.setdefault(site.where.rsplit("+", 1)[0], []).append(site)
    queues = [sorted(v, key=lambda s: s.address) for v in per_function.values()]
    out: list[Audited] = []
    while len(out) < n and any(queues):
        for queue in queues:
            if queue and len(out) < n:
                out.append(queue.pop(0))
    return out
