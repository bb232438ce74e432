"""``index.html``: the summary written as static HTML, the other views' empty frames, and the
Content-Security-Policy.  Every string from the input goes through ``html.escape``."""

from __future__ import annotations


from ..outputs import REPORT_MARK
from ..text import html_text as escape
from . import charts

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "base-uri 'none'; form-action 'none'")
VERDICTS = charts.VERDICTS


def _table(head: list[str], rows: list[list], cls: str = "") -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _n(v: int) -> str:
    return f"{v:,}"


def _verdict_cells(counts) -> list[str]:
    return [_n(counts.get(v, 0)) for v in VERDICTS]


def _summary(totals, run) -> str:
    n = totals.instructions
    rejected = totals.by_verdict.get("rejected", 0)
    relocatable = n - rejected
    proved = totals.by_verdict.get("proved", 0)
    share = f"{100 * proved / relocatable:.2f}%" if relocatable else "n/a"
    cards = "".join(f'<div class="card v-{v}"><div class="big" id="n-{v}">{_n(totals.by_verdict.get(v, 0))}</div>'
                    f'<div>{v}</div></div>' for v in VERDICTS)
    stored = run.get("summary", {}).get("instructions")
    check = "" if stored is None else (
        f'<p>The run\'s own summary counted {_n(stored)} instructions; '
        f'{"the same" if stored == n else "<strong>a different number</strong>"} as the rows here.</p>')
    return (f'<h2>Verdicts</h2><div class="cards">{cards}</div>'
            f'<p><span id="n-total">{_n(n)}</span> instructions in <span id="n-functions">{_n(totals.functions)}'
            f'</span> functions; relocatable (not rejected): <span id="n-relocatable">{_n(relocatable)}</span>; '
            f'proved: <strong id="share-proved">{share}</strong> of the relocatable.</p>{check}')


def _reasons(totals) -> str:
    rows = [[escape(v), escape(k), _n(c)] for (v, k), c in totals.by_reason.most_common(40)]
    return "<h2>By reason</h2>" + _table(["verdict", "reason", "instructions"], rows, "reasons")


def _classes(totals) -> str:
    ordered = sorted(totals.by_class.items(), key=lambda kv: -sum(kv[1].values()))
    chart = charts.stacked_bars([(k, dict(c)) for k, c in ordered[:40]], "verdicts per instruction class")
    rows = [[escape(k), *_verdict_cells(c)] for k, c in ordered]
    return ("<h2>By instruction class</h2><p>Bar length: instructions, log scale; split by verdict.</p>"
            + charts.legend() + chart + '<details><summary>every class</summary>'
            + _table(["class", *VERDICTS], rows) + "</details>")


def _sites(totals) -> str:
    if not totals.by_site:
        return "<h2>By kernel site kind</h2><p>No instruction is at a kernel site.</p>"
    rows = [[escape(k), *_verdict_cells(c)] for k, c in sorted(totals.by_site.items())]
    return ("<h2>By kernel site kind</h2><p>An instruction at several kinds of site counts under each.</p>"
            + _table(["site kind", *VERDICTS], rows))


def _times(totals, buckets) -> str:
    labels = [b for _, b in buckets]
    chart = charts.histogram(labels, totals.times, "proof time distribution")
    rows = [[escape(name), *[_n(v) for v in vals]] for name, vals in totals.times.items()]
    return ("<h2>Proof time</h2><p>Instructions per proof-time bucket, log scale; fresh (proved in the run) and "
            "cached (a verdict reused from the proof cache or an earlier instance, with its original time) apart."
            "</p>" + charts.legend(("fresh", "cached")) + chart + _table(["", *labels], rows))


def _sources(totals, kind) -> str:
    ordered = sorted(totals.by_source.items(), key=lambda kv: -sum(kv[1].values()))
    if not ordered:
        return f'<h2>Rejections by source</h2><p id="source-kind">No rejections (grouped by {escape(kind)}).</p>'
    chart = charts.stacked_bars([(k, {"rejected": sum(c.values())}) for k, c in ordered[:40]],
                                "rejections per source directory", keys=("rejected",))
    rows = [[escape(k), _n(sum(c.values())), escape(", ".join(f"{cl} {n:,}" for cl, n in c.most_common(4)))]
            for k, c in ordered[:300]]
    return (f'<h2>Rejections by source</h2><p id="source-kind">Grouped by {escape(kind)}.</p>' + chart
            + '<details><summary>top 300, with their commonest classes</summary>'
            + _table(["source", "rejected", "classes"], rows) + "</details>")


def _coverage(totals, bounds) -> str:
    if not bounds or not totals.coverage:
        return "<h2>Coverage of .text</h2><p>The image has no .text functions.</p>"
    span = totals.coverage_span
    return ("<h2>Coverage of .text</h2>"
            f"<p>{bounds[0]:#x}..{bounds[1]:#x}, {len(totals.coverage):,} cells of {span:,} bytes in address order; "
            "a cell's colour is the share of its instructions proved (grey: none; hover for counts).</p>"
            + charts.share_legend() + charts.coverage_map(totals.coverage, bounds[0], span, ".text"))


def _jump_probes(totals) -> str:
    if not totals.jump:
        return ""
    n = sum(totals.jump.values())
    examples = {name: example for _, name, example in totals.jump_names.values()}
    rows = [[escape(k), _n(v), f"{100 * v / n:.1f}%", escape(examples.get(k, ""))]
            for k, v in sorted(totals.jump.items(), key=lambda kv: (kv[0] != "eligible", -kv[1]))]
    return ('<h2 id="jump-probes">Jump probes</h2><p>Whether a jump-optimized probe (a 5-byte jmp over the '
            'instructions it covers) can sit at each instruction: <em>eligible</em> when the patched range is safe '
            'to overwrite and its block is proved; otherwise the refusal, with an example reason.</p>'
            + _table(["answer", "instructions", "share", "example reason"], rows, "jump-probes"))


def _provenance(provenance: dict) -> str:
    rows = [[escape(k), f"<code>{escape(str(v))}</code>"] for k, v in provenance.items()]
    return "<h2>Provenance</h2>" + _table(["", ""], rows, "provenance")


def _baseline(comparison) -> str:
    if comparison is None:
        return ""
    parts = [f"<h2>Changes since the baseline</h2><p>Baseline <code>{escape(comparison['baseline'])}</code> "
             f"(image sha256 <code>{escape(comparison['baseline_sha256'])}</code>); instructions matched by "
             "function name and offset.</p>"]
    counts = comparison["counts"]
    parts.append(_table(["change", "instructions"], [[escape(k.replace("_", " ")), f'<span id="b-{k}">{_n(v)}</span>']
                                                     for k, v in counts.items()]))
    parts.append("<h3>By function</h3>" + _table(
        ["function", *[k.replace("_", " ") for k in counts]],
        [[_link(name, fid, None), *[_n(c.get(k, 0)) for k in counts]] for name, c, fid in comparison["by_function"]]))
    for kind, rows in comparison["rows"].items():
        if not rows:
            continue
        parts.append(f"<h3>{escape(kind.replace('_', ' '))}</h3>" + _table(
            ["function", "offset", "address", "before", "now"],
            [[_link(name, fid, off), f"+{off:#x}", f"{addr:#x}", escape(str(old)), escape(str(new))]
             for name, off, addr, old, new, fid in rows]))
    return '<section id="view-baseline" class="view" hidden>' + "".join(parts) + "</section>"


def _link(name: str, fid, off) -> str:
    if fid is None:
        return escape(name)
    if off is None:
        return f'<a href="#f={int(fid)}">{escape(name)}</a>'
    return f'<a href="#i={int(fid)}:{int(off)}">{escape(name)}</a>'


FUNCTIONS_VIEW = """
<section id="view-functions" class="view" hidden>
<h2>Functions</h2>
<div class="controls">
<label>name <input id="f-search" type="search" placeholder="substring or /regex/" autocomplete="off"></label>
<label>with <select id="f-has"><option value="">any</option><option value="proved">proved</option>
<option value="opaque">opaque</option><option value="unknown">unknown</option>
<option value="rejected">rejected</option><option value="refuted">refuted</option></select></label>
<label>section <select id="f-section"><option value="">any</option></select></label>
<span id="f-count"></span>
</div>
<table id="f-table" class="functions"><thead><tr>
<th><button data-sort="name">function</button></th><th><button data-sort="start">address</button></th>
<th><button data-sort="n">instructions</button></th><th><button data-sort="proved">proved</button></th>
<th><button data-sort="opaque">opaque</button></th><th><button data-sort="rejected">rejected</button></th>
<th><button data-sort="unknown">unknown</button></th><th><button data-sort="refuted">refuted</button></th>
</tr></thead><tbody id="f-body"></tbody></table>
<div class="pager"><button id="f-prev">previous</button> <span id="f-page"></span> <button id="f-next">next</button></div>
</section>
<section id="view-function" class="view" hidden><div id="fn"></div></section>
"""


def index_html(info, run, provenance, totals, source_kind, bounds, comparison, buckets) -> str:
    title = f"relocverify report: {info.get('path') or info.get('sha256', '')}"
    nav = ('<nav><a href="#summary">Summary</a> <a href="#functions">Functions</a>'
           + (' <a href="#baseline">Baseline</a>' if comparison is not None else "") + "</nav>")
    summary = "".join([_summary(totals, run), _reasons(totals), _classes(totals), _sites(totals),
                       _jump_probes(totals), _times(totals, buckets), _sources(totals, source_kind),
                       _coverage(totals, bounds), _provenance(provenance)])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
{REPORT_MARK}
<meta http-equiv="Content-Security-Policy" content="{escape(CSP)}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<link rel="stylesheet" href="assets/report.css">
</head><body>
<header><h1>relocverify correctness report</h1><p class="sub">{escape(info.get('path') or '')}
 <code>{escape(info.get('sha256', ''))}</code></p>{nav}</header>
<main>
<section id="view-summary" class="view">{summary}</section>
{FUNCTIONS_VIEW}
{_baseline(comparison)}
</main>
<script src="assets/report.js"></script>
<script src="data/meta.js"></script>
<script src="data/functions.js"></script>
</body></html>
"""
