"""Build the HTML correctness report of a store into a directory.

The directory opens from ``file://`` with no network: ``index.html`` (the
summary, written here, and the views the script draws), ``assets/`` (the one
script and style sheet), and ``data/`` as ``<script>`` files (Chromium blocks
``fetch()`` on ``file://``): ``meta.js`` (outcomes, site kinds), ``functions.js``
(the function table, columnar) and ``s/N.js``, the shards, each a run of
functions in address order with their listings, loaded on demand.

A shard holds per function its bytes (base64), instruction lengths, each
instruction's disassembly (an index into the shard's string table, commonest
first), outcome, proof time (these three ``packed``) and fresh/cached, and, only where present, the instance reason,
site kinds, decoder answers, counterexample, live variants and the plan.
Plans are recomputed from the stored bytes and the run's trampoline address
for every instruction that is not proved, and for all of them when the image
has at most ``plan_limit`` instructions (the view says so when it has none).

Every string from the input reaches the page either through ``html.escape``
(the summary) or as JSON data shown with ``textContent`` (the script); the
page's Content-Security-Policy allows scripts and styles from files only.
"""

from __future__ import annotations

import base64
import json
import os
import platform
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources

from ..errors import InputError
from ..store.store import SITE_KINDS, site_mask
from . import baseline as baseline_mod
from . import tracers as tracer_page
from . import data, page
from .listing import disassemble, plan_text
from .sources import SourceNames

SHARD_INSTRUCTIONS = 12000  # instructions per shard: ~0.4 MB of script, parsed in a few ms
PLAN_LIMIT = 20_000  # recompute every plan up to this many instructions; above, the non-proved ones
TIME_BUCKETS = ((0, "0"), (10, "<10µs"), (100, "<100µs"), (1_000, "<1ms"), (10_000, "<10ms"),
                (100_000, "<100ms"), (1_000_000, "<1s"), (None, "≥1s"))
COVERAGE_CELLS = 2048  # at most; a cell covers at least COVERAGE_MIN_SPAN bytes
COVERAGE_MIN_SPAN = 16


def coverage_cells(bounds: tuple[int, int]) -> tuple[int, int]:
    """(cells, bytes per cell) of the coverage map over [start, end)."""
    size = bounds[1] - bounds[0]
    span = max(COVERAGE_MIN_SPAN, -(-size // COVERAGE_CELLS))
    return max(1, -(-size // span)), span


def js_data(call: str, value) -> str:
    """A script file calling ``call`` with ``value``: JSON with every non-ASCII character and ``<`` escaped."""
    text = json.dumps(value, ensure_ascii=True, separators=(",", ":")).replace("<", "\\u003c")
    return f"{call}({text});\n"


FINAL = "0123456789abcdefghijklmnopqrstuv"  # the last base-32 digit of a packed number
MORE = "ABCDEFGHIJKLMNOPQRSTUVWXYZ()*+-."  # a digit with more to come


def packed(values: list[int]) -> str:
    """Non-negative integers as one string, base 32, most significant digit first, each number's last
    digit from ``FINAL`` and the others from ``MORE``: 1 character below 32, 2 below 1024, no separators."""
    out = []
    for v in values:
        digits = FINAL[v & 31]
        v >>= 5
        while v:
            digits = MORE[v & 31] + digits
            v >>= 5
        out.append(digits)
    return "".join(out)


def time_bucket(us: int) -> int:
    for i, (limit, _) in enumerate(TIME_BUCKETS):
        if limit is None or (us <= 0 if limit == 0 else us < limit):
            return i
    return len(TIME_BUCKETS) - 1


@dataclass
class Totals:
    """What the summary counts, gathered in the one pass over the rows."""

    by_verdict: Counter = field(default_factory=Counter)
    by_class: dict = field(default_factory=dict)
    by_site: dict = field(default_factory=dict)
    by_reason: Counter = field(default_factory=Counter)
    by_source: dict = field(default_factory=dict)
    times: dict = field(default_factory=lambda: {"fresh": [0] * len(TIME_BUCKETS), "cached": [0] * len(TIME_BUCKETS)})
    coverage: list = field(default_factory=list)
    coverage_span: int = 0  # bytes per coverage cell
    instructions: int = 0
    functions: int = 0
    plans: int = 0
    shards: int = 0
    jump: Counter = field(default_factory=Counter)  # jump-probe bucket name -> instructions
    jump_names: dict = field(default_factory=dict)  # bucket id -> (index in the report, name, example)


class _Shard:
    def __init__(self, number: int):
        self.number = number
        self.strings: dict[str, int] = {}
        self.uses: list[int] = []
        self.functions: dict[int, dict] = {}
        self.instructions = 0

    def string(self, text: str) -> int:
        i = self.strings.get(text)
        if i is None:
            i = self.strings[text] = len(self.strings)
            self.uses.append(0)
        self.uses[i] += 1
        return i

    def _renumbered(self) -> list[str]:
        """The string table, commonest first, and every reference renumbered: short indices for common text."""
        order = sorted(range(len(self.uses)), key=lambda i: -self.uses[i])
        new = [0] * len(order)
        for n, i in enumerate(order):
            new[i] = n
        for entry in self.functions.values():
            entry["d"] = packed([new[i] for i in entry["d"]])
            for x in entry.get("x", {}).values():
                if "r" in x:
                    x["r"] = new[x["r"]]
                for key in ("v", "p"):
                    if key in x:
                        x[key] = [new[i] for i in x[key]]
        texts = list(self.strings)
        return [texts[i] for i in order]

    def write(self, directory: str) -> int:
        text = js_data("RV.shard", {"n": self.number, "S": self._renumbered(), "F": self.functions})
        with open(os.path.join(directory, f"{self.number}.js"), "w", encoding="utf-8") as fh:
            fh.write(text)
        return len(text)


def build_report(db: str, out_dir: str, baseline: str | None = None, plan_limit: int = PLAN_LIMIT) -> dict:
    """Write the report of the store ``db`` (its newest image) into ``out_dir``; returns what was written."""
    if baseline is not None and not os.path.isfile(baseline):
        raise InputError(f"--baseline {baseline}: no such store")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise InputError(f"-o {out_dir}: exists and is not a directory")
    t0 = time.monotonic()
    store, image = data.open_store(db)
    try:
        info = store.image_info(image)
        run = data.last_run(store, image)
        tramp = run.get("config", {}).get("tramp")
        outcomes = data.outcomes(store)
        # the commonest outcomes get the shortest indices: a shard holds one per instruction
        frequency = Counter()
        for row in store.counts(image):
            frequency[row[1:7]] += row[7]
        ordered = sorted(outcomes, key=lambda k: (-frequency[k], outcomes[k].id))
        outcome_list = [outcomes[k] for k in ordered]
        index = {key: i for i, key in enumerate(ordered)}
        functions = list(store.iter_functions(image))
        n_rows = sum(sum(c.values()) for _, c in store.function_counts(image))
        all_plans = tramp is not None and n_rows <= plan_limit
        shard_dir = os.path.join(out_dir, "data", "s")
        os.makedirs(shard_dir, exist_ok=True)
        for old in os.listdir(shard_dir):  # a previous report's shards, which this one may not overwrite
            if old.endswith(".js"):
                os.remove(os.path.join(shard_dir, old))
        os.makedirs(os.path.join(out_dir, "assets"), exist_ok=True)
        text_bounds = _text_bounds(functions)
        totals = Totals(coverage=[Counter() for _ in range(coverage_cells(text_bounds)[0])] if text_bounds else [])
        buckets = data.jump_buckets(store)
        if buckets:
            totals.jump_names = {bid: (k, name, example) for k, (bid, name, example) in enumerate(buckets)}
        sources = SourceNames.open(info.get("path"))
        variants = data.variants(store, image)
        # the baseline first: a file that is not a store is refused before the long pass
        comparison = None if baseline is None else baseline_mod.compare(store, image, baseline)
        table = _gather(store, image, out_dir, index, outcomes, tramp, all_plans, totals, sources, variants,
                        text_bounds)
        meta = {"outcomes": [[o.verdict, o.method, o.plan_kind, o.rule, o.klass, o.reason_key, o.reason]
                             for o in outcome_list],
                "sites": list(SITE_KINDS), "tramp": None if tramp is None else f"{tramp:#x}",
                "all_plans": all_plans, "plan_limit": plan_limit, "instructions": totals.instructions,
                "jump": [[name, example] for _, name, example in sorted(totals.jump_names.values())] or None}
        _write(out_dir, "data/meta.js", js_data("RV.meta", meta))
        _write(out_dir, "data/functions.js", js_data("RV.functions", table))
        provenance = _provenance(info, run, db)
        index_html = page.index_html(info, run, provenance, totals, sources.kind, text_bounds, comparison,
                                     TIME_BUCKETS)
        if tracer_page.write_tracer_page(db, out_dir):  # the tracer audit's page, when the store has one
            index_html = tracer_page.link(index_html)
        _write(out_dir, "index.html", index_html)
        for name in ("report.js", "report.css"):
            with resources.files(__package__).joinpath("assets", name).open("rb") as src, \
                    open(os.path.join(out_dir, "assets", name), "wb") as dst:
                shutil.copyfileobj(src, dst)
    finally:
        store.close()
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out_dir) for f in fs)
    return {"index": os.path.join(out_dir, "index.html"), "instructions": totals.instructions,
            "functions": totals.functions, "shards": totals.shards, "plans": totals.plans, "bytes": size,
            "seconds": round(time.monotonic() - t0, 1), "sources": sources.kind}


def _write(out_dir: str, name: str, text: str) -> None:
    with open(os.path.join(out_dir, name), "w", encoding="utf-8") as fh:
        fh.write(text)


def _text_bounds(functions) -> tuple[int, int] | None:
    """[lowest start, highest end) of the functions in ``.text``: the span the coverage map shows."""
    spans = [(f.start, f.start + f.size) for f in functions if f.section == ".text"]
    if not spans:
        return None
    return min(s for s, _ in spans), max(e for _, e in spans)


def _gather(store, image, out_dir, index, outcomes, tramp, all_plans, totals, sources, variants, text_bounds):
    """One pass over every function's rows: the shards written, the totals counted; returns the function table."""
    verdicts = data.VERDICTS
    table = {"id": [], "name": [], "start": [], "section": [], "n": [], "shard": [],
             **{v: [] for v in verdicts}}
    sections: dict[str, int] = {}
    shard = _Shard(0)
    shard_dir = os.path.join(out_dir, "data", "s")
    span = 0
    if text_bounds:
        span = totals.coverage_span = coverage_cells(text_bounds)[1]
    for f, rows in data.iter_function_rows(store, image):
        counts = Counter(r.verdict for r in rows)
        table["id"].append(f.id)
        table["name"].append(f.name)
        table["start"].append(f"{f.start:x}")
        table["section"].append(sections.setdefault(f.section, len(sections)))
        table["n"].append(len(rows))
        table["shard"].append(shard.number)
        for v in verdicts:
            table[v].append(counts.get(v, 0))
        shard.functions[f.id] = _function_entry(store, shard, f, rows, index, outcomes, tramp, all_plans, totals, sources,
                                                variants)
        shard.instructions += len(rows)
        totals.functions += 1
        for r in rows:
            _count(totals, r, text_bounds, span)
        if shard.instructions >= SHARD_INSTRUCTIONS:
            shard.write(shard_dir)
            shard = _Shard(shard.number + 1)
    if shard.functions:
        shard.write(shard_dir)
    totals.shards = shard.number + (1 if shard.functions else 0)
    table["sections"] = list(sections)
    if text_bounds:
        table["coverage"] = {"start": f"{text_bounds[0]:x}", "span": span}
    return table


def _count(totals: Totals, r, text_bounds, span: int) -> None:
    totals.instructions += 1
    totals.by_verdict[r.verdict] += 1
    totals.by_class.setdefault(r.klass, Counter())[r.verdict] += 1
    for kind in r.sites:
        totals.by_site.setdefault(kind, Counter())[r.verdict] += 1
    totals.by_reason[(r.verdict, r.reason_key)] += 1
    totals.times["fresh" if r.fresh else "cached"][time_bucket(r.proof_us)] += 1
    if text_bounds and r.section == ".text" and text_bounds[0] <= r.address < text_bounds[1]:
        totals.coverage[min((r.address - text_bounds[0]) // span, len(totals.coverage) - 1)][r.verdict] += 1


def _function_entry(store, shard, f, rows, index, outcomes, tramp, all_plans, totals, sources, variants) -> dict:
    raw = b"".join(r.raw for r in rows)
    offsets = [r.address - f.start for r in rows]
    texts = _disassemble_rows(rows)
    entry = {"n": f.name, "a": f"{f.start:x}", "sec": f.section,
             "b": base64.b64encode(raw).decode("ascii"),
             "l": "".join(chr(48 + r.length) for r in rows),
             "d": [shard.string(t) for t in texts],
             "o": packed([index[data.outcome_key(r)] for r in rows]),
             "t": packed([max(r.proof_us, 0) for r in rows]),
             "c": "".join("1" if r.fresh else "0" for r in rows)}
    gaps, extra = {}, {}
    end = 0
    for i, (r, off) in enumerate(zip(rows, offsets)):
        if off != end:
            gaps[i] = off
        end = off + r.length
        x = {}
        outcome = outcomes[data.outcome_key(r)]
        if r.reason != outcome.reason:
            x["r"] = shard.string(r.reason)
        if r.sites:
            x["s"] = site_mask(r.sites)
        if r.answers:
            x["a"] = r.answers
        if r.counterexample is not None:
            x["e"] = {"id": r.counterexample, **(store.counterexample(r.counterexample) or {})}
        live = variants.get((f.id, off))
        if live:
            x["v"] = [shard.string("\t".join(v)) for v in live]
        if tramp is not None and (all_plans or r.verdict != "proved"):
            x["p"] = [shard.string(t) for t in plan_text(r.raw, r.address, tramp)]
            totals.plans += 1
        if r.verdict == "rejected":
            src = sources.name(r.address, f.name)
            totals.by_source.setdefault(src, Counter())[r.klass] += 1
        if x:
            extra[i] = x
    if gaps:
        entry["g"] = gaps
    if extra:
        entry["x"] = extra
    if totals.jump_names:
        # one character per instruction: its jump-probe bucket's index + 48, "~" when not analysed
        answers = data.jump_answers(store, f.id)
        marks = []
        for r, off in zip(rows, offsets):
            bid = answers.get(off)
            if bid is None:
                marks.append("~")
            else:
                k, name, _ = totals.jump_names[bid]
                totals.jump[name] += 1
                marks.append(chr(48 + k))
        entry["j"] = "".join(marks)
    return entry


def _disassemble_rows(rows) -> list[str]:
    if not rows:
        return []
    raw = b"".join(r.raw for r in rows)
    spans, pos = [], 0
    for r in rows:
        spans.append((pos, r.length))
        pos += r.length
    # contiguous rows disassemble in one pass; a gap changes addresses, so each run of rows is placed at its own
    out: list[str] = []
    i = 0
    while i < len(rows):
        j = i + 1
        while j < len(rows) and rows[j].address == rows[j - 1].address + rows[j - 1].length:
            j += 1
        base = spans[i][0]
        chunk = raw[base:spans[j - 1][0] + spans[j - 1][1]]
        out += disassemble(chunk, rows[i].address, [(s - base, n) for s, n in spans[i:j]])
        i = j
    return out


def _provenance(info: dict, run: dict, db: str) -> dict:
    versions = run.get("versions", {})
    return {
        "input sha256": info.get("sha256", ""),
        "input path": info.get("path", ""),
        "format": f"{info.get('format', '')} (symbols: {info.get('symbols', '')})",
        **({"loader notes": "; ".join(map(str, info["notes"]))} if info.get("notes") else {}),  # a symbol cut, ...
        "store": os.path.abspath(db),
        "tool versions": ", ".join(f"{k} {v}" for k, v in sorted(versions.items())),
        "decoders": ", ".join(f"{k} {versions[k]}" for k in ("capstone", "iced") if k in versions),
        "run": (f"run {run.get('id')}: {run.get('status')}, started "
                f"{_utc(run.get('started'))}, finished {_utc(run.get('finished'))} on {run.get('host')}"
                if run else "no run recorded"),
        "trampoline": (f"{run['config']['tramp']:#x}" if run.get("config", {}).get("tramp") is not None else "?"),
        "report built": f"{_utc(time.time())} on {platform.node()} ({platform.machine()}, {platform.system()} "
                        f"{platform.release()}, Python {platform.python_version()})",
    }


def _utc(t) -> str:
    if t is None:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
