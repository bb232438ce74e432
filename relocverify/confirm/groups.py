"""A stored tracer audit confirmed group by group: ``relocverify confirm --audit STORE``.

For every ``tracer-wrong`` group of the audit's summary (``STORE.audit.json``, ``tracers.audit``) of a
tracer confirm can place (kprobes, optprobes, uprobes; kinst and fasttrap are FreeBSD's), the
group's instances the summary keeps (up to three) are probed in turn until one is executed, with the
shipped trigger of its class (``triggers.group_class``, ``for_group``), through ``register_kprobe``
when kprobe_events refuses one.  When that does not show
the class here (not executed, refused), the shipped stand-ins of the class are probed (``stand_ins``:
sites the triggers run, of the same class, each saying why it stands for it), and the result says so:
uprobes' instances in a kernel image are kernel addresses (uprobes probes user programs), the
cs-call group's first instances are ptrace requests, ``blake2s_compress_avx512`` never runs on a CPU
without AVX-512, ``startup_64`` runs once at boot.  A stand-in several groups share is probed once.
``--controls N`` adds, per kernel tracer, ``N`` sites the audit puts in ``agree`` among the
functions the control trigger runs (``controls``), probed all at once; each must come out
``not-reproduced`` (or ``not-executed``: the trigger missed it).

The result is a ``GroupResult`` per group (and per tracer's controls), written beside the store as
``STORE.confirm.json`` (``store.confirmations``: with the audited image, the kernel's version and the
accelerator, which the audit's summary and report show as ``tracer-wrong (reproduced on 6.1.187,
QEMU TCG)``) as well as returned.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace

from ..errors import InputError
from ..store import confirmations
from .confirmation import Confirmation, Request, confirm
from .controls import audited_sites, spread
from .outcome import Outcome
from .triggers import BY_NAME, TRIGGERS, group_class

PLACEABLE = {"kprobes": "kprobes", "optprobes": "optprobes", "uprobes": "uprobes"}


@dataclass(frozen=True)
class GroupResult:
    tracer: str  # the audit's name: kprobes@6.1
    bucket: str  # 'tracer-wrong', or 'agree' for the controls
    group: str
    count: int  # instructions in the group (controls: sites probed)
    confirmations: tuple[Confirmation, ...]
    note: str  # what the sites stand for, or why there are none

    @property
    def outcome(self) -> Outcome | None:
        """The strongest outcome over the sites probed, each site's last attempt counting (a refusal by
        kprobe_events is superseded by the same site through register_kprobe)."""
        last = {(c.site.text, c.site.address): c.outcome for c in self.confirmations}
        return max(last.values(), default=None)

    def as_json(self) -> dict:
        counts: dict[str, int] = {}
        for c in self.confirmations:
            counts[c.outcome.label] = counts.get(c.outcome.label, 0) + 1
        return {"tracer": self.tracer, "bucket": self.bucket, "group": self.group, "count": self.count,
                "outcome": None if self.outcome is None else self.outcome.label, "outcomes": counts,
                "note": self.note, "sites": [c.as_json() for c in self.confirmations]}


def load_summary(store: str) -> dict:
    from ..tracers.audit import summary_path

    path = summary_path(store)
    try:
        with open(path) as handle:
            summary = json.load(handle)
    except OSError:
        raise InputError(f"--audit {store}: no audit summary at {path}: run relocverify audit --db {store} "
                         f"first") from None
    except ValueError:
        raise InputError(f"--audit {store}: {path} is not an audit summary (not JSON)") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("tracers"), dict):
        raise InputError(f"--audit {store}: {path} has no tracers: not an audit summary")
    return summary


def confirm_audit(store: str, guest, base: Request, names: tuple[str, ...] = (), controls: int = 0,
                  tracers: tuple[str, ...] = (), cache_dir: str | None = None, say=None) -> list[GroupResult]:
    """See the module doc.  ``base``: the request every confirmation starts from (command line, time
    limits, accelerator); ``names``: only groups whose name contains one of these (empty: all);
    ``tracers``: only these (kprobes or kprobes@6.1; empty: every tracer confirm can place)."""
    summary = load_summary(store)
    results = []
    memo: dict = {}
    for tracer, tally in summary["tracers"].items():
        kind = PLACEABLE.get(tracer.split("@", 1)[0])
        if kind is None or (tracers and tracer not in tracers and tracer.split("@", 1)[0] not in tracers):
            continue
        for group in tally.get("groups", {}).get("tracer-wrong", []):
            if names and not any(n in group["group"] for n in names):
                continue
            results.append(_group(tracer, kind, group, guest, base, cache_dir, say, memo))
        if controls and kind != "uprobes":
            results.append(_controls(store, tracer, kind, summary, guest, base, controls, cache_dir, say))
    _save(store, summary, guest, results)
    return results


def _group(tracer: str, kind: str, group: dict, guest, base: Request, cache_dir, say, memo: dict) -> GroupResult:
    examples = group.get("examples") or []
    raw = bytes.fromhex(examples[0]["bytes"]) if examples and examples[0].get("bytes") else b""
    cause = group_class(group["group"], raw)
    done: list[Confirmation] = []
    notes = []
    if kind == "uprobes":
        notes.append("the audit's instances are kernel addresses and uprobes probes user programs")
    else:
        for example in examples:  # the audit keeps a few instances: the next when one is not executed here
            done += _first(example, replace(base, tracer=kind, causes=(cause,), trigger=()), guest, cache_dir, say,
                           notes)
            if done and done[-1].outcome is not Outcome.NOT_EXECUTED:
                break
    shown = any(c.outcome in (Outcome.REPRODUCED, Outcome.NOT_REPRODUCED, Outcome.PATCHED_AT_BOOT) for c in done)
    for trigger, stand_in in [] if shown else stand_ins(kind, cause):
        notes.append(f"stand-in of the class in the {trigger.name} trigger: {stand_in.site} ({stand_in.why})")
        key = (kind, stand_in.site, base.cmdline)
        if key not in memo:  # several groups of one class share a stand-in: it is probed once
            memo[key] = confirm(replace(base, tracer=kind, sites=(stand_in.site,), causes=(cause,),
                                        trigger=(trigger.name,), via=trigger.via, elf=None), guest, cache_dir, say)
        done += memo[key]
    return GroupResult(tracer, "tracer-wrong", group["group"], group.get("count", 0), tuple(done), "; ".join(notes))


def stand_ins(kind: str, cause: str) -> list:
    """(trigger, stand-in) for a class of ``kind``'s groups: every shipped stand-in whose word the class contains."""
    return [(t, s) for t in TRIGGERS for s in t.stand_ins if s.tracer == kind and s.word in cause]


def _first(example: dict, request: Request, guest, cache_dir, say, notes: list) -> list[Confirmation]:
    """The group's first instance, by name (by address when the name is not one function's); through
    register_kprobe too when kprobe_events refuses it (a notrace function: Debian's config lacks
    KPROBE_EVENTS_ON_NOTRACE)."""
    for site in (example["function"], example["address"]):
        try:
            done = confirm(replace(request, sites=(site,)), guest, cache_dir, say)
        except InputError as exc:  # a site this guest cannot probe: said, and the next form is tried
            notes.append(f"{site}: {exc}")
            continue
        if done[0].outcome is Outcome.REFUSED and request.tracer != "uprobes" and request.via == "events":
            notes.append(f"{site}: kprobe_events refused it ({done[0].decision.evidence}); through register_kprobe")
            done += confirm(replace(request, sites=(site,), via="module"), guest, cache_dir, say)
        return done
    return []


def _controls(store: str, tracer: str, kind: str, summary: dict, guest, base: Request, n: int, cache_dir,
              say) -> GroupResult:
    from ..store.image_index import indexed

    trigger = BY_NAME["syscalls"]
    index = indexed(guest.vmlinux, guest.system_map)
    tramp = int(summary.get("tramp", "0xffffffffc0001000"), 16)
    sites = audited_sites(store, tracer, trigger.functions, index.identity, tramp, _thunks(guest))
    chosen = spread(sites, n)
    if not chosen:
        return GroupResult(tracer, "agree", "controls", 0, (), f"no agree site in {', '.join(trigger.functions)}")
    if say:
        say(f"{tracer}: {len(chosen)} controls the audit calls agree, in {len(trigger.functions)} functions "
            f"the {trigger.name} trigger runs")
    request = replace(base, tracer=kind, sites=tuple(f"{s.address:#x}" for s in chosen), trigger=(trigger.name,))
    done = confirm(request, guest, cache_dir, say, together=True)
    return GroupResult(tracer, "agree", "controls", len(chosen), tuple(done),
                       f"agree sites of {len(sites)} audited instructions in the {trigger.name} trigger's functions")


def _thunks(guest) -> tuple[int, int] | None:
    from ..image.loader import load_image

    image = load_image(guest.vmlinux, guest.system_map)
    lo, hi = image.symbol_address("__indirect_thunk_start"), image.symbol_address("__indirect_thunk_end")
    return None if lo is None or hi is None else (lo, hi)


def _save(store: str, summary: dict, guest, results: list[GroupResult]) -> None:
    """``STORE.confirm.json`` (``store.confirmations``): the audited image, the kernel's version and the
    accelerator, and every group's result; the audit's summary and report read it."""
    accel = next((c.probed.accel for r in results for c in r.confirmations), "")
    confirmations.save(os.fspath(store), (summary.get("image") or {}).get("identity", ""), kernel_version(guest),
                       confirmations.accelerator_name(accel), [r.as_json() for r in results])


def kernel_version(guest) -> str:
    """The kernel's version as its banner gives it (``Debian 6.1.187-1`` -> ``6.1.187``), else its release."""
    from ..image.loader import load_image

    image = load_image(guest.vmlinux, guest.system_map)
    at = image.symbol_address("linux_banner")
    try:
        banner = image.read(at, 400).split(b"\0", 1)[0].decode("ascii", "replace") if at is not None else ""
    except Exception:  # a banner outside the image's sections: the release says enough
        banner = ""
    debian = re.findall(r"Debian (\d+\.\d+\.\d+)-", banner)  # the last: the first is the compiler's
    upstream = re.search(r"Linux version (\d+\.\d+\.\d+)", banner)
    return debian[-1] if debian else upstream.group(1) if upstream else guest.release
