"""The summary of a run: counts over every stored instruction of an image, and its text form; the summary
of an image with nothing to verify; totals over several images; and ``RunSummary``, what the engine's one
entry point (``engine.verify.verify``) returns for any request."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterable, Mapping

from ..proof.verdict import Verdict
from ..store.store import Store, site_kinds


def summarize(store: Store, image: int, image_info: dict, functions: int, expected: int, site_index=None) -> dict:
    """Counts over every stored instruction of the image, in one grouped scan of the store."""
    by_verdict = Counter({v.value: 0 for v in Verdict})
    by_section: dict[str, Counter] = {}
    by_class: dict[str, Counter] = {}
    reasons, methods, plans, site_rows = Counter(), Counter(), Counter(), Counter()
    rows, weak_functions, packed_sites = store.tallies(image, sites=site_index is not None)
    for sec, verdict, method, kind, _rule, klass, rkey, n in rows:
        by_verdict[verdict] += n
        by_section.setdefault(sec, Counter())[verdict] += n
        by_class.setdefault(klass, Counter())[verdict] += n
        reasons[rkey] += n
        methods[method] += n
        plans[kind] += n
    for mask, n in (store.site_counts(image, packed_sites) if site_index is not None else ()):
        for k in site_kinds(mask):
            site_rows[k] += n
    by_function: dict[str, Counter] = {}
    names = store.function_names(image) if weak_functions else {}
    for fid, counts in weak_functions.items():
        for verdict, n in counts.items():
            if verdict != Verdict.PROVED.value:
                by_function.setdefault(verdict, Counter())[names[fid]] += n
    n = sum(by_verdict.values())
    verified = store.verified_function_count(image)
    relocatable = n - by_verdict[Verdict.REJECTED.value]
    summary = {
        "image": image_info,
        "instructions": n,
        "instructions_expected": expected,
        "functions": functions,
        "functions_verified": verified,
        "by_verdict": dict(by_verdict),
        "proved_share_of_relocatable": round(by_verdict[Verdict.PROVED.value] / relocatable, 6) if relocatable else None,
        "by_method": dict(methods),
        "by_plan": dict(plans),
        "by_reason": dict(reasons.most_common()),
        "by_section": {k: dict(v) for k, v in sorted(by_section.items())},
        "by_class": {k: dict(v) for k, v in sorted(by_class.items(), key=lambda kv: -sum(kv[1].values()))},
        "top_functions": {v: [{"function": f, "instructions": c} for f, c in by_function.get(v, Counter()).most_common(10)]
                          for v in ("rejected", "unknown", "opaque", "refuted")},
        "totals_add_up": n == expected,
    }
    if site_index is not None:
        counts = site_index.count_by_kind()
        summary["by_site"] = {k: {"sites": counts.get(k, 0), "instructions": site_rows.get(k, 0)}
                              for k in site_index.kinds()}
        summary["sites_missing"] = list(site_index.missing)
    return summary


def replacement_summary(rows: list[tuple], alternatives: int) -> dict:
    """Counts over the alternative replacements' instructions: (alternative, site, address, bytes,
    verdict, reason) rows."""
    by_verdict = {v.value: 0 for v in Verdict}
    reasons: Counter = Counter()
    n = 0
    for _alt, _site, _address, raw, verdict, reason in rows:
        if not raw:
            by_verdict[verdict] += 1
            reasons[reason] += 1
            continue
        n += 1
        by_verdict[verdict] += 1
        if verdict != Verdict.PROVED.value:
            reasons[reason] += 1
    return {"sites": alternatives, "instructions": n, "by_verdict": by_verdict, "by_reason": dict(reasons.most_common())}


def render_summary(s: dict, escape=lambda text: text) -> str:
    """The summary as text; ``escape`` makes names from the input safe for a terminal."""
    img = s["image"]
    lines = [f"image: {escape(str(img.get('path')))} ({img.get('format')}, symbols: {img.get('symbols')})",
             f"instructions: {s['instructions']:,} in {s['functions']:,} functions "
             f"({s['functions_verified']:,} verified); expected {s['instructions_expected']:,}; "
             f"totals add up: {s['totals_add_up']}",
             "by verdict: " + ", ".join(f"{k} {v:,}" for k, v in s["by_verdict"].items()),
             "by method: " + ", ".join(f"{k} {v:,}" for k, v in sorted(s["by_method"].items())),
             "by section:"]
    if s.get("proved_share_of_relocatable") is not None:
        lines.insert(3, f"proved: {100 * s['proved_share_of_relocatable']:.2f}% of the instructions the policy relocates")
    lines[1:1] = [f"note: {escape(str(note))}" for note in img.get("notes") or ()]  # what the loader adjusted
    for sec, d in sorted(s["by_section"].items()):
        lines.append(f"  {escape(sec):<24} " + ", ".join(f"{k} {v:,}" for k, v in sorted(d.items())))
    lines.append("top reasons:")
    for r, c in list(s["by_reason"].items())[:15]:
        lines.append(f"  {c:>9,}  {escape(r)}")
    for verdict in ("rejected", "unknown"):
        tops = s["top_functions"][verdict][:5]
        if tops:
            lines.append(f"top functions by {verdict}: "
                         + ", ".join(f"{escape(t['function'])} ({t['instructions']})" for t in tops))
    if "by_site" in s:
        lines.append("sites (table entries / instructions covered):")
        for k, v in s["by_site"].items():
            lines.append(f"  {k:<18} {v['sites']:>8,} {v['instructions']:>10,}")
    if "alternative_replacements" in s:
        a = s["alternative_replacements"]
        lines.append(f"alternative replacements: {a['sites']:,} sites, {a['instructions']:,} instructions: "
                     + ", ".join(f"{k} {v:,}" for k, v in a["by_verdict"].items()))
    if "jump_probe" in s:
        j = s["jump_probe"]
        lines.append(f"jump probes: {j['eligible']:,} eligible ({100 * j['share']:.1f}%), "
                     f"{sum(j['refused'].values()):,} refused; totals add up: {j['totals_add_up']}")
        for k, v in list(j["refused"].items())[:12]:
            lines.append(f"  {v:>9,}  {escape(k)}")
    run = s.get("run", {})
    if run and run.get("verified_now") == 0 and run.get("status") == "complete" and s.get("instructions"):
        verdicts = ", ".join(f"{k} {v:,}" for k, v in s["by_verdict"].items())
        lines.append(f"already complete: {s['instructions']:,} instructions, verdicts {verdicts} "
                     f"(stored by an earlier run; nothing to verify)")
        return "\n".join(lines) + "\n"
    if run:
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in run.get("phases", {}).items())
        lines.append(f"run {run.get('id')}: {run.get('status')}; {phases}")
        pc = run.get("proof_cache")
        if pc:
            reused = f", {pc['functions_reused']:,} functions' rows reused" if pc.get("functions_reused") else ""
            lines.append(f"proof cache: {pc['keys']:,} instance keys, {pc['cached']:,} known, {pc['proved']:,} proved now"
                         + reused)
    lines.append(f"wall: {s.get('wall_s', 0):.1f} s, {s.get('instructions_per_s') or 0:,.0f} insn/s verified in this run")
    return "\n".join(lines) + "\n"


def empty_summary(image, jump_probes: bool = False) -> dict:
    """The summary of an image with no function to verify: zero instructions, totals that add up."""
    summary = {"image": {"path": image.path, "identity": image.identity}, "instructions": 0,
               "instructions_expected": 0, "functions": 0, "by_verdict": {v.value: 0 for v in Verdict},
               "totals_add_up": True}
    if jump_probes:
        from .jumps import empty_jump_section

        summary["jump_probe"] = empty_jump_section()
    return summary


def totals_over(summaries: Iterable[dict]) -> tuple[dict[str, int], bool]:
    """Verdict counts summed over several images' summaries, and whether each one's totals add up."""
    summaries = list(summaries)
    totals: dict[str, int] = {}
    for s in summaries:
        for verdict, n in s["by_verdict"].items():
            totals[verdict] = totals.get(verdict, 0) + n
    return totals, all(s["totals_add_up"] for s in summaries)


@dataclass(frozen=True)
class RunSummary:
    """What one request did (``engine.verify.verify``).

    ``document`` is the summary as JSON holds it (``--summary-json`` writes it as it is; nothing changes it
    once made): one image's (``engine.run.run``) when ``batch`` is false, else a batch's, with every image's
    summary, the totals and, with jump probes, theirs.  The other fields are what the command line shows
    and decides by, typed: ``by_verdict`` over every image; ``totals_add_up``: every image's instructions
    add up to its expected count (the document's ``totals_add_up``); ``complete``: every total the command
    checks adds up and the run completed (``vmlinux``: the instructions'; the other commands: the jump
    probes' too, when asked for); ``store``: the store's path; ``wall_s``: the run's seconds (a batch's:
    from its first image loaded to the totals)."""

    document: dict
    store: str
    by_verdict: Mapping[str, int]
    totals_add_up: bool
    complete: bool
    batch: bool = False
    images: int = 1  # images with a summary (a batch: those with no function included)
    wall_s: float = 0.0
    tramp: int | None = None  # one image: the trampoline every plan used
    label: str | None = None  # package: the kernel as its argument names it (a named kernel, a path's last part)
    modules: int = 0  # package: the modules named (after --limit-modules)
    module_by_verdict: Mapping[str, int] | None = None  # package: by verdict over the modules alone (None: none)
    module_instructions: int = 0  # package: the modules' instructions
    skipped: tuple[tuple[str, int], ...] = ()  # elf: why files were skipped, with how many, the most first

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_verdict", MappingProxyType(dict(self.by_verdict)))
        if self.module_by_verdict is not None:
            object.__setattr__(self, "module_by_verdict", MappingProxyType(dict(self.module_by_verdict)))

    @property
    def instructions(self) -> int:
        """Every image's instructions: the verdicts' total."""
        return sum(self.by_verdict.values())
