"""The false-proof generator and its judges (relocverify selftest): the CI sample, and proof the judges can fail."""

from __future__ import annotations

import io
import json
import platform
import random
import struct

import pytest

from relocverify.cli.main import main
from relocverify.proof.verdict import ProofResult, Verdict
from relocverify.selftest import memory_model, operators, run as selftest_run
from relocverify.selftest.judgement import judge
from relocverify.selftest.operators import AT, TRAMP, Candidate, OPERATORS, jmp

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="the judge runs code on an x86-64 CPU")


def test_every_class_has_an_operator_and_every_operator_a_reason():
    classes = {op.klass for op in OPERATORS}
    assert classes >= set(range(0, 16)), sorted(set(range(16)) - classes)
    assert all(op.what and op.name for op in OPERATORS)
    assert len({op.name for op in OPERATORS}) == len(OPERATORS)


def test_the_ci_sample_finds_no_false_proof():
    """At least 500 pairs with a fresh seed (printed on failure, to replay with --seed)."""
    seed = random.SystemRandom().getrandbits(32)
    out, err = io.StringIO(), io.StringIO()
    code = main(["selftest", "--pairs", "540", "--seed", str(seed), "--json", "--states", "8"], out, err)
    assert out.getvalue(), err.getvalue()
    report = json.loads(out.getvalue())
    assert report["seed"] == seed and report["pairs"] == 540
    assert code == 0 and not report["false_proofs"], (f"replay: relocverify selftest --pairs 540 --seed {seed}",
                                                       report["false_proofs"][:3])
    for name, t in report["operators"].items():
        assert t["generated"] == t["proved"] + t["refuted"] + t["unknown"], name
        assert t["generated"] >= 10, (name, t)
    c = report["controls"]
    assert c["generated"] >= 30 and c["proved"] >= 0.9 * c["generated"], (seed, c)


def _rex_candidate() -> Candidate:
    orig = bytes.fromhex("4801c0")  # add %rax,%rax
    body = bytes.fromhex("486601c0")  # the CPU: add %ax,%ax
    return Candidate("rex-before-legacy", 1, orig, body + jmp(TRAMP + 4, AT + 3))


def test_the_cpu_judge_tells_a_false_relocation_apart_and_a_true_one_not():
    bad = judge(_rex_candidate(), 8, random.Random(1))
    assert bad.differs and ("rax" in bad.how or "rflags" in bad.how), bad.how
    good = Candidate("own-plan", 0, bytes.fromhex("4801c0"), bytes.fromhex("4801c0") + jmp(TRAMP + 3, AT + 3))
    assert not judge(good, 8, random.Random(1)).differs


def test_the_cpu_judge_sees_the_vendor_reading_and_the_faults():
    reloc = bytes.fromhex("4801d8") + jmp(TRAMP + 3, AT + 3)
    amd = Candidate("operand-size-branch", 10, bytes.fromhex("4801d8"), reloc[:3] + b"\x66" + reloc[3:])
    assert judge(amd, 4, random.Random(2)).differs  # AMD (this CPU) truncates RIP; Intel would not
    div = Candidate("dead-divide", 9, bytes.fromhex("90"), bytes.fromhex("48f7f1") + jmp(TRAMP + 3, AT + 1))
    states = judge(div, 16, random.Random(3))
    assert states.differs


def test_the_memory_model_table_tells_ordering_and_tearing_apart():
    assert memory_model.compare(bytes.fromhex("0faef0"), AT, bytes.fromhex("0faee8") + jmp(TRAMP + 3, AT + 3), TRAMP)
    split = bytes.fromhex("8903" "894304") + jmp(TRAMP + 5, AT + 3)
    assert "atomicity" in memory_model.compare(bytes.fromhex("488903"), AT, split, TRAMP)
    same = bytes.fromhex("488903") + jmp(TRAMP + 3, AT + 3)
    assert memory_model.compare(bytes.fromhex("488903"), AT, same, TRAMP) == ""


def test_a_checker_that_proves_everything_is_caught(monkeypatch):
    """Remove the checker (every pair 'proved'): the judges must find false proofs, and the command exits 1."""
    monkeypatch.setattr(selftest_run, "prove_relocation",
                        lambda *a, **k: ProofResult(Verdict.PROVED, "sabotaged", "test"))
    out, err = io.StringIO(), io.StringIO()
    code = main(["selftest", "--pairs", "60", "--seed", "7", "--json", "--jobs", "1", "--operators",
                 "rex-before-legacy,fence-swap,store-split,operand-size-branch,flag-substitution"], out, err)
    report = json.loads(out.getvalue())
    assert code == 1 and len(report["false_proofs"]) >= 20
    found = {fp["operator"] for fp in report["false_proofs"]}
    assert found >= {"rex-before-legacy", "fence-swap", "store-split", "operand-size-branch"}, found
    fp = report["false_proofs"][0]
    assert fp["replay"].startswith("relocverify prove --orig") and fp["difference"]


def test_operators_make_candidates_from_real_shapes():
    rng = random.Random(5)
    shapes = [operators.shape_for(bytes.fromhex(h)) for h in ("488903", "0faef0", "f0ff00", "4801d8", "660f6f00")]
    made = {op.name for op in OPERATORS for s in shapes if s is not None and op.make(s, rng) is not None}
    assert len(made) >= 20, made


def test_a_store_split_candidate_is_a_real_split():
    s = operators.shape_for(bytes.fromhex("488903"))
    c = operators.store_split(s, random.Random(1))
    assert c is not None and c.concurrency and struct.pack("<I", 0)  # built
    assert memory_model.compare(c.orig, c.at, c.reloc, c.tramp, c.tracer_memory)


def test_an_interrupted_map_ends_its_workers_though_they_caught_sigterm():
    """``processes.fork_map`` under the command line's SIGTERM handler (it raises KeyboardInterrupt): the
    workers start with SIGTERM's default action, and the interrupted parent kills the busy ones, so a worker
    that swallows the exception keeps nothing waiting and is not left behind."""
    import os
    import signal
    import threading
    import time

    from relocverify.cli.main import _terminate
    from relocverify.processes import fork_map

    from test_local_pool import _children_alive

    running = set(_children_alive())  # what earlier tests of this process left running
    before = signal.signal(signal.SIGTERM, _terminate)
    try:
        assert fork_map(_sigterm_action, range(2), 2) == [signal.SIG_DFL] * 2
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
        t = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            fork_map(_swallow_interrupts, range(2), 2)
        assert time.monotonic() - t < 10
    finally:
        signal.signal(signal.SIGTERM, before)
    assert not set(_children_alive()) - running


def _sigterm_action(_):
    import signal

    return signal.getsignal(signal.SIGTERM)


def _swallow_interrupts(_=None):
    """A task that goes on through KeyboardInterrupt (what the handler's exception met in a worker)."""
    import time

    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            time.sleep(0.05)
        except KeyboardInterrupt:
            pass
