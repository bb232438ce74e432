"""``tracers.html``: the tracer audit's page (``relocverify audit``), from the store's last audit.

Per tracer: the five buckets (agree, tracer-wrong, tracer-refuses-provable, both-refuse, unknown)
adding up to the image's instructions; per bucket the groups (by cause, or by the tracer's
refusal reason) with their counts, a few instances, the tracer's answer and the source line it
cites; for every tracer-wrong group the counterexample and its replay command (for a block
probe, what the block proof's own replay saw), and what ``relocverify confirm --audit`` found on the
running kernel (``store.confirmations``: a group labelled ``tracer-wrong (reproduced on 6.1.187, QEMU
TCG)``, a tracer's controls).  Static HTML
under the report's Content-Security-Policy; every string from the store goes through
``html.escape``.  Reads the summary ``relocverify audit`` keeps beside the store (this module does not
import the tracers package, which sits above the report)."""

from __future__ import annotations

import json
import os

from ..outputs import REPORT_MARK
from ..store import confirmations
from ..text import html_text as escape
from .page import CSP

BUCKETS = ("agree", "tracer-wrong", "tracer-refuses-provable", "both-refuse", "unknown")
PAGE = "tracers.html"
AUDIT_SUFFIX = ".audit.json"  # tracers.audit.summary_path: the summary beside the store


def last_audit(db_path: str) -> dict | None:
    """The last audit's summary of the store at ``db_path`` (kept beside it by ``relocverify audit``), with
    what ``relocverify confirm --audit`` found on the running kernel (``store.confirmations``) attached."""
    try:
        with open(db_path + AUDIT_SUFFIX) as fh:
            summary = json.load(fh)
    except (OSError, ValueError):
        return None
    return confirmations.attach(summary, confirmations.load(db_path)) if isinstance(summary, dict) else summary


def write_tracer_page(db_path: str, out_dir: str) -> bool:
    """Write ``tracers.html`` when the store has an audit beside it; True if it did."""
    summary = last_audit(db_path)
    if summary is None or "tracers" not in summary:
        return False
    with open(os.path.join(out_dir, PAGE), "w", encoding="utf-8") as fh:
        fh.write(tracer_html(summary))
    return True


def link(index_html: str) -> str:
    """The report's index with a link to the tracer page in its navigation."""
    return index_html.replace("</nav>", f' <a href="{PAGE}">Tracers</a></nav>', 1)


def _counts(summary: dict) -> str:
    head = "<tr><th>tracer</th>" + "".join(f"<th>{b}</th>" for b in BUCKETS) + "<th>total</th></tr>"
    rows = []
    for name, t in summary["tracers"].items():
        cells = "".join(f'<td><a href="#{escape(_anchor(name, b))}">{t["buckets"][b]:,}</a></td>' for b in BUCKETS)
        ok = "" if t["totals_add_up"] else " (does not add up)"
        rows.append(f"<tr><td>{escape(name)}</td>{cells}<td>{t['instructions']:,}{ok}</td></tr>")
    return f"<table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"


def _anchor(name: str, bucket: str) -> str:
    return "t-" + "".join(c if c.isalnum() else "-" for c in name) + "-" + bucket


def _group(g: dict) -> str:
    detail = g.get("detail") or {}
    answer = detail.get("answer", {})
    parts = [f"<p>source: <code>{escape(answer.get('source', ''))}</code></p>"]
    if detail.get("original"):
        parts.append(f"<p>original: <code>{escape(detail['original'])}</code> ({escape(detail.get('bytes', ''))})"
                     f" at {escape(detail.get('address', ''))}, slot at {escape(detail.get('tramp', ''))}</p>")
    if answer.get("kind") == "relocate":
        parts.append(f"<p>executes at T: <code>{escape(answer.get('code', ''))}</code>; writes "
                     f"<code>{escape(answer.get('written', ''))}</code>; fixup: {escape(answer.get('fixup', ''))}</p>")
    elif answer.get("kind") == "emulate":
        parts.append("<p>emulates: <code>" + escape("; ".join(e.get("text", "") for e in answer.get("effects", [])))
                     + "</code></p>")
    if detail.get("reason"):
        parts.append(f"<p>verdict: {escape(detail['reason'])}</p>")
    cex = detail.get("counterexample")
    if cex:
        diffs = "".join(f"<li>{escape(d['what'])}: original {escape(str(d['original']))}, tracer "
                        f"{escape(str(d['relocated']))}</li>" for d in cex.get("differences", []))
        regs = ", ".join(f"{escape(k)}={escape(v)}" for k, v in cex.get("registers", {}).items())
        replay = (f"<p>{escape(cex.get('replay_note', ''))}</p>" if detail.get("answer", {}).get("block")
                  or cex.get("replay_note", "").startswith("confirmed on CPU")
                  else f"<p>replay: <code>{escape(cex.get('replay', ''))}</code></p>")
        parts.append(f"<p>counterexample: {regs or '(any registers)'}</p><ul>{diffs}</ul>{replay}")
    examples = ", ".join(f"{escape(e['function'])} ({escape(e['address'])})" for e in g.get("examples", []))
    parts.append(f"<p>e.g. {examples}</p>")
    confirmed = g.get("confirmed")
    badge = ""
    if confirmed:  # relocverify confirm --audit: what the running kernel did
        badge = f' <span class="confirmed">{escape(confirmed["label"])}</span>'
        sites = "".join(f"<li><code>{escape(c['site'])}</code>: {escape(c['outcome'])}: {escape(c['evidence'])}</li>"
                        for c in confirmed.get("sites", []))
        parts.append(f"<p>on the running kernel ({escape(confirmed['kernel'])}, {escape(confirmed['accelerator'])})"
                     f"{': ' + escape(confirmed['note']) if confirmed.get('note') else ''}</p><ul>{sites}</ul>")
    return (f"<details><summary>{g['count']:,} &times; {escape(g['group'])}{badge}</summary>{''.join(parts)}"
            f"</details>")


def tracer_html(summary: dict) -> str:
    sections = []
    for name, t in summary["tracers"].items():
        body = [f"<h2>{escape(name)}</h2><p>{escape(t.get('source', ''))}</p>"]
        if t.get("controls"):
            c = t["controls"]
            body.append(f'<p class="confirmed">{c["count"]:,} agree controls on the running kernel '
                        f'({escape(c["kernel"])}, {escape(c["accelerator"])}): '
                        + escape(", ".join(f"{n} {o}" for o, n in sorted(c["outcomes"].items()))) + "</p>")
        for b in BUCKETS:
            groups = t["groups"].get(b, [])
            body.append(f'<h3 id="{escape(_anchor(name, b))}">{b}: {t["buckets"][b]:,}</h3>')
            body.append("".join(_group(g) for g in groups) or "<p>none</p>")
        sections.append("<section>" + "".join(body) + "</section>")
    image = summary.get("image", {})
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
{REPORT_MARK}
<meta http-equiv="Content-Security-Policy" content="{escape(CSP)}">
<title>relocverify tracer audit: {escape(image.get('path', ''))}</title>
<link rel="stylesheet" href="assets/report.css">
</head><body>
<header><h1>Tracer audit</h1><p class="sub">{escape(image.get('path', ''))}
<code>{escape(image.get('identity', ''))}</code>:
{summary['instructions']:,} instructions, slot at {escape(summary.get('tramp', ''))}</p>
<nav><a href="index.html">Report</a></nav></header>
<main>{_counts(summary)}{''.join(sections)}</main>
</body></html>
"""
