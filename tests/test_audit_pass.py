"""The tracer audit as a pass of the run (``tracers.audit_pass``, an ``engine.passes.StoredPass``): its summary is
``audit.audit_store``'s, in one process, counts included, cold and warm, when a worker is killed in it, and when
chunks come back out of order; the engine's phase (``engine.phases.stored_rows``) merges a pass's chunks in
function order and runs a chunk again whole when its worker dies; the pieces the merge is made of
(``Tally.merge``, ``Tally.add_remembered``, ``merge_cases``, ``replayed``) do what one walk would have done.

Each audit compared runs in a process of its own (``_audit``): z3's counterexample for a proof depends on what
its process proved before (``tracers.audit_pass``' doc), so two audits in one process need not agree.  The
image is small and built here: ``test_audit``'s two functions and two copies of them elsewhere, so that
proofs and the pieces of blocks recur in functions the other worker judges; each chunk is one function."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relocverify.engine.passes import StoredMerge, StoredPass
from relocverify.engine.phases import sizes
from relocverify.engine.requests import KernelRequest
from relocverify.engine.run import RunOptions
from relocverify.engine.verify import verify
from relocverify.store.cache import CachedProof
from relocverify.store.store import Results
from relocverify.tracers import get_model
from relocverify.tracers.audit import (AuditPlan, Auditor, Tally, Told, TracerOutcome, add_cases, add_rows,
                                       merge_cases)
from relocverify.tracers.audit_pass import replayed
from relocverify.engine.keys import KeyMaker

HERE = Path(__file__).resolve().parent
TRAMP = 0xFFFFFFFFC0001000
TRACERS = ("kprobes@6.1", "optprobes@6.1", "optprobes@6.1+ret", "kinst", "fasttrap")
WALL_CLOCK = ("phases", "wall_s")


@pytest.fixture(autouse=True, scope="module")
def _sources(linux_sources):
    """The Linux models decode with the kernel's own decoder, built from the source packages."""


def _body(name: str) -> str:
    """``test_audit``'s two functions, named ``name_a`` and ``name_b``."""
    return f"""
    .globl {name}_a
    .type {name}_a, @function
{name}_a:
    push %rbp
    mov 0x10(%rip), %rax
    loop {name}_a
    vmovdqu %xmm0, (%rdi)
    .byte 0x2e
    call {name}_b
    lock incl 0x20(%rip)
    call *(%rsp)
    pop %rbp
    ret
    .size {name}_a, .-{name}_a
    .globl {name}_b
    .type {name}_b, @function
{name}_b:
    xor %eax, %eax
    jle 1f
    nop
1:  ret
    .size {name}_b, .-{name}_b
"""


#: f_a, f_b, h, g_a, g_b: with a chunk per function, the two workers take f_a, h, g_b and f_b, g_a, so each copy is
#: judged by the worker that did not judge its original.  The copies lie a page after the originals: their blocks
#: have the same keys (``proof.block.block_key``: data addresses by their alignment).
ASM = ('    .section .text, "ax"\n' + _body("f") + "    .balign 0x800, 0xcc\n    .globl h\n    .type h, @function\n"
       "h:\n    nop\n    ret\n    .size h, .-h\n    .balign 0x1000, 0xcc\n" + _body("g"))
LDS = """
SECTIONS {
  . = 0xffffffff81000000;
  .text : { *(.text) }
  /DISCARD/ : { *(.note.gnu.property) *(.comment) }
}
"""

#: One audit in a process of its own, of ``image``: a kernel's path, or ``modules:VMLINUX|KO,KO...`` (modules against
#: their vmlinux), or ``package:DIR``; ``mode`` "serial" is ``audit_store`` after the run (the pass left out), else
#: the pass; a chunk of ``chunk`` functions; ``kill``: a worker killed the first time it meets that function (the
#: marker file says it was); ``slow``: the chunk of the first function comes back last; ``limit``: the first functions
#: (0: all).
SCRIPT = """
import json, os, signal, sys, time
from dataclasses import replace
import relocverify.engine.phases.sizes as sizes
import relocverify.tracers.audit_pass as audit_pass
import relocverify.tracers.run as tracers_run
from relocverify.engine.requests import KernelRequest, ModuleRequest, PackageRequest
from relocverify.engine.run import RunOptions
from relocverify.tracers import get_model

mode, image, db, cache, chunk, kill, marker, slow, tracers, limit = sys.argv[1:11]
sizes.STORED_CHUNK = int(chunk)
if mode == "serial":
    tracers_run._on_workers = lambda options: False
made = []
real_init, real_chunk = audit_pass.AuditPass.__init__, audit_pass.WorkerAudit.chunk

def init(self, *a, **k):
    real_init(self, *a, **k)
    made.append(self)

def chunk_of(self, image, functions):
    functions = list(functions)
    if slow == "1" and functions and functions[0].name == "f_a":
        time.sleep(2)
    def each():
        for f in functions:
            if f.name == kill and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            yield f
    return real_chunk(self, image, each())

audit_pass.AuditPass.__init__ = init
audit_pass.WorkerAudit.chunk = chunk_of
options = RunOptions({tramp}, 2, 10.0, int(limit) or None, cache_dir=cache)
kind, _, what = image.partition(":") if image.startswith(("modules:", "package:")) else ("kernel", "", image)
if kind == "modules":
    vmlinux, _, kos = what.partition("|")
    request = ModuleRequest(kos.split(","), vmlinux, options, db)
elif kind == "package":
    request = PackageRequest(what, options, db)
else:
    request = KernelRequest(what, options, db)
summary = tracers_run.audit(request,
                            [get_model(t) for t in tracers.split(",")])
print(json.dumps({{"document": summary.document, "judged_here": [p.judged_here for p in made]}}))
"""


def _audit(tmp_path, image, tag: str, mode: str = "pass", cache: str | None = None, chunk: int = 1, kill: str = "",
           slow: bool = False, tracers=TRACERS, limit: int = 0) -> dict:
    """One audit of ``image`` into a store of its own, in a process of its own (see ``SCRIPT``); its proof cache
    ``cache`` (default: a new one)."""
    marker = tmp_path / f"{tag}.killed"
    argv = [mode, str(image), str(tmp_path / f"{tag}.sqlite"), str(cache or tmp_path / f"{tag}-cache"), str(chunk),
            kill, str(marker), "1" if slow else "0", ",".join(tracers), str(limit)]
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(tramp=TRAMP), *argv], capture_output=True, text=True,
                          cwd=str(HERE))
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    got["killed"] = marker.exists()
    return got


def _timeless(document: dict) -> dict:
    return {k: v for k, v in document.items() if k not in WALL_CLOCK}


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    import elfbuild

    return elfbuild.build_elf(tmp_path_factory.mktemp("elf"), ASM, LDS)


@pytest.fixture(scope="module")
def serial(image, tmp_path_factory):
    """``audit_store``'s summary of the image (a new proof cache), then of the same audit again (that cache, warm)."""
    tmp = tmp_path_factory.mktemp("serial")
    cold = _audit(tmp, image, "cold", "serial")
    warm = _audit(tmp, image, "warm", "serial", cache=str(tmp / "cold-cache"))
    return cold["document"], warm["document"]


def test_the_pass_gives_audit_store_s_summary_cold_and_warm(image, serial, tmp_path):
    cold, warm = serial
    got = _audit(tmp_path, image, "cold")
    assert got["judged_here"] == [0]  # every function's outcomes were the workers', replayed, none judged again
    assert _timeless(got["document"]) == _timeless(cold)
    counts = cold["counts"]
    # the image makes the counts a replay must get right: proofs shared between functions, pieces and blocks
    assert counts["proofs_made"] and counts["proofs_shared"] and counts["pieces_proved"] and counts["blocks_composed"]
    again = _audit(tmp_path, image, "warm", cache=str(tmp_path / "cold-cache"))
    assert _timeless(again["document"]) == _timeless(warm)
    assert again["document"]["counts"]["proofs_made"] == 0


def test_a_worker_killed_in_the_pass_gives_the_same_summary(image, serial, tmp_path):
    got = _audit(tmp_path, image, "killed", kill="g_a")
    assert got["killed"]
    assert _timeless(got["document"]) == _timeless(serial[0])


def test_chunks_back_out_of_order_are_merged_in_function_order(image, serial, tmp_path):
    got = _audit(tmp_path, image, "slow", slow=True)
    assert _timeless(got["document"]) == _timeless(serial[0])


def test_the_whole_image_in_one_chunk(image, serial, tmp_path):
    got = _audit(tmp_path, image, "one", chunk=128)
    assert _timeless(got["document"]) == _timeless(serial[0])


@pytest.fixture(scope="module")
def modules(image, tmp_path_factory):
    """Three modules built for the image (``test_audit_summary``'s, one of data alone, and a copy of its other one),
    and a package directory of the image and them."""
    import test_audit_summary

    tmp = tmp_path_factory.mktemp("modules")
    code = test_audit_summary.MODULE_ASM.replace("call f_b", "call g_b")
    out = test_audit_summary.build_modules(tmp, [("a_data.ko", test_audit_summary.DATA_ASM), ("b_mod.ko", code),
                                                 ("c_mod.ko", code.replace("m_a", "n_a").replace("m_b", "n_b"))])
    return out, test_audit_summary.package_of(tmp, [image, *out])


@pytest.mark.parametrize("kind", ["modules", "package"])
def test_modules_and_a_package_audited_by_the_pass_are_audit_store_s(image, modules, tmp_path, kind):
    """Modules (their optprobes facts with their vmlinux's thunk range: ``audit_pass.facts_of``); a package, whose
    modules are verified on workers forked after the vmlinux's audit, which the next module's job is sent to (the
    pass pickled without its auditor: the workers keep the state they made)."""
    kos, package = modules
    what = f"modules:{image}|{','.join(map(str, kos))}" if kind == "modules" else f"package:{package}"
    serial = _audit(tmp_path, what, "s", "serial")
    got = _audit(tmp_path, what, "p")
    assert _timeless(got["document"]) == _timeless(serial["document"])
    assert got["document"]["instructions"] > 0 and got["judged_here"] == [0]
    assert set(got["document"]["images"]) == ({str(k) for k in kos} if kind == "modules" else
                                              {"vmlinux", "a_data.ko", "b_mod.ko", "c_mod.ko"})


# -- the engine's phase, with a pass of its own -------------------------------------------------------------

class Names(StoredPass):
    """Each function's name and row count, in the order the merge is given them.  ``slow``: the chunk of the
    image's first function comes back last; ``kill``: a worker dies the first time it meets that function
    (``marker`` says it did)."""

    name = "names"

    def __init__(self, slow: bool = False, kill: str = "", marker: str = ""):
        self.slow, self.kill, self.marker = slow, kill, marker

    def start(self):
        return []

    def chunk(self, state, image, functions):
        out = []
        for f in functions:
            if f.name == self.kill and not os.path.exists(self.marker):
                open(self.marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            out.append((f.name, len(f.rows)))
        if self.slow and out and out[0][0] == "f_a":
            time.sleep(1.5)
        state.extend(out)  # kept from chunk to chunk: nothing of it reaches the parent
        return out

    def merger(self, image, image_id):
        return Listed()


class Listed(StoredMerge):
    def __init__(self):
        self.names: list = []

    def add(self, value):
        self.names.extend(value)

    def section(self):
        return {"functions": self.names}


def _stored_order(db) -> list:
    results = Results(str(db))
    try:
        return [(name, len(rows)) for _, _, name, _, rows in results.function_verdicts(results.find_image())]
    finally:
        results.close()


@pytest.mark.parametrize("how", ["plain", "slow", "killed"])
def test_a_stored_pass_is_merged_in_function_order(image, tmp_path, monkeypatch, how):
    monkeypatch.setattr(sizes, "STORED_CHUNK", 1)
    marker = tmp_path / "killed"
    p = Names(slow=how == "slow", kill="g_a" if how == "killed" else "", marker=str(marker))
    db = tmp_path / "n.sqlite"
    doc = verify(KernelRequest(str(image), RunOptions(TRAMP, 2, 10.0, stored_passes=(p,)), str(db))).document
    assert doc["stored_passes"]["names"]["functions"] == _stored_order(db)
    assert len(_stored_order(db)) == 5
    assert marker.exists() == (how == "killed")
    again = verify(KernelRequest(str(image), RunOptions(TRAMP, 2, 10.0), str(db))).document
    assert "stored_passes" not in again  # the section is the request's reading, not the run's record


def test_a_stored_pass_reads_the_first_limit_functions_with_rows(image, tmp_path, monkeypatch):
    monkeypatch.setattr(sizes, "STORED_CHUNK", 1)
    db = tmp_path / "l.sqlite"
    doc = verify(KernelRequest(str(image), RunOptions(TRAMP, 2, 10.0, limit=3, stored_passes=(Names(),)),
                               str(db))).document
    assert doc["stored_passes"]["names"]["functions"] == _stored_order(db)[:3]


# -- what the merge is made of -------------------------------------------------------------------------------

def _outcome(k: int) -> TracerOutcome:
    kinds = ("refuse", "relocate", "relocate", "emulate")
    verdicts = ("", "proved", "refuted", "unknown")
    return TracerOutcome(kinds[k % 4], verdicts[k % 4], f"r{k % 3}", ("cpu", "", "cpu-same")[k % 3], f"g{k % 5}",
                         json.dumps({"k": k % 5}))


def _function(k: int):
    """Ten four-byte instructions: nopl 0x0(%rax) (the same case from function to function) and add $k, %rax."""
    data = (bytes.fromhex("0f1f4000") * 3 + bytes([0x48, 0x83, 0xC0, k % 3])) * 2 + bytes.fromhex("0f1f4000") * 2
    rows = [(off, 4, ("proved", "refuted", "unknown")[(off + k) % 3], 1 if off == 8 else None)
            for off in range(0, 40, 4)]
    return 0xFFFFFFFF81000000 + 0x100 * k, f"fn{k}", data, rows


def test_tally_merge_is_the_adds_one_by_one():
    whole, parts = Tally(), [Tally() for _ in range(3)]
    for k in range(9):  # the parts: three consecutive runs of functions
        start, name, data, rows = _function(k)
        outs = [_outcome(k * 10 + j) for j in range(len(rows))]
        add_rows(whole, outs, start, name, data, rows)
        add_rows(parts[k // 3], outs, start, name, data, rows)
    merged = Tally()
    for t in parts:
        merged.merge(t)
    assert merged == whole and merged.as_json() == whole.as_json()
    assert max(g[0] for g in whole.groups.values()) > 3


def test_tally_add_remembered_is_add_rows():
    by_rows, remembered = Tally(), Tally()
    details = {f"g{k}": json.dumps({"k": k}) for k in range(4)}  # g4's detail is not kept: "{}"
    for k in range(20):
        start, name, data, rows = _function(k)
        outs = [_outcome(k * 10 + j) for j in range(len(rows))]
        add_rows(by_rows, [TracerOutcome(*o.row()[:5], details.get(o.group, "{}")) for o in outs], start, name, data,
                 rows)
        remembered.add_remembered(tuple(o.row()[:5] for o in outs), details, start, name, data, rows)
    assert remembered == by_rows
    assert max(g[0] for g in by_rows.groups.values()) > 3  # a group with more instances than it keeps


def test_merge_cases_is_one_walk_over_the_functions():
    km = KeyMaker(TRAMP)
    plan = AuditPlan((), (), ("6.1",), ())
    functions = [_function(k) for k in range(8)]
    walks = [(frozenset({4}) if k % 2 else frozenset(),) for k in range(8)]
    whole: dict = {}
    for (start, name, data, rows), w in zip(functions, walks):
        add_cases(whole, km, plan, w, start, name, data, rows)
    merged: dict = {}
    for lo in (0, 3, 5):
        part: dict = {}
        for (start, name, data, rows), w in list(zip(functions, walks))[lo:{0: 3, 3: 5, 5: 8}[lo]]:
            add_cases(part, km, plan, w, start, name, data, rows)
        merge_cases(merged, part)
    assert list(merged.items()) == list(whole.items())
    assert max(c[0] for c in whole.values()) > 3  # a case with more instances than it keeps


@pytest.fixture()
def auditor(tmp_path):
    a = Auditor([get_model("optprobes@6.1")], TRAMP, 10.0, str(tmp_path / "cache"))
    yield a
    a.cache.close()


def test_replayed_counts_a_proof_once_whoever_made_it(auditor):
    proof = CachedProof("proved", "fast path", "fast-path", 5)
    made = Told(b"copy|k", b"same", "made", ("proved", "fast path", "fast-path", None), ((b"p1", True), (b"p2", True)),
                True, False, proof, ("proved", "fast path", "fast-path", ""))
    assert replayed(auditor, (made,))
    assert auditor.counts["blocks_composed"] == 1 and auditor.counts["pieces_proved"] == 2
    # another worker made the same proof and pieces for a later function: here it is shared, its pieces known
    again = Told(b"copy|k", b"other", "made", ("proved", "fast path", "fast-path", None),
                 ((b"p1", True), (b"p3", True)), True, False, proof, None)
    assert replayed(auditor, (again,))
    assert auditor.counts["proofs_shared"] == 1 and auditor.counts["blocks_composed"] == 1
    assert auditor.counts["pieces_proved"] == 2 and b"p3" not in auditor.pieces
    assert auditor.new_proofs[b"copy|k"] is proof and auditor.verdicts[b"same"][0] == "proved"


def test_replayed_keeps_nothing_of_a_function_whose_answers_differ(auditor):
    auditor.pieces[b"p9"] = False
    before = dict(auditor.counts)
    first = Told(None, b"o1", "made", ("refuted", "r", "smt", {"x": 1}), None, False, True, None,
                 ("refuted", "r", "smt", json.dumps({"x": 1})))
    differs = Told(None, None, "made", ("proved", "fast", "fast-path", None), ((b"p9", True),), True, False, None, None)
    assert not replayed(auditor, (first, differs))
    assert auditor.counts == before and b"o1" not in auditor.verdicts and auditor.pieces == {b"p9": False}
    told_more = Told(b"copy|unknown", None, "proof", ("proved", "r", "copy", None))  # a proof the parent lacks
    assert not replayed(auditor, (told_more,)) and auditor.counts == before


def test_the_pass_sent_to_a_worker_carries_no_auditor(tmp_path):
    """Pickled (a worker that lives on is sent each image's job), the pass leaves out the parent's auditor and the
    models a worker does not ask; started there, or in the parent's own process, it reads its memos from the cache
    directory, without the cache's proofs (the parent read them before the run, which may have added some)."""
    import pickle

    from relocverify.tracers.audit_pass import AuditPass

    models = [get_model(t) for t in TRACERS]
    auditor = Auditor(models, TRAMP, 10.0, str(tmp_path / "cache"))
    try:
        p = AuditPass(auditor, True, str(tmp_path / "cache"))
        sent = pickle.loads(pickle.dumps(p))
        assert sent.auditor is None and sent.say is None
        assert [m.name for m in sent.plan.per_function] == ["optprobes@6.1", "optprobes@6.1+ret"]
        assert sent.plan.per_insn == () and [m.name for m in sent.plan.readers] == ["fasttrap"]
        for state in (sent.start(), p.start()):  # there, and in this process (one worker, in process)
            assert state.auditor is not auditor and state.auditor.proofs == {}
            assert set(state.auditor.outcomes) == {"optprobes@6.1", "optprobes@6.1+ret"}
            state.auditor.cache.close()
    finally:
        auditor.cache.close()


# -- the real kernel (slow) ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cloud():
    from relocverify.image.fetch import fetch

    return fetch("debian-6.1-cloud")


@pytest.mark.slow
def test_a_kernel_slice_audited_by_the_pass_is_audit_store_s(cloud, tmp_path):
    """The first 1,500 functions of the Debian 6.1 vmlinux (about 60 thousand instructions), cold then warm.  The
    slice holds no instruction whose counterexample z3 gives differently after other proofs (``audit_pass``)."""
    kw = dict(chunk=128, tracers=("kprobes@6.1", "optprobes@6.1", "kinst"), limit=1500)
    serial = _audit(tmp_path, cloud.vmlinux, "s", "serial", **kw)
    got = _audit(tmp_path, cloud.vmlinux, "p", **kw)
    assert serial["document"]["instructions"] > 50_000 and serial["document"]["counts"]["proofs_made"] > 1000
    assert got["judged_here"] == [0]
    assert _timeless(got["document"]) == _timeless(serial["document"])
    warm_serial = _audit(tmp_path, cloud.vmlinux, "sw", "serial", cache=str(tmp_path / "s-cache"), **kw)
    warm = _audit(tmp_path, cloud.vmlinux, "pw", cache=str(tmp_path / "p-cache"), **kw)
    assert warm["document"]["counts"]["proofs_made"] == 0
    assert _timeless(warm["document"]) == _timeless(warm_serial["document"])
