"""The verdict of the instruction that is live at an address, for one trampoline.

``LiveVerdicts.finding(address, raw, tramp)`` answers for the bytes the
machine runs (boot patches applied), not for the bytes on disk: at a
boot-patched site that is one variant, and its own finding is used.  On top
of the checker's finding, a kernel site the policy rejects (``SITE_POLICY``:
extable, bug, kprobe blacklist, noinstr, ...) makes it ``rejected``, and a
paravirt site (whose native bytes are not in the image) ``unknown``.

A plan is proved for one trampoline address; each context's trampoline gets
its own ``Prover`` and so its own proof (most are cache hits: the cache key
leaves the displacement out).  ``StoreVerdicts`` first asks a result store
by address: an instruction whose stored verdict (the weakest over every
variant) is not ``proved`` is refused with the stored reason, and a proved
one is still checked for each context's trampoline.
"""

from __future__ import annotations

from dataclasses import replace

from ..engine.pipeline import Prover
from ..kernel.sites import POLICY_BY_KIND, SiteIndex
from ..proof.verdict import Finding, Verdict

DEFAULT_TIMEOUT_S = 10.0


def _site_verdict(finding: Finding, sites: SiteIndex, address: int, length: int) -> Finding:
    for site in sites.sites_at(address, length):
        policy = POLICY_BY_KIND.get(site.kind)
        if policy is None or policy.consequence == "mark":
            continue
        if policy.consequence == "reject":
            return replace(finding, verdict=Verdict.REJECTED, reason=f"site {site.kind}: {policy.reason}",
                           method="site", rule=f"site:{site.kind}", counterexample=None)
        if site.kind == "paravirt":
            return replace(finding, verdict=Verdict.UNKNOWN, method="site", rule="site:paravirt",
                           reason="site paravirt: the native bytes apply_paravirt() writes are not in the image "
                                  "and are not patched here", counterexample=None)
    return finding


class LiveVerdicts:
    """Checker verdicts of live bytes, one ``Prover`` per trampoline address."""

    def __init__(self, sites: SiteIndex, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.sites = sites
        self.timeout_s = timeout_s
        self._provers: dict[int, Prover] = {}
        self._memo: dict[tuple[int, bytes, int], Finding] = {}

    def prover(self, tramp: int) -> Prover:
        if tramp not in self._provers:
            self._provers[tramp] = Prover(tramp, self.timeout_s)
        return self._provers[tramp]

    def finding(self, address: int, raw: bytes, tramp: int) -> Finding:
        key = (address, raw, tramp)
        if key not in self._memo:
            f = self.prover(tramp).verify(raw, address).finding
            self._memo[key] = _site_verdict(f, self.sites, address, len(raw))
        return self._memo[key]


class StoreVerdicts(LiveVerdicts):
    """A store's verdict by address first (``Store.instruction_at``), then the checker per trampoline."""

    def __init__(self, sites: SiteIndex, store, image_id: int, timeout_s: float = DEFAULT_TIMEOUT_S):
        super().__init__(sites, timeout_s)
        self.store, self.image_id = store, image_id

    def finding(self, address: int, raw: bytes, tramp: int) -> Finding:
        row = self.store.instruction_at(self.image_id, address)
        if row is None:
            return Finding(Verdict.UNKNOWN, f"the store has no instruction at {address:#x}", "store", "", "", "")
        if row.verdict != Verdict.PROVED.value:
            return Finding(Verdict(row.verdict), f"stored: {row.reason}", row.method, row.plan_kind, row.rule,
                           row.klass)
        return super().finding(address, raw, tramp)
