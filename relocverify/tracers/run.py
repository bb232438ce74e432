"""The tracer audit over whole inputs: ``audit(request, models)`` takes the engine's own requests
(``engine.requests``: one image loaded by ``engine.verify.image_request``, a kernel image, kernel modules
laid out in module space, a kernel's vmlinux and every module) and returns an ``AuditSummary``.  The table
``AUDITS`` says, per kind of request, how its images' summaries become one, and why a kind is not audited.

An audit is the engine's request plus an auditor: the request is verified by ``engine.verify.verify``, as
the batch commands do (a complete earlier run is reused), which gives relocverify's own verdict for every
instruction and hands each image over as soon as it is verified (``engine.verify.VerifiedImage``: the
image, the store, its id there).  Each image is audited by one ``Auditor`` for all the images of a request,
at the request's slot, made before the first is verified (its proofs and remembered outcomes are shared
between them): on the run's own workers, as a pass of the run after the verdicts (``audit_pass.AuditPass``,
given in the request's ``stored_passes``: its section of the image's summary), when the request runs on
local workers (``--jobs`` over 1); else, and for ``--jobs 1``, in this process once the image is handed over
(``audit.audit_store``, the reference the pass gives the same summary as).  Several
images' summaries are added up by ``merge``: per tracer, the instructions and the buckets sum, the groups
merge by name, and ``totals_add_up`` is checked again over the sum.  Nothing here writes to the command's
output: the command line builds a request, calls ``audit`` and renders the summary.
"""

from __future__ import annotations

import copy
import time
from contextlib import closing
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Mapping, Optional

from ..engine.requests import ElfRequest, ImageRequest, KernelRequest, ModuleRequest, PackageRequest
from ..engine.verify import VerifiedImage, verify
from ..errors import InputError
from ..store.confirmations import attach
from .audit import BUCKETS, EXAMPLES, Auditor, audit_store
from .audit_pass import AuditPass, image_facts, thunks_of

if TYPE_CHECKING:
    from ..engine.requests import Request
    from ..engine.run import RunOptions
    from ..engine.summary import RunSummary

#: Where the audit's progress goes: (phase, done, total), or None.
Say = Optional[Callable[[str, int, int], None]]

#: Where the verification's progress lines go (``engine.verify.Say``; given, its progress bars are drawn
#: too), or None.
Lines = Optional[Callable[[str], None]]


@dataclass(frozen=True)
class TracerTally:
    """One tracer's counts over the audited instructions: per bucket (``audit.BUCKETS``; read-only), whether
    the buckets and the groups add up to the instructions, and how many instructions are tracer-wrong."""

    name: str
    instructions: int
    buckets: Mapping[str, int]
    totals_add_up: bool
    tracer_wrong: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "buckets", MappingProxyType(dict(self.buckets)))


@dataclass(frozen=True)
class AuditSummary:
    """What one audit produced (``audit``).

    ``document`` is the summary as JSON holds it (``audit --json`` prints it, ``--summary-json`` writes it,
    ``audit.save_summary`` keeps it beside the store; nothing changes it once made): one image's
    (``audit.audit_store``'s, with the image and relocverify's own verdicts), or several images' added up
    (``merge``).  The other fields are what the command line decides by, typed: ``store``: the store's
    path; ``tracers``: each tracer's tally, in the order the tracers were named; ``instructions``: the
    instructions audited; ``wall_s``: the audit's seconds (the verification's not included)."""

    document: dict
    store: str
    tracers: tuple[TracerTally, ...]
    instructions: int
    wall_s: float

    @classmethod
    def of(cls, document: dict, store: str) -> AuditSummary:
        """The summary whose document is ``document`` (an image's audit, or ``merge``'s), typed fields read from it."""
        tallies = tuple(TracerTally(name, t["instructions"], t["buckets"], t["totals_add_up"],
                                    t["buckets"]["tracer-wrong"]) for name, t in document["tracers"].items())
        return cls(document, store, tallies, document["instructions"], document["wall_s"])

    @property
    def totals_add_up(self) -> bool:
        """Every tracer's buckets and groups add up to its instructions."""
        return all(t.totals_add_up for t in self.tracers)

    @property
    def any_tracer_wrong(self) -> bool:
        """Some tracer is wrong about some instruction."""
        return any(t.tracer_wrong for t in self.tracers)

    def confirmed(self, confirmations: dict | None) -> AuditSummary:
        """This summary with what ``confirm --audit`` found on a running kernel given to its groups
        (``store.confirmations.attach``: a copy of the document; the typed fields stay as they are)."""
        if not confirmations:
            return self
        return replace(self, document=attach(copy.deepcopy(self.document), confirmations))


def _needs_facts(auditor: Auditor) -> bool:
    return any(getattr(m, "per_function", False) for m in auditor.models)


def audit_verified(done: VerifiedImage, auditor: Auditor, say: Say = None) -> dict:
    """The audit summary of one image ``engine.verify`` has verified: the audit pass's section of its run's
    summary when the run had the pass, else ``audit_store``'s, made now; with the image and relocverify's own
    verdicts added; a module's thunk range is its vmlinux's.  An image with no function (nothing stored): zero
    instructions, every tracer's tally empty."""
    image, options = done.image, done.options
    if done.image_id is None:
        return {"instructions": 0, "functions": 0, "tracers": {m.name: _empty_tally() for m in auditor.models},
                "image": {"path": image.path, "identity": image.identity, "policy": options.policy}}
    section = done.summary.get("stored_passes", {}).get(AuditPass.name)
    if section is not None:
        summary = dict(section)
    else:
        thunks = None if done.kernel is None else thunks_of(done.kernel)
        facts = image_facts(image, options.with_sites, thunks) if _needs_facts(auditor) else None
        summary = audit_store(done.store, auditor, done.image_id, options.limit, say, facts)
    summary["image"] = {"path": image.path, "identity": image.identity, "policy": options.policy}
    summary["own"] = {"by_verdict": done.summary["by_verdict"], "instructions": done.summary["instructions"]}
    return summary


class _Audit:
    """What ``engine.verify`` hands each image to (``on_image``): the image audited as it arrives, its
    summary kept by its name (``parts``, in the order verified).  A kernel's audit says its progress; a
    module's is short, and the modules are counted instead."""

    def __init__(self, auditor: Auditor, say: Say, options: RunOptions):
        self.auditor, self.say = auditor, say
        self.parts: dict[str, dict] = {}
        self.kernels = 0  # images handed over that are not modules (a package's vmlinux)
        self.audit_pass = AuditPass(auditor, options.with_sites, options.cache_dir, say) if _on_workers(options) \
            else None

    def asked(self, request: Request) -> Request:
        """``request``, with the audit as a pass of its runs when it has one (``audit_pass``)."""
        if self.audit_pass is None:
            return request
        return replace(request, options=replace(request.options, stored_passes=(self.audit_pass,)))

    def __call__(self, done: VerifiedImage) -> None:
        module = done.kernel is not None
        self.parts[done.name] = audit_verified(done, self.auditor, None if module else self.say)
        if not module:
            self.kernels += 1
        elif self.say is not None:
            self.say("modules", done.number - self.kernels, done.images - self.kernels)


def _on_workers(options: RunOptions) -> bool:
    """Whether the audit runs on the run's own workers (``audit_pass``): more than one, forked here (a Dask worker
    cannot read the run's store)."""
    return options.jobs > 1 and options.scheduler is None and options.dask_local is None


def _auditor(models: list, options: RunOptions) -> Auditor:
    """The command's ``Auditor``: ``models`` at ``options``' slot, with its timeout and proof cache."""
    return Auditor(models, options.tramp, options.timeout_s, options.cache_dir)


@dataclass(frozen=True)
class AuditWay:
    """How ``audit`` audits one kind of request: whether the verification's progress lines are shown, how the
    images' summaries become one, and why; or, ``refused`` given, why that kind is not audited."""

    lines: bool = True  # the verification's progress lines and bars shown (else only the audit's own progress)
    merged: bool = False  # several images' summaries merged (``merge``); else the one image's is the document
    source: bool = False  # the merged document says which parts were used (a package's ``KernelParts.used``)
    does: str = ""
    refused: str | None = None  # why the audit does not take this kind, and what to give it instead


#: Per kind of request (``engine.requests``), how it is audited.
AUDITS: dict[type, AuditWay] = {
    KernelRequest: AuditWay(does="a kernel image verified as relocverify vmlinux does (always loaded, to be handed "
                                 "over): its audit summary, with its own verdicts"),
    ElfRequest: AuditWay(refused="each user-space file has its own slot and an auditor has one: audit the files one "
                                 "at a time, each as an ImageRequest (engine.verify.image_request)"),
    ModuleRequest: AuditWay(lines=False, merged=True,
                            does="modules against their vmlinux, merged; a module's run draws no bars: the audit's "
                                 "own progress counts the modules"),
    PackageRequest: AuditWay(merged=True, source=True,
                             does="a kernel's vmlinux and every module on one session, merged, with the line saying "
                                  "which parts were used"),
    ImageRequest: AuditWay(does="the audit's IMAGE, a kernel's or a user-space file's, loaded with its slot settled "
                                "(engine.verify.image_request): its audit summary, with its own verdicts"),
}


def audit_way(request: Request) -> AuditWay:
    """How ``request`` is audited (its row of ``AUDITS``); a kind the audit refuses, or an object that is not a
    request, is a caller's mistake, said with what to give instead."""
    way = AUDITS.get(type(request))
    if way is None:
        taken = ", ".join(t.__name__ for t, w in AUDITS.items() if w.refused is None)
        raise InputError(f"the audit takes a request of engine.requests ({taken}); {type(request).__name__} is not one")
    if way.refused is not None:
        raise InputError(f"the audit takes no {type(request).__name__}: {way.refused}")
    return way


def audit(request: Request, models: list, say: Say = None, lines: Lines = None) -> AuditSummary:
    """Every image ``request`` names verified (``engine.verify.verify``, with ``lines`` where ``AUDITS`` shows
    them), each audited for ``models`` as it is handed over, by one ``Auditor`` at the request's slot; one
    image's summary is ``audit_store``'s with the image and relocverify's own verdicts added, several images'
    are merged (``merge``; a module without a function counts zero instructions)."""
    way = audit_way(request)
    with closing(_auditor(models, request.options)) as auditor:
        each = _Audit(auditor, say, request.options)
        verified = verify(each.asked(request), lines if way.lines else None, on_image=each)
        if way.merged:
            return merge(each.parts, auditor, verified.store, _source(verified) if way.source else None)
    (document,) = each.parts.values()
    return AuditSummary.of(document, verified.store)


def _source(verified: RunSummary) -> str:
    """A package's line saying which parts were used (``image.debian.KernelParts.used``)."""
    return verified.document["source"]["used"]


def _empty_tally() -> dict:
    return {"instructions": 0, "buckets": {b: 0 for b in BUCKETS}, "totals_add_up": True,
            "groups": {b: [] for b in BUCKETS}}


def merge(parts: dict[str, dict], auditor: Auditor, store: str, source: str | None = None) -> AuditSummary:
    """Several images' audit summaries as one: per tracer the instructions and buckets summed, the
    groups merged by (bucket, group) with their counts summed and the first few instances kept, and
    per image its instructions and buckets (``images``); ``source``: a package's line saying which
    parts were used."""
    t0 = time.monotonic()
    tracers: dict[str, dict] = {}
    for part in parts.values():
        for name, t in part["tracers"].items():
            into = tracers.setdefault(name, _empty_tally() | {"source": t.get("source", "")})
            into["instructions"] += t["instructions"]
            for k, n in t.get("cpu_replay", {}).items():
                into.setdefault("cpu_replay", {})[k] = into.get("cpu_replay", {}).get(k, 0) + n
            for b in BUCKETS:
                into["buckets"][b] += t["buckets"][b]
                groups = {g["group"]: g for g in into["groups"][b]}
                for g in t["groups"][b]:
                    have = groups.get(g["group"])
                    if have is None:
                        groups[g["group"]] = dict(g, examples=list(g["examples"]))
                    else:
                        have["count"] += g["count"]
                        have["examples"].extend(g["examples"][:EXAMPLES - len(have["examples"])])
                into["groups"][b] = sorted(groups.values(), key=lambda g: -g["count"])
    for t in tracers.values():
        t["totals_add_up"] = sum(t["buckets"].values()) == t["instructions"] and sum(
            g["count"] for gs in t["groups"].values() for g in gs) == t["instructions"]
    images = {label: {"instructions": p["instructions"],
                      "tracers": {n: t["buckets"] for n, t in p["tracers"].items()}} for label, p in parts.items()}
    document = {"instructions": sum(p["instructions"] for p in parts.values()),
                "functions": sum(p.get("functions", 0) for p in parts.values()), "tramp": hex(auditor.tramp),
                "cases": sum(p.get("cases", 0) for p in parts.values()), "tracers": tracers, "images": images,
                "counts": dict(auditor.counts), "wall_s": round(sum(p.get("wall_s", 0) for p in parts.values())
                                                              + time.monotonic() - t0, 3)}
    if source is not None:
        document["source"] = source
    return AuditSummary.of(document, store)
