"""The HTML report, opened in a real browser (Debian's headless Chromium, driven by Playwright).

The stores are real runs of small ELF images built here; the one refuted row
comes from the real checker (a RIP-relative load copied verbatim, which
``prove_relocation`` refutes) written into the test's own store.  The report
must show the store's totals, filter its function table, open an instruction
with its plan and counterexample, log no console error, and show hostile
symbol names as text.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sqlite3
import struct
from collections import Counter
from pathlib import Path

import pytest

from relocverify.cli import report as report_cli
from relocverify.engine.run import RunOptions, run
from relocverify.errors import InputError
from relocverify.image.loader import load_image
from relocverify.proof.prove import prove_relocation
from relocverify.report.build import packed
from relocverify.report.sources import DWARF, SourceNames, name_prefix, source_directory
from relocverify.proof.verdict import Verdict, reason_key
from relocverify.store.packed_rows import PACKED_ROW, pack_ids, pack_u32, unpack_ids, unpack_u32
from relocverify.store.row_seals import seal_functions
from relocverify.store.store import Results
from relocverify.x86.decode import decode

from test_engine import SMALL_ASM, SMALL_LDS

TRAMP = 0xFFFFFFFFC0001000
#: Where the screenshots go: the tracked PNGs under reports/ only when asked
#: (RELOCVERIFY_SCREENSHOTS=reports), else a temporary directory, so a test run leaves the tree clean.
SHOTS = os.environ.get("RELOCVERIFY_SCREENSHOTS")


def _shot(page, name: str, tmp: Path) -> None:
    where = Path(SHOTS) if SHOTS else tmp
    where.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(where / name), full_page=True)
    assert (where / name).stat().st_size > 0
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
HOSTILE = ['f<script>alert(1)</script>', 'g"onmouseover="alert(2)', "h'<img src=x onerror=alert(3)>"]


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="relocverify")
    report_cli.add_parser(p.add_subparsers(dest="command"))
    return p.parse_args(["report", *argv])


def _report(argv: list[str]) -> str:
    out = io.StringIO()
    assert report_cli.command(_parse(argv), out) == 0
    return out.getvalue()


def _store_of(tmp: Path, asm: str) -> tuple[Path, object]:
    import elfbuild

    image = load_image(elfbuild.build_elf(tmp, asm, SMALL_LDS))
    db = tmp / "s.sqlite"
    run(image, str(db), RunOptions(TRAMP, 1, 10.0, None, True, None))
    return db, image


def _add_refutation(db: Path) -> int:
    """Refute a verbatim copy of f_plain's RIP-relative load with the real checker, and store it on that row
    (as a run would: a refuted outcome, the counterexample, the function's counts)."""
    store = Results(str(db))
    image = store.find_image()
    row = next(r for r in store.iter_rows(image) if r.function == "f_plain" and r.raw.startswith(b"\x48\x8b\x05"))
    fid = next(f.id for f in store.iter_functions(image) if f.name == "f_plain")
    store.close()
    back = (row.address + row.length - (TRAMP + row.length + 5)) & 0xFFFFFFFF
    reloc = row.raw + b"\xe9" + back.to_bytes(4, "little")
    result = prove_relocation(decode(row.raw, row.address), reloc, TRAMP)
    assert result.verdict is Verdict.REFUTED and result.counterexample is not None
    c = result.counterexample
    outcome = ("refuted", result.method, "copy", "copy", row.klass,
               reason_key(Verdict.REFUTED, "copy", result.method, result.reason))
    con = sqlite3.connect(str(db), isolation_level=None)
    con.execute("BEGIN")
    cex = con.execute("INSERT INTO counterexamples (state, differences, replay) VALUES (?,?,?)",
                      (c.state_json(), json.dumps([[d.what, d.original, d.relocated] for d in c.differences]),
                       c.replay_command)).lastrowid
    oid = con.execute("INSERT INTO outcomes (verdict, method, plan_kind, rule, klass, reason_key, reason) "
                      "VALUES (?,?,?,?,?,?,?)", outcome + (result.reason,)).lastrowid
    offset = row.address - row.function_start
    # the row is a packed one (store.packed_rows): out of its function's blob, into a full row, and its
    # function's counts moved from its old outcome to the refuted one (a new index k)
    data, outcomes, counts = con.execute("SELECT data, outcomes, counts FROM packed WHERE function=?",
                                         (fid,)).fetchone()
    records = list(struct.iter_unpack(PACKED_ROW, data))
    mine = next(r for r in records if r[0] == offset)
    kmap, ns = unpack_ids(outcomes), unpack_u32(counts)
    ns[mine[1] >> 5] -= 1
    con.execute("UPDATE packed SET data=?, outcomes=?, counts=? WHERE function=?",
                (b"".join(struct.pack(PACKED_ROW, *r) for r in records if r is not mine),
                 pack_ids(list(kmap) + [oid]), pack_u32(list(ns) + [1]), fid))
    con.execute("INSERT INTO instructions VALUES (?,?,?,?,NULL,?,?,NULL,NULL,?)",
                (fid, offset, row.length, oid, mine[2], (mine[1] >> 4) & 1, cex))
    seal_functions(con, "f.id=?", (fid,))  # sealed, as a run seals what it stores (store.row_seals)
    con.execute("COMMIT")
    con.close()
    return row.address


def _totals(db: Path) -> dict[str, int]:
    store = Results(str(db))
    totals = {v.value: 0 for v in Verdict}
    for _, counts in store.function_counts(store.find_image()):
        for v, n in counts.items():
            totals[v] += n
    store.close()
    return totals


@pytest.fixture(scope="module")
def small_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    db, _ = _store_of(tmp, SMALL_ASM)
    baseline = tmp / "baseline.sqlite"
    baseline.write_bytes(db.read_bytes())  # the store before the refutation: the baseline
    address = _add_refutation(db)
    out = tmp / "html"
    text = _report([str(db), "--baseline", str(baseline), "-o", str(out)])
    return db, out, address, text


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright import sync_api as playwright
    except ImportError:
        pytest.fail("the report tests drive Chromium with Playwright: .venv/bin/pip install -e '.[test]' "
                    "(never `playwright install`: the browser is Debian's chromium)")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Page:
    """A page of the report with every console error, page error, dialog and non-file request recorded."""

    def __init__(self, browser, index: Path):
        self.problems: list[str] = []
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.page.set_default_timeout(10_000)
        self.page.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text}")
                     if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("dialog", lambda d: (self.problems.append(f"dialog: {d.message}"), d.dismiss()))
        self.page.on("request", lambda r: None if r.url.startswith("file://")
                     else self.problems.append(f"request: {r.url}"))
        self.page.goto(index.as_uri(), wait_until="load")
        self.page.wait_for_selector("body[data-ready='1']")

    def go(self, fragment: str) -> None:
        self.page.evaluate("h => { location.hash = h; }", fragment)


# --- the files ---------------------------------------------------------------------------

def test_cli_writes_a_self_contained_directory(small_report):
    _, out, _, text = small_report
    assert text.startswith("report: ") and "instructions in 4 functions" in text
    html = (out / "index.html").read_text()
    assert 'http-equiv="Content-Security-Policy"' in html and "script-src &#x27;self&#x27;" in html
    assert not re.search(r"<script(?![^>]*\bsrc=)", html), "every script is a file"
    assert not re.search(r"\son[a-z]+\s*=", html), "no inline event handler"
    assert not re.search(r"(https?:)?//[a-z]", html.replace("http://www.w3.org/2000/svg", "")), "no network"
    assert sorted(p.name for p in (out / "data" / "s").iterdir()) == ["0.js"]


def test_cli_refuses_a_missing_store(tmp_path):
    with pytest.raises(InputError, match="no such store"):
        report_cli.command(_parse([str(tmp_path / "none.sqlite"), "-o", str(tmp_path / "o")]), io.StringIO())
    foreign = tmp_path / "notes.txt"
    foreign.write_text("not a store\n")
    with pytest.raises(InputError, match="not a relocverify store"):
        report_cli.command(_parse([str(foreign), "-o", str(tmp_path / "o")]), io.StringIO())
    assert foreign.read_text() == "not a store\n"
    with pytest.raises(InputError, match="baseline"):
        db, _ = _store_of(tmp_path, SMALL_ASM)
        report_cli.command(_parse([str(db), "--baseline", str(tmp_path / "b"), "-o", str(tmp_path / "o")]),
                           io.StringIO())


# --- in the browser ----------------------------------------------------------------------

def test_summary_shows_the_store_totals(small_report, browser):
    db, out, _, _ = small_report
    p = Page(browser, out / "index.html")
    totals = _totals(db)
    assert totals["refuted"] == 1
    for verdict, n in totals.items():
        assert p.page.inner_text(f"#n-{verdict}") == f"{n:,}"
    assert p.page.inner_text("#n-total") == f"{sum(totals.values()):,}"
    relocatable = sum(totals.values()) - totals["rejected"]
    assert p.page.inner_text("#share-proved") == f"{100 * totals['proved'] / relocatable:.2f}%"
    assert "symbol-name prefix" in p.page.inner_text("#source-kind")  # the test ELF has no DWARF
    cells = p.page.eval_on_selector_all("svg[aria-label='coverage map of .text'] rect", "rs => rs.length")
    assert cells == 4  # .text is 0x31 bytes: cells of 16 bytes (the smallest), not 2048 of one
    store = Results(str(db))
    by_class = Counter((r.klass, r.verdict) for r in store.iter_rows(store.find_image()))
    store.close()
    titles = p.page.eval_on_selector_all("svg[aria-label='verdicts per instruction class'] title",
                                         "ts => ts.map(t => t.textContent)")
    assert sorted(titles) == sorted(f"{k}: {n:,} {v}" for (k, v), n in by_class.items())
    _shot(p.page, "report-small-summary.png", out)
    assert p.problems == []


def test_function_table_filters_sorts_and_opens_a_counterexample(small_report, browser):
    db, out, address, _ = small_report
    p = Page(browser, out / "index.html")
    p.go("functions")
    assert p.page.inner_text("#f-count") == "4 of 4 functions"
    p.page.fill("#f-search", "cpuid")
    p.page.wait_for_function("() => document.getElementById('f-count').textContent.startsWith('1 of')")
    assert p.page.inner_text("#f-body").startswith("f_cpuid")
    p.page.fill("#f-search", "")
    p.page.select_option("#f-has", "refuted")
    p.page.wait_for_function("() => document.getElementById('f-count').textContent.startsWith('1 of')")
    p.page.click("#f-body a")
    p.page.wait_for_selector("#fn-name")
    assert p.page.inner_text("#fn-name") == "f_plain"
    p.page.click(f"table.listing a:text('{address:#x}')")
    p.page.wait_for_selector("#cex")
    detail = p.page.inner_text("#insn-detail")
    assert "48 8b 05 10 00 00 00" in detail and "refuted" in detail
    assert "relocverify replay --orig 488b0510000000" in p.page.inner_text("#cex")
    assert "trampoline at 0xffffffffc0001000" in detail  # the plan, recomputed: a rewrite of the load
    store = Results(str(db))
    row = store.instruction_at(store.find_image(), address)
    store.close()
    assert f"{row.proof_us} µs, fresh" in detail
    _shot(p.page, "report-small-counterexample.png", out)
    p.go("functions")
    p.page.select_option("#f-has", "")
    p.page.click("button[data-sort='n']")
    assert p.page.inner_text("#f-body tr:first-child td:first-child") == "f_plain"  # 6 instructions, the most
    assert p.problems == []


def test_instruction_view_shows_an_opaque_plan_and_the_baseline(small_report, browser):
    db, out, address, _ = small_report
    store = Results(str(db))
    image = store.find_image()
    cpuid = next(r for r in store.iter_rows(image) if r.raw == b"\x0f\xa2")
    fid = next(f.id for f in store.iter_functions(image) if f.name == "f_cpuid")
    store.close()
    p = Page(browser, out / "index.html")
    p.go(f"i={fid}:{cpuid.address - cpuid.function_start}")
    p.page.wait_for_selector("#insn-detail")
    detail = p.page.inner_text("#insn-detail")
    assert "cpuid" in detail and cpuid.verdict in detail and "copy (" in detail
    p.go("baseline")
    p.page.wait_for_selector("#view-baseline:not([hidden])")
    assert p.page.inner_text("#b-lost_proofs") == "1"
    assert "f_plain" in p.page.inner_text("#view-baseline")
    p.page.click("#view-baseline table:nth-of-type(2) a:text-is('f_plain')")
    p.page.wait_for_selector("#fn-name")
    assert p.page.inner_text("#fn-name") == "f_plain"
    assert p.problems == []


def _quoted(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


HOSTILE_ASM = "\n".join(f"""
    .section .text, "ax"
    .globl {_quoted(name)}
    .type {_quoted(name)}, @function
{_quoted(name)}:
    push %rbp
    sti
    pop %rbp
    ret
    .size {_quoted(name)}, .-{_quoted(name)}
""" for name in HOSTILE)


def test_hostile_symbol_names_render_as_text(tmp_path, browser):
    db, image = _store_of(tmp_path, HOSTILE_ASM)
    names = {f.name for f in Results(str(db)).iter_functions(1)}
    assert names == set(HOSTILE), "the ELF carries the names as written"
    out = tmp_path / "html"
    _report([str(db), "--baseline", str(db), "-o", str(out)])
    html = (out / "index.html").read_text()
    assert "<script>alert" not in html and "onerror=alert" not in html.replace("onerror=alert(3)&gt;", "")
    p = Page(browser, out / "index.html")
    p.go("functions")
    shown = p.page.eval_on_selector_all("#f-body a", "as => as.map(a => a.textContent)")
    assert sorted(shown) == sorted(HOSTILE)
    for i, name in enumerate(HOSTILE):
        p.go(f"f={i + 1}")
        p.page.wait_for_function("n => (document.getElementById('fn-name') || {}).textContent === n", arg=name)
    assert p.page.evaluate("() => document.querySelectorAll('script').length") == 3 + 1  # ours and the one shard
    assert p.page.evaluate("() => document.querySelectorAll('img').length") == 0
    assert p.problems == []


# --- pieces --------------------------------------------------------------------------------

def test_packed_numbers_and_source_names():
    assert packed([0, 31, 32, 1023, 1024]) == "0vB0.vBA0"
    assert name_prefix("__x64_sys_read") == "x64" and name_prefix("ext4_map_blocks") == "ext4"
    assert source_directory("/build/reproducible-path/linux-6.1.187/arch/x86/kernel/head_64.S") == "arch/x86/kernel"
    assert source_directory("fs/ext4/inode.c") == "fs/ext4"


@pytest.mark.slow
def test_report_of_a_real_kernel_run(debian_kernels, tmp_path, browser):
    """The first 1500 functions of the Debian 6.1 cloud kernel: DWARF names the rejections' source
    directories (the fast compile-unit reader agrees with pyelftools), and the page shows the store's totals."""
    kernel, _ = debian_kernels("debian-6.1-cloud")
    sources = SourceNames.open(str(kernel.vmlinux))
    assert sources.kind == DWARF
    for cu in sorted(set(sources._cus))[::150]:
        top = sources._dwarf.get_CU_at(cu).get_top_DIE().attributes["DW_AT_name"].value.decode()
        assert sources._reader.name(cu) == top
    image = load_image(str(kernel.vmlinux))
    db = tmp_path / "k.sqlite"
    run(image, str(db), RunOptions(TRAMP, 2, 10.0, 1500, True, None))
    out = tmp_path / "html"
    _report([str(db), "-o", str(out)])
    p = Page(browser, out / "index.html")
    for verdict, n in _totals(db).items():
        assert p.page.inner_text(f"#n-{verdict}") == f"{n:,}"
    assert "DWARF" in p.page.inner_text("#source-kind")
    assert "arch/x86" in p.page.inner_text("#view-summary")
    store = Results(str(db))
    name = max(store.function_counts(store.find_image()), key=lambda fc: fc[1].get("rejected", 0))[0].name
    store.close()
    p.go("functions")
    p.page.fill("#f-search", f"/^{re.escape(name)}$/")
    p.page.wait_for_function("() => document.getElementById('f-count').textContent.startsWith('1 of')")
    p.page.click("#f-body a")
    p.page.wait_for_selector("table.listing")
    assert p.page.inner_text("#fn-name") == name and "rejected" in p.page.inner_text("table.listing")
    store = Results(str(db))
    image = store.find_image()
    site = next(r for r in store.iter_rows(image) if "fentry" in r.sites)
    fid = next(f.id for f in store.iter_functions(image) if (f.start, f.name) == (site.function_start, site.function))
    live = store.variants_at(fid, site.address - site.function_start)
    store.close()
    assert live, "an fentry site has its variants stored"
    p.go(f"i={fid}:{site.address - site.function_start}")
    p.page.wait_for_selector("#insn-detail")
    detail = p.page.inner_text("#insn-detail")
    assert "live variants at this boot-patched site" in detail and "fentry" in detail
    assert all(name in detail for name, _, _ in live)
    assert p.problems == []


@pytest.mark.slow
def test_report_shows_jump_probe_answers(debian_kernels, tmp_path, browser):
    """A run with --jump-probes: the summary counts each answer as the store does, the listing has a
    jump-probe column with eligible and refused instructions, and the instruction view says why."""
    kernel, _ = debian_kernels("debian-6.1-cloud")
    image = load_image(str(kernel.vmlinux))
    db = tmp_path / "j.sqlite"
    summary = run(image, str(db), RunOptions(TRAMP, 2, 10.0, 40, True, None, jump_probes=True))
    jump = summary["jump_probe"]
    assert jump["totals_add_up"] and jump["eligible"] > 0 and jump["refused"]
    out = tmp_path / "html"
    _report([str(db), "-o", str(out)])
    p = Page(browser, out / "index.html")
    table = p.page.inner_text("table.jump-probes")
    assert f"eligible\t{jump['eligible']:,}" in table
    for bucket, n in jump["refused"].items():
        assert f"{bucket}\t{n:,}" in table
    store = Results(str(db))
    image_id = store.find_image()
    names = {i: name for i, name, _ in store.jump_bucket_names()}
    fid, refused_at = next((fid, off) for (fid,) in store.db.execute("SELECT id FROM functions WHERE image=?",
                                                                     (image_id,))
                           for off, b in store.jump_answers(fid).items() if names[b].startswith("range:"))
    store.close()
    p.go(f"i={fid}:{refused_at}")
    p.page.wait_for_selector("#insn-detail")
    assert "jump probe" in p.page.inner_text("table.listing thead")
    listing = p.page.inner_text("table.listing")
    assert "eligible" in listing or "range:" in listing
    assert "refused: range:" in p.page.inner_text("#insn-detail")
    assert p.problems == []


def test_html_text_spells_every_control_character():
    """The report's one HTML encoder (``text.html_text``): C0 and C1 controls, which XML 1.0 cannot hold and a
    browser shows as nothing, and terminal escapes reach the page as visible ``\\xNN`` (issue 44)."""
    import re as _re

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from relocverify.text import html_text

    @settings(max_examples=200, deadline=None)
    @given(st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x2FF, blacklist_categories=("Cs",))))
    def check(name):
        out = html_text(name)
        assert not _re.search(r"[\x00-\x1f\x7f-\x9f<>&\"']", out.replace("&amp;", "").replace("&lt;", "")
                              .replace("&gt;", "").replace("&quot;", "").replace("&#x27;", "")), (name, out)

    check()


def test_a_killed_report_s_staging_is_swept_by_the_next(tmp_path):
    """A report killed with SIGKILL leaves its staging directory; the next report removes it (issue 44)."""
    import subprocess
    import sys

    from relocverify.cli.report import _build_staged

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = tmp_path / f".relocverify-report-{dead}-abc"
    (stale / "data").mkdir(parents=True)
    (stale / "data" / "big").write_bytes(b"x" * 1000)
    mine = tmp_path / f".relocverify-report-{os.getpid()}-live"  # a running report's (this process): kept
    mine.mkdir()

    def build(staging):
        open(os.path.join(staging, "index.html"), "w").write("ok")
        return {}

    _build_staged(str(tmp_path / "out"), build)
    assert not stale.exists() and mine.exists() and (tmp_path / "out" / "index.html").read_text() == "ok"
