"""The audit's summary (``tracers.run.AuditSummary``): what ``audit --json`` prints, ``--summary-json``
writes and ``save_summary`` keeps is its document, as it is; the text is rendered from it; the exit code
follows its typed fields (3: some totals do not add up, 1: some tracer-wrong, else 0).  Small images built
here: a kernel, two modules and a module of data alone, and a package directory holding them."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import subprocess

import pytest

import relocverify.engine.verify as engine_verify
import relocverify.tracers.run as tracers_run
from relocverify.cli import main
from relocverify.engine.requests import ImageRequest, ModuleRequest, PackageRequest
from relocverify.cli.audit import exit_code, render
from relocverify.tracers.audit import BUCKETS, summary_path
from relocverify.tracers.run import AuditSummary, TracerTally

MODULE_ASM = """
    .section .text, "ax"
    .globl m_a
    .type m_a, @function
m_a:
2:  push %rbp
    mov 0x10(%rip), %rax
    call f_b
    loop 2b
    lock incl 0x20(%rip)
    pop %rbp
    ret
    .size m_a, .-m_a
    .globl m_b
    .type m_b, @function
m_b:
    xor %eax, %eax
    jle 1f
    call *(%rsp)
    nop
1:  ret
    .size m_b, .-m_b
"""
DATA_ASM = """
    .section .data, "aw"
    .globl d_x
d_x: .quad 1
"""


@pytest.fixture()
def inputs(tmp_path):
    """(vmlinux, [data-only module, module]) built in ``tmp_path``, and a package directory of them."""
    import elfbuild
    import test_audit

    vmlinux = elfbuild.build_elf(tmp_path, test_audit.AUDIT_ASM, test_audit.AUDIT_LDS)
    modules = build_modules(tmp_path, [("a_data.ko", DATA_ASM), ("b_mod.ko", MODULE_ASM)])
    return vmlinux, modules, package_of(tmp_path, [vmlinux, *modules])


def build_modules(directory, sources: list[tuple[str, str]]) -> list:
    """Each (file name, assembly) assembled into a module in ``directory``: their paths."""
    out = []
    for name, asm in sources:
        (directory / f"{name}.s").write_text(asm)
        subprocess.run(["gcc", "-c", "-o", str(directory / name), str(directory / f"{name}.s")], check=True)
        out.append(directory / name)
    return out


def package_of(directory, files: list):
    """A package directory (``directory/pkg``) holding copies of ``files``."""
    package = directory / "pkg"
    package.mkdir()
    for f in files:
        shutil.copy(f, package / f.name)
    return package


def _audit(tmp_path, monkeypatch, kind: type, argv: list[str]) -> tuple[int, str, AuditSummary]:
    """``relocverify audit ARGV`` run, with the ``AuditSummary`` that ``tracers.run.audit`` returned to it for
    the one request it was given, of the ``kind`` the arguments name."""
    got = []
    real = tracers_run.audit
    monkeypatch.setattr(tracers_run, "audit", lambda request, *a, **k: got.append((request, real(request, *a, **k)))
                        or got[-1][1])
    out = io.StringIO()
    code = main(["audit", *argv, "--no-progress", "--jobs", "1", "--cache-dir", str(tmp_path / "cache"),
                 "--summary-json", str(tmp_path / "summary.json")], out=out, err=io.StringIO())
    ((request, summary),) = got
    assert type(request) is kind
    return code, out.getvalue(), summary


def _typed_as_the_document_says(summary: AuditSummary) -> None:
    doc = summary.document
    assert summary.instructions == doc["instructions"] and summary.wall_s == doc["wall_s"]
    assert [t.name for t in summary.tracers] == list(doc["tracers"])
    for t in summary.tracers:
        d = doc["tracers"][t.name]
        assert (t.instructions, dict(t.buckets), t.totals_add_up, t.tracer_wrong) == (
            d["instructions"], d["buckets"], d["totals_add_up"], d["buckets"]["tracer-wrong"])
    assert summary.totals_add_up == all(t["totals_add_up"] for t in doc["tracers"].values())
    assert summary.any_tracer_wrong == any(t["buckets"]["tracer-wrong"] for t in doc["tracers"].values())


def _files_hold_the_document(summary: AuditSummary, tmp_path) -> None:
    assert (tmp_path / "summary.json").read_text() == json.dumps(summary.document, indent=2)
    with open(summary_path(summary.store)) as fh:
        assert fh.read() == json.dumps(summary.document, indent=1)


def test_an_image_s_json_is_its_summary_s_document(inputs, tmp_path, monkeypatch):
    vmlinux, _, _ = inputs
    db = str(tmp_path / "s.sqlite")
    code, out, summary = _audit(tmp_path, monkeypatch, ImageRequest, [
        str(vmlinux), "--db", db, "--tracer", "kprobes@6.1", "--tracer", "uprobes@6.1", "--json"])
    assert out == json.dumps(summary.document, indent=2) + "\n"
    assert summary.store == db and summary.instructions == 13 and list(summary.document)[-2:] == ["image", "own"]
    _typed_as_the_document_says(summary)
    _files_hold_the_document(summary, tmp_path)
    assert summary.any_tracer_wrong and code == exit_code(summary) == 1


def test_an_image_s_text_is_rendered_from_its_summary(inputs, tmp_path, monkeypatch):
    vmlinux, _, _ = inputs
    db = str(tmp_path / "s.sqlite")
    code, out, summary = _audit(tmp_path, monkeypatch, ImageRequest, [
        str(vmlinux), "--db", db, "--tracer", "kprobes@6.1", "--tracer", "uprobes@6.1"])
    assert out == render(summary) + f"store: {db}\n"
    assert out.splitlines()[0].startswith("13 instructions in 2 functions, slot at 0xffffffffc0001000; ")
    _files_hold_the_document(summary, tmp_path)
    assert code == exit_code(summary) == 1


def test_modules_json_is_the_merged_summary_s_document(inputs, tmp_path, monkeypatch):
    vmlinux, modules, _ = inputs
    argv = [str(vmlinux), *[a for m in modules for a in ("--module", str(m))], "--db", str(tmp_path / "m.sqlite"),
            "--tracer", "kprobes@6.1", "--tracer", "optprobes@6.1", "--json"]
    code, out, summary = _audit(tmp_path, monkeypatch, ModuleRequest, argv)
    assert out == json.dumps(summary.document, indent=2) + "\n"
    assert list(summary.document["images"]) == [str(m) for m in modules]
    assert summary.document["images"][str(modules[0])]["instructions"] == 0  # data alone: nothing to audit
    assert summary.instructions == summary.document["images"][str(modules[1])]["instructions"] > 0
    _typed_as_the_document_says(summary)
    _files_hold_the_document(summary, tmp_path)
    assert summary.totals_add_up and code == exit_code(summary)


def test_a_package_s_json_is_the_merged_summary_s_document(inputs, tmp_path, monkeypatch):
    _, _, package = inputs
    code, out, summary = _audit(tmp_path, monkeypatch, PackageRequest, [
        "--package", str(package), "--db", str(tmp_path / "p.sqlite"), "--tracer", "kprobes@6.1", "--json"])
    assert out == json.dumps(summary.document, indent=2) + "\n"
    assert list(summary.document["images"]) == ["vmlinux", "a_data.ko", "b_mod.ko"]
    assert summary.document["source"].startswith(f"{package}: vmlinux ")
    assert summary.instructions == sum(i["instructions"] for i in summary.document["images"].values())
    _typed_as_the_document_says(summary)
    _files_hold_the_document(summary, tmp_path)
    assert summary.totals_add_up and code == exit_code(summary) == 1


def _summary(store: str, *tallies: tuple[str, dict, bool]) -> AuditSummary:
    """A summary of tracers (name, buckets, totals add up), its document made to agree."""
    tracers = {name: {"instructions": sum(b.values()), "buckets": b, "totals_add_up": ok,
                      "groups": {k: [] for k in BUCKETS}} for name, b, ok in tallies}
    n = max((t["instructions"] for t in tracers.values()), default=0)
    return AuditSummary.of({"instructions": n, "functions": 1, "tramp": "0x1000", "tracers": tracers,
                            "wall_s": 0.5}, store)


def _buckets(**counts) -> dict:
    return {b: counts.get(b.replace("-", "_"), 0) for b in BUCKETS}


@pytest.mark.parametrize("tallies, code", [
    ([("a", _buckets(agree=3), True), ("b", _buckets(agree=2, unknown=1), True)], 0),
    ([("a", _buckets(agree=2, tracer_wrong=1), True), ("b", _buckets(agree=3), True)], 1),
    ([("a", _buckets(agree=2, tracer_wrong=1), True), ("b", _buckets(agree=3), False)], 3),
    ([("a", _buckets(agree=3), False)], 3),
])
def test_the_exit_code_follows_the_typed_fields(tallies, code, tmp_path, monkeypatch):
    summary = _summary(str(tmp_path / "s.sqlite"), *tallies)
    assert exit_code(summary) == code
    # the command decides by the typed fields: a document that says otherwise is not read for it
    doc = json.loads(json.dumps(summary.document))
    for t in doc["tracers"].values():
        t["totals_add_up"], t["buckets"]["tracer-wrong"] = True, 0
    told = dataclasses.replace(summary, document=doc)
    monkeypatch.setattr(tracers_run, "audit", lambda *a, **k: told)
    monkeypatch.setattr(engine_verify, "image_request", lambda *a, **k: None)  # the image is never loaded
    (tmp_path / "any").write_bytes(b"\x7fELF")
    out = io.StringIO()
    assert main(["audit", str(tmp_path / "any"), "--tracer", "kinst", "--no-progress"], out=out,
                err=io.StringIO()) == code
    assert ("incomplete: the totals do not add up\n" in out.getvalue()) == (code == 3)


def test_the_summary_is_frozen_and_confirmations_go_to_a_copy():
    summary = _summary("s.sqlite", ("a", _buckets(agree=2, tracer_wrong=1), True))
    summary.document["image"] = {"identity": "abc"}
    summary.document["tracers"]["a"]["groups"]["tracer-wrong"] = [{"group": "loop", "count": 1, "examples": []}]
    with pytest.raises(dataclasses.FrozenInstanceError):
        summary.store = "other"
    with pytest.raises(TypeError):
        summary.tracers[0].buckets["agree"] = 0
    assert isinstance(summary.tracers[0], TracerTally) and summary.tracers[0].tracer_wrong == 1
    assert summary.confirmed(None) is summary
    found = {"image": "abc", "kernel": "6.1", "accelerator": "tcg",
             "groups": [{"tracer": "a", "bucket": "tracer-wrong", "group": "loop", "outcome": "confirmed"}]}
    confirmed = summary.confirmed(found)
    assert "confirmed" in confirmed.document["tracers"]["a"]["groups"]["tracer-wrong"][0]
    assert "confirmed" not in summary.document["tracers"]["a"]["groups"]["tracer-wrong"][0]
    assert confirmed.tracers == summary.tracers and confirmed.store == summary.store


def test_engine_verify_hands_each_image_over_with_its_store_id(inputs, tmp_path):
    """What the audit is given (``engine.verify.VerifiedImage``): a package's vmlinux first, then each
    module with its place, its vmlinux and its id in the store (none for a module of data alone)."""
    from relocverify.engine.run import RunOptions
    from relocverify.engine.verify import verify
    from relocverify.store.store import Results

    _, _, package = inputs
    db = str(tmp_path / "v.sqlite")
    handed = []
    verify(PackageRequest(str(package), RunOptions(0xFFFFFFFFC0001000, 1, 10.0), db), on_image=handed.append)
    assert [(v.name, v.number, v.images) for v in handed] == [("vmlinux", 1, 3), ("a_data.ko", 2, 3),
                                                              ("b_mod.ko", 3, 3)]
    vmlinux, data, module = handed
    assert vmlinux.kernel is None and data.kernel is module.kernel is vmlinux.image
    assert data.image_id is None and data.summary["instructions"] == 0
    results = Results(db)
    try:
        assert [results.find_image(v.image.identity) for v in (vmlinux, module)] == [vmlinux.image_id,
                                                                                    module.image_id]
    finally:
        results.close()
    assert vmlinux.image_id != module.image_id and all(v.store == db for v in handed)
    with pytest.raises(dataclasses.FrozenInstanceError):
        module.image_id = 0
