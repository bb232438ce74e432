"""What the running kernel said about a stored audit's groups: ``STORE.confirm.json``.

``relocverify confirm --audit STORE`` boots the kernel, probes every ``tracer-wrong`` group (and
``agree`` controls) and writes one file beside the store (``save``)::

    {"format": 1, "image": IDENTITY, "kernel": "6.1.187", "accelerator": "QEMU TCG",
     "groups": [{"tracer": "kprobes@6.1", "bucket": "tracer-wrong", "group": "...", "outcome":
                 "reproduced", "sites": [...], ...}, ...]}

``IDENTITY`` is the audited image's (the audit summary's ``image.identity``): the confirmations hold
for that image only.  The audit's summary (``relocverify audit``, text and JSON) and the report's
tracer page read the file through ``attach``, which gives each confirmed group a ``confirmed`` field
and a ``label`` such as ``tracer-wrong (reproduced on 6.1.187, QEMU TCG)``, and each tracer its
controls.  A file, not a table: the store is written by the verifying run alone, and the
confirmations are a later, separate experiment on another machine state (a guest).  A file
written before this format (a bare list of groups) has no image and kernel and is attached to
nothing.
"""

from __future__ import annotations

import json
import os

from ..outputs import write_atomic

SUFFIX = ".confirm.json"
FORMAT = 1
#: How an outcome reads inside a label (``confirm.outcome.Outcome.label`` -> words).
WORDS = {"reproduced": "reproduced", "not-reproduced": "not reproduced", "not-executed": "not executed",
         "refused": "refused by the kernel", "patched-at-boot": "patched at boot"}


def path_of(store: str) -> str:
    return os.fspath(store) + SUFFIX


def save(store: str, image: str, kernel: str, accelerator: str, groups: list[dict]) -> None:
    """Write the confirmations of ``store``'s audit (``groups``: ``confirm.groups.GroupResult.as_json``)."""
    doc = {"format": FORMAT, "image": image, "kernel": kernel, "accelerator": accelerator, "groups": groups}
    write_atomic(path_of(store), json.dumps(doc, indent=1))


def load(store: str) -> dict | None:
    """The confirmations beside ``store``, or None (none, unreadable, or an older bare list)."""
    try:
        with open(path_of(store)) as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == FORMAT else None


def accelerator_name(accel: str) -> str:
    """``tcg`` -> ``QEMU TCG``, ``kvm`` -> ``QEMU KVM`` (as a label says it)."""
    return f"QEMU {accel.upper()}" if accel else "QEMU"


def label(bucket: str, outcome: str | None, kernel: str, accelerator: str) -> str:
    """``tracer-wrong (reproduced on 6.1.187, QEMU TCG)``; ``tracer-wrong (no site confirmed ...)``."""
    words = WORDS.get(outcome or "", "no site confirmed")
    return f"{bucket} ({words} on {kernel}, {accelerator})"


def attach(summary: dict, confirmations: dict | None) -> dict:
    """``summary`` (an audit summary) with each group that ``confirmations`` names given ``confirmed``
    ({outcome, label, kernel, accelerator, sites, note}) and each tracer with controls given
    ``controls``; unchanged when there are none or they are of another image.  Returns ``summary``."""
    if not confirmations or confirmations.get("image") != (summary.get("image") or {}).get("identity"):
        return summary
    kernel, accel = confirmations.get("kernel", "?"), confirmations.get("accelerator", "?")
    by_key = {(g.get("tracer"), g.get("bucket"), g.get("group")): g for g in confirmations.get("groups", [])}
    for name, tally in summary.get("tracers", {}).items():
        for bucket, groups in tally.get("groups", {}).items():
            for g in groups:
                c = by_key.get((name, bucket, g.get("group")))
                if c is not None:
                    g["confirmed"] = _confirmed(c, bucket, kernel, accel)
        controls = by_key.get((name, "agree", "controls"))
        if controls is not None:
            tally["controls"] = _confirmed(controls, "agree", kernel, accel) | {"count": controls.get("count", 0),
                                                                               "outcomes": controls.get("outcomes", {})}
    return summary


def _confirmed(c: dict, bucket: str, kernel: str, accel: str) -> dict:
    sites = [{"site": s.get("where", ""), "outcome": s.get("outcome", ""), "evidence": (s.get("evidence") or "")[:300]}
             for s in c.get("sites", [])]
    return {"outcome": c.get("outcome"), "label": label(bucket, c.get("outcome"), kernel, accel), "kernel": kernel,
            "accelerator": accel, "note": c.get("note", ""), "sites": sites}
