"""One instruction verified now, as ``relocverify check`` asks: its plan for a trampoline, and its finding.

``verify_instruction(decoded, tramp, timeout)`` plans the decoded instruction (``plan.plan.make_plan``)
and gives it its finding through the engine's one per-instruction pipeline (``pipeline.Prover``), the
persistent proof cache asked first, one full key at a time, and given the proofs made.  With ``sites``
(a kernel's ``SiteIndex``, or the on-disk index's ``IndexedSites``) and its ``image``, the kernel sites
at the instruction are applied and every variant that can run there is verified
(``kernel.site_verdicts.site_finding``), so the verdict is the one a batch run stores for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..store.cache import ProofCache

if TYPE_CHECKING:  # the pipeline (decoders, planner, prover) is imported when an instruction is verified
    from ..image.image import Image
    from ..plan.plan import Plan
    from ..proof.verdict import Finding
    from ..x86.instruction import Decoded


@dataclass(frozen=True)
class SiteNote:
    """A kernel site covering the instruction, with what a site of its kind does to a verdict and why
    (``kernel.sites.POLICY_BY_KIND``; a kind that table lacks is a ``mark`` with no reason)."""

    kind: str
    address: int
    length: int
    consequence: str
    reason: str

    def as_json(self) -> dict:
        return {"kind": self.kind, "address": hex(self.address), "length": self.length,
                "consequence": self.consequence, "reason": self.reason}


@dataclass(frozen=True)
class InstructionCheck:
    """An instruction's plan and its finding (over its kernel sites, when there were any to ask);
    ``sites``: the sites covering it, or None when no site index was given."""

    plan: Plan
    finding: Finding
    sites: tuple[SiteNote, ...] | None = None


def verify_instruction(decoded: Decoded, tramp: int, timeout: float, cache_dir: str | None = None,
                       image: Image | None = None, sites=None) -> InstructionCheck:
    """``decoded`` planned for the trampoline at ``tramp`` and proved (``timeout`` seconds per proof);
    ``cache_dir``: the persistent proof cache's directory (None: no cache); ``sites`` (with the ``image``
    they belong to): anything with ``sites_at(address, length)``, None for no site checks."""
    from ..plan.plan import make_plan
    from ..proof.cache_key import cache_tag
    from .pipeline import Prover

    plan = make_plan(decoded, tramp)
    cache = ProofCache(cache_dir)
    try:
        tag = cache_tag()
        prover = Prover(tramp, timeout, (lambda: cache.lookup(tag)) if cache.enabled else None)
        finding = prover.verify(decoded.raw, decoded.address).finding
        notes = None
        if sites is not None:
            finding, notes = _with_sites(image, sites, decoded, finding, prover)
        if prover.new_proofs:
            cache.add(tag, {}, prover.new_proofs)
    finally:
        cache.close()
    return InstructionCheck(plan, finding, notes)


def _with_sites(image: Image, sites, decoded: Decoded, finding: Finding, prover) -> tuple[Finding, tuple[SiteNote, ...]]:
    """The finding at the instruction's address in the kernel image, over its sites and every variant that
    can run there; and the sites."""
    from ..kernel.site_verdicts import site_finding
    from ..kernel.sites import POLICY_BY_KIND
    from ..kernel.variants import VariantFinder

    found = tuple(sites.sites_at(decoded.address, decoded.length))
    new, _ = site_finding(finding, found, decoded.address, decoded.raw, VariantFinder(image),
                          lambda other: prover.verify(other, decoded.address).finding)
    notes = tuple(SiteNote(s.kind, s.address, s.length,
                           POLICY_BY_KIND[s.kind].consequence if s.kind in POLICY_BY_KIND else "mark",
                           POLICY_BY_KIND[s.kind].reason if s.kind in POLICY_BY_KIND else "") for s in found)
    return new, notes


@dataclass(frozen=True)
class LiveCheck:
    """An instruction judged on its live bytes: their plan and finding (``check``), each site as it is live
    (``kernel.live.LiveSite``), and the file's bytes at the address for comparison."""

    check: InstructionCheck
    sites: tuple  # kernel.live.LiveSite per verify-variants site at the instruction
    file_raw: bytes
    live_raw: bytes


def verify_live(live_decoded: Decoded, file_raw: bytes, tramp: int, timeout: float, cache_dir: str | None,
                image: Image, sites) -> LiveCheck:
    """``live_decoded`` (the instruction as it runs) planned and proved, with the kernel sites at its address:
    a rejecting site rejects it as in the file; at a boot-patched site the live bytes are what runs, and at a
    site that switches again at runtime (``kernel.live.RUNTIME_KINDS``) every variant the model allows is
    verified too and the weakest verdict kept (``kernel.site_verdicts.site_finding``)."""
    from ..kernel.live import LiveVariants, live_variant
    from ..kernel.site_verdicts import site_finding
    from ..kernel.sites import POLICY_BY_KIND
    from ..kernel.variants import VariantFinder
    from ..plan.plan import make_plan
    from ..proof.cache_key import cache_tag
    from .pipeline import Prover

    address, live_raw = live_decoded.address, live_decoded.raw
    plan = make_plan(live_decoded, tramp)
    cache = ProofCache(cache_dir)
    try:
        prover = Prover(tramp, timeout, (lambda: cache.lookup(cache_tag())) if cache.enabled else None)
        finding = prover.verify(live_raw, address).finding
        found = tuple(sites.sites_at(address, max(len(file_raw), len(live_raw))))
        finder = VariantFinder(image)
        finding, _ = site_finding(finding, found, address, live_raw, LiveVariants(finder, file_raw, live_raw),
                                  lambda other: prover.verify(other, address).finding)
        if prover.new_proofs:
            cache.add(cache_tag(), {}, prover.new_proofs)
    finally:
        cache.close()
    notes = tuple(SiteNote(s.kind, s.address, s.length,
                           POLICY_BY_KIND[s.kind].consequence if s.kind in POLICY_BY_KIND else "mark",
                           POLICY_BY_KIND[s.kind].reason if s.kind in POLICY_BY_KIND else "") for s in found)
    named = tuple(live_variant(s.kind, s.address, finder.variants_at(s, address, file_raw), live_raw, file_raw)
                  for s in found if POLICY_BY_KIND.get(s.kind) and POLICY_BY_KIND[s.kind].consequence ==
                  "verify-variants")
    return LiveCheck(InstructionCheck(plan, finding, notes), named, file_raw, live_raw)
