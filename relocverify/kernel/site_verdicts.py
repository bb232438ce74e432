"""An instruction's verdict in the light of the kernel sites that cover it.

The weakest verdict wins (``Verdict`` order): a site the policy rejects
makes it ``rejected``; at a boot-patched site every variant that can run is
verified and the weakest of their verdicts is kept, and a site whose
variants are not in the image makes it ``unknown``.  A refutation of the
bytes on disk is never hidden.  ``site_finding`` also returns each live
variant's own finding, for the store and the report.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from ..proof.verdict import Finding, Verdict
from .sites import POLICY_BY_KIND, Site
from .variants import NoVariants, VariantFinder

VerifyBytes = Callable[[bytes], Finding]  # the finding for other bytes at the same address


def site_finding(finding: Finding, found: Sequence[Site], address: int, raw: bytes, variants: VariantFinder,
                 verify: VerifyBytes, made: dict | None = None) -> tuple[Finding, tuple[tuple[str, Finding], ...]]:
    """(the instruction's finding over every site in ``found``, (variant name, its finding) per live variant).
    ``made``: a memo of the findings this makes from a variant's, kept by the caller across calls, so that equal
    ones are one object (a kernel's 48 k return sites make the same one; its outcome fields are then computed
    once)."""
    worst = finding
    live: list[tuple[str, Finding]] = []
    for site in found:
        policy = POLICY_BY_KIND.get(site.kind)
        if policy is None or policy.consequence == "mark":
            continue
        if policy.consequence == "reject":
            cand = replace(finding, verdict=Verdict.REJECTED, reason=f"site {site.kind}: {policy.reason}",
                           method="site", rule=f"site:{site.kind}", counterexample=None)
        else:
            found_variants = variants.variants_at(site, address, raw)
            if isinstance(found_variants, NoVariants):
                cand = replace(finding, verdict=Verdict.UNKNOWN, reason=f"site {site.kind}: {found_variants.reason}",
                               method="site", rule=f"site:{site.kind}", counterexample=None)
            else:
                cand = finding
                for v in found_variants:
                    name = f"{site.kind}: {v.name}"
                    if any(n == name for n, _ in live):
                        continue  # the same variant of another site of this kind
                    if v.raw == raw:
                        live.append((name, finding))
                        continue
                    vf = verify(v.raw)
                    live.append((name, vf))
                    if vf.weaker_than(cand):
                        cand = _of_variant(vf, site.kind, v.name, finding.klass, made)
        if cand.weaker_than(worst):
            worst = cand
    return worst, tuple(live)


def _of_variant(vf: Finding, kind: str, name: str, klass: str, made: dict | None) -> Finding:
    """The instruction's finding made from its variant's: by ``made`` when it holds one (keyed by the variant
    finding's identity, which its value keeps alive)."""
    key = (id(vf), kind, name, klass)
    got = None if made is None else made.get(key)
    if got is not None and got[0] is vf:
        return got[1]
    out = replace(vf, reason=f"site {kind}, variant {name}: {vf.reason}", klass=klass)
    if made is not None:
        made[key] = (vf, out)
    return out
