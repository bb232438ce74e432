"""One function of an image verified on its own: the rows ``relocverify vmlinux`` would store for it, without
a store, a pool or a survey.

``verify_function(image, function, tramp, timeout)`` walks the function's instructions as the batch does
(iced-x86, linearly from its start: ``image.functions.iter_instruction_spans``) and gives each one its
finding through the engine's one per-instruction pipeline (``pipeline.Prover``: decode, plan, proof,
the proof cache's full keys first when the prover has them).  With ``sites`` (a kernel's
``SiteIndex``, or the on-disk index's ``IndexedSites``) the kernel sites covering each instruction are
applied, and every variant that can run at a boot-patched site is verified, as ``Worker.function_rows``
does (``kernel.site_verdicts.site_finding``, sites in the same order), so the verdict is the one the
store would hold.

What differs from a batch run: every instruction is verified here (the batch looks findings up by
instance key, which stands for the same full key, plan and class: ``engine.keys``), and an instruction
that an overlapping function owns in a batch (``engine.run.overlaps``) is verified here as part of
this function too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..image.functions import Function, iter_instruction_spans
from ..image.image import Image
from ..kernel.site_verdicts import site_finding
from ..kernel.sites import kind_key
from ..kernel.variants import VariantFinder
from ..proof.verdict import Finding
from ..store.store import InstructionRow, site_kinds, site_mask

if TYPE_CHECKING:  # the pipeline (decoders, planner) is imported when a function is verified, not to read rows
    from .pipeline import Prover


@dataclass(frozen=True)
class FunctionRow:
    """One instruction of a function: its row as the store holds it, each live variant at a boot-patched
    site as (name, verdict, reason), and its counterexample as JSON (``Counterexample.as_json``, or the
    store's ``{"state", "differences", "replay"}``), when refuted."""

    row: InstructionRow
    variants: tuple[tuple[str, str, str], ...] = ()
    counterexample: dict | None = None


def verify_function(image: Image, function: Function, tramp: int, timeout: float, sites=None,
                    prover: Prover | None = None) -> list[FunctionRow]:
    """Every instruction of ``function`` in ``image`` with its finding (see the module doc).

    ``sites``: anything with ``sites_at(address, length)`` (None: not a kernel, no site checks);
    ``prover``: the one to use (say, one that asks the persistent proof cache), else a new one for
    ``tramp`` and ``timeout`` (seconds per proof)."""
    from .pipeline import Prover

    prover = prover or Prover(tramp, timeout)
    variants = VariantFinder(image) if sites is not None else None
    covering = [] if sites is None else sorted(sites.sites_at(function.start, function.size), key=lambda s: s.address)
    rows = []
    for address, raw in iter_instruction_spans(image, function):
        finding = prover.verify(raw, address).finding
        here = _overlapping(covering, address, len(raw))
        live: tuple = ()
        if here:
            finding, live = site_finding(finding, here, address, raw, variants,
                                         lambda other, at=address: prover.verify(other, at).finding)
        rows.append(FunctionRow(_row(function, address, raw, finding, here),
                                tuple((name, f.verdict.value, f.reason) for name, f in live),
                                None if finding.counterexample is None else finding.counterexample.as_json()))
    return rows


def _overlapping(covering: list, address: int, length: int) -> list:
    """The sites overlapping [address, address+length), ordered as the batch orders them (by kind)."""
    found = [s for s in covering if s.address < address + length and s.address + s.length > address]
    return sorted(found, key=lambda s: kind_key(s.kind)) if len(found) > 1 else found


def _row(function: Function, address: int, raw: bytes, f: Finding, here: list) -> InstructionRow:
    return InstructionRow(address, len(raw), raw, function.name, function.start, function.section,
                          f.verdict.value, f.method, f.plan_kind, f.rule, f.klass, f.reason_key, f.reason,
                          f.proof_us, f.fresh, site_kinds(site_mask(s.kind for s in here)), f.answers, None)
