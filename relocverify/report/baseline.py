"""What changed since a baseline store: new rejections, lost (and gained) proofs, and decoder
changes, instruction by instruction and by function.

Instructions are matched by (function name, offset in the function), so a
baseline may be another build of the kernel; a function whose name is not in
the baseline is new, and its rows count as new, not as changes.  A decoder
change is the same bytes at the same place with other decoder answers.  Functions
sharing a name (static functions in several files) are matched as one name:
a change among them is shown on the first of that name.
"""

from __future__ import annotations

import json
from collections import Counter

from ..store.store import Results
from . import data

LISTED = 2000  # rows listed per kind of change; the counts are always complete


def _weak(store: Results, image: int) -> dict[tuple[str, int], tuple]:
    out: dict[tuple[str, int], tuple] = {}
    for r in data.weak_rows(store, image):
        out.setdefault((r.function, r.address - r.function_start), (r.verdict, r.reason_key, r.address))
    return out


def _starts(store: Results, image: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in store.iter_functions(image):
        out.setdefault(f.name, f.start)
    return out


class _Verdicts:
    """(function name, offset) -> verdict (``get``) or bytes (``raw``) in one store, reading a function's rows once when first asked
    (the first function of that name: same-named static functions are matched by their order)."""

    def __init__(self, store: Results, image: int):
        self.store = store
        self.ids: dict[str, int] = {}
        for f in store.iter_functions(image):
            self.ids.setdefault(f.name, f.id)
        self._rows: dict[str, dict[int, tuple[str, bytes]]] = {}

    def _row(self, name: str, offset: int) -> tuple[str, bytes] | None:
        rows = self._rows.get(name)
        if rows is None:
            fid = self.ids.get(name)
            rows = self._rows[name] = {} if fid is None else {
                r.address - r.function_start: (r.verdict, r.raw) for r in self.store.function_rows(fid)}
        return rows.get(offset)

    def get(self, name: str, offset: int) -> str | None:
        row = self._row(name, offset)
        return None if row is None else row[0]

    def raw(self, name: str, offset: int) -> bytes | None:
        row = self._row(name, offset)
        return None if row is None else row[1]


def _decoded(answers: str | None):
    """The decoders' answers without their disassembly text: a baseline compares decisions, and a store written
    before rows kept their own instruction's answers (``engine.worker._own``) carried, in many rows, the text of
    another instruction with the same key (its displacement or immediate differs), so a baseline from it would
    see every such row as changed."""
    if answers is None:
        return None
    try:
        value = json.loads(answers)
    except ValueError:
        return answers
    for answer in (value.get("answers") or {}).values() if isinstance(value, dict) else ():
        if isinstance(answer, dict):
            answer.pop("text", None)
    return value


def compare(store: Results, image: int, baseline_path: str) -> dict:
    """The changes from the baseline store's newest image to ``image``."""
    base, bimage = data.open_store(baseline_path)
    try:
        now, before = _weak(store, image), _weak(base, bimage)
        now_starts = _starts(store, image)
        ids = data.function_ids(store, image)
        changes: dict[str, list] = {"new_rejections": [], "lost_proofs": [], "gained_proofs": [],
                                    "decoder_changes": []}
        by_function: dict[str, Counter] = {}

        before_all, now_all = _Verdicts(base, bimage), _Verdicts(store, image)

        def was(key):
            hit = before.get(key)
            if hit is not None:
                return hit[0]
            return before_all.get(*key)

        def add(kind, key, old, new, address):
            fid = ids.get((now_starts.get(key[0], 0), key[0]))
            changes[kind].append((key[0], key[1], address, old, new, fid))
            by_function.setdefault(key[0], Counter())[kind] += 1

        for key, (verdict, reason_key, address) in sorted(now.items()):
            old = was(key)
            if old is None:
                continue  # not in the baseline: new code, not a change
            if verdict == "rejected" and old != "rejected":
                add("new_rejections", key, old, f"rejected: {reason_key}", address)
            if old == "proved":
                add("lost_proofs", key, old, f"{verdict}: {reason_key}", address)
        for key, (verdict, reason_key, _) in sorted(before.items()):
            if key not in now and key[0] in now_starts:
                if now_all.get(*key) == "proved":
                    add("gained_proofs", key, f"{verdict}: {reason_key}", "proved", now_starts[key[0]] + key[1])
        a_now, a_before = data.answer_rows(store, image), data.answer_rows(base, bimage)
        for key in sorted(set(a_now) | set(a_before)):
            if _decoded(a_now.get(key)) == _decoded(a_before.get(key)):
                continue
            raw = now_all.raw(*key)
            if raw is not None and raw == before_all.raw(*key):  # the same bytes, decoded differently
                add("decoder_changes", key, a_before.get(key) or "agree", a_now.get(key) or "agree",
                    now_starts[key[0]] + key[1])
        info = base.image_info(bimage)
    finally:
        base.close()
    return {"baseline": baseline_path, "baseline_sha256": info.get("sha256", ""),
            "counts": {k: len(v) for k, v in changes.items()},
            "rows": {k: v[:LISTED] for k, v in changes.items()},
            "by_function": sorted(((name, dict(c), ids.get((now_starts.get(name, 0), name)))
                                   for name, c in by_function.items()),
                                  key=lambda p: -sum(p[1].values()))[:LISTED]}
