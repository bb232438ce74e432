"""schedule.smt_helper: a cold run's SMT checks answered by a process of their own.

The check asked of the helper is the same call a worker would make; these tests hold its answers to the
local ones, and show what happens when the helper is gone, slow, or its parent dies."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from relocverify.engine import pipeline
from relocverify.schedule import smt_helper
from relocverify.proof.prove import prove_relocation
from relocverify.proof.verdict import Verdict
from relocverify.x86.decode import decode
from relocverify.x86.encoding import jump

A = 0xFFFFFFFF81234560
T = 0xFFFFFFFFC0001000


def _relocated(body: str, orig_len: int) -> bytes:
    """``body`` at T, then a jump back to A + ``orig_len``."""
    code = bytes.fromhex(body)
    return code + jump(T + len(code), A + orig_len)


#: Relocations the fast path cannot decide, so ``check_by_smt`` answers: wrong ones it refutes with a
#: counterexample unicorn confirms, and one it can neither prove nor refute.
CASES = [
    ("mov rip-rel copied verbatim", "48 8b 05 10 00 00 00", "48 8b 05 10 00 00 00", Verdict.REFUTED),
    ("add rewritten as sub", "48 01 d8", "48 29 d8", Verdict.REFUTED),
    ("cmp rewritten as test", "48 39 d8", "48 85 d8", Verdict.REFUTED),
    ("bt with a helper's scratch store", "48 0f a3 c3", "48 0f a3 c3", None),
]


@pytest.fixture
def helper():
    h = smt_helper.SmtHelper(pipeline.WATCHDOG_MARGIN_S)
    assert h.wait_listening()
    yield h
    h.close()


def _answer(orig: str, body: str, smt=None):
    raw = bytes.fromhex(orig)
    result = prove_relocation(decode(raw, A), _relocated(body, len(raw)), T, smt=smt)
    cex = result.counterexample
    return result.verdict, result.method, cex is not None and cex.replayed


@pytest.mark.parametrize("name,orig,body,verdict", CASES, ids=[c[0] for c in CASES])
def test_the_helper_answers_as_a_check_made_here(helper, name, orig, body, verdict):
    here = _answer(orig, body)
    checker = smt_helper.helper_checker(helper.address)
    assert checker is not None and smt_helper.helper_checker(None) is None
    there = _answer(orig, body, checker)
    assert there == here
    if verdict is not None:
        assert here[0] is verdict and here[2], "a wrong relocation is refuted by a replayed counterexample"


def test_without_the_helper_a_worker_checks_itself(monkeypatch):
    checker = smt_helper.helper_checker("\0relocverify-smt-nobody-listens")
    assert _answer(*CASES[1][1:3], checker)[0] is Verdict.REFUTED


def test_a_watchdog_between_a_check_and_its_answer_loses_no_later_answer(monkeypatch):
    """The worker's watchdog fires while the helper still works: the worker times out, and its next check
    gets its own answer, not the late one."""
    from relocverify.proof import smt_check

    real = smt_check.check_by_smt

    def slow(*args):
        time.sleep(1.0)
        return real(*args)

    monkeypatch.setattr(smt_check, "check_by_smt", slow)  # the helper, forked next, inherits it
    h = smt_helper.SmtHelper(pipeline.WATCHDOG_MARGIN_S)
    try:
        assert h.wait_listening()
        client = smt_helper.SmtClient(h.address)
        raw = bytes.fromhex(CASES[1][1])
        decoded, code = decode(raw, A), _relocated(CASES[1][2], len(raw))
        with pytest.raises(pipeline.ProofTimeout):
            with pipeline.watchdog(0.2):
                prove_relocation(decoded, code, T, smt=client.check)
        other = bytes.fromhex(CASES[2][1])
        result = prove_relocation(decode(other, A), _relocated(CASES[2][2], len(other)), T, smt=client.check)
        assert result.verdict is Verdict.REFUTED and result.counterexample.orig_hex == other.hex()
    finally:
        h.close()


def test_the_helper_leaves_with_its_parent(tmp_path):
    """A parent killed without closing its session (SIGKILL) leaves no helper behind."""
    pid = _helper_of_a_killed_parent(tmp_path, "")
    assert _gone_within(pid, 10), "the helper outlived its parent"


def test_the_helper_leaves_with_its_parent_while_it_imports(tmp_path):
    """The same while the helper still imports the check (the import made 30 s long): the kernel kills it
    with its parent (``smt_helper._die_with``); it used to finish its import first (seconds on a loaded
    machine with a cold page cache, more than CI's patience once)."""
    slow = ("class Slow:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'relocverify.proof.smt_check':\n"
            "            time.sleep(30)\n"
            "sys.meta_path.insert(0, Slow())\n")
    pid = _helper_of_a_killed_parent(tmp_path, slow, settle=0.5)  # the helper is in its import by then
    assert _gone_within(pid, 5), "the helper outlived its parent"


def _helper_of_a_killed_parent(tmp_path, preamble: str, settle: float = 0.0) -> int:
    """The pid of the helper of a parent (running ``preamble`` first) killed with SIGKILL ``settle`` seconds
    after its helper listens; the helper was alive then."""
    script = tmp_path / "parent.py"
    script.write_text("import os, sys, time\n" + preamble +
                      "from relocverify.schedule.smt_helper import SmtHelper\n"
                      "h = SmtHelper(0.5)\n"
                      "h.wait_listening()\n"
                      "print(h.process.pid, flush=True)\n"
                      "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    time.sleep(settle)
    assert os.path.exists(f"/proc/{pid}") and _state(pid) != "Z"
    parent.kill()
    parent.wait()
    return pid


def _gone_within(pid: int, seconds: float) -> bool:
    """Whether the process ends (or is a zombie) within ``seconds``."""
    deadline = time.time() + seconds
    while time.time() < deadline and os.path.exists(f"/proc/{pid}") and _state(pid) != "Z":
        time.sleep(0.05)
    return not os.path.exists(f"/proc/{pid}") or _state(pid) == "Z"


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_the_helpers_first_work_comes_back_or_is_left_to_the_caller():
    """``first``: what the helper does before its import; its value comes back once, and a call that raised,
    or a helper without one, gives None (the caller does the work itself)."""
    done = smt_helper.SmtHelper(pipeline.WATCHDOG_MARGIN_S, lambda: b"sites" * 1000)
    failed = smt_helper.SmtHelper(pipeline.WATCHDOG_MARGIN_S, lambda: 1 // 0)
    none = smt_helper.SmtHelper(pipeline.WATCHDOG_MARGIN_S)
    try:
        assert done.first_value() == b"sites" * 1000
        assert done.first_value() is None  # handed over once
        assert failed.first_value() is None
        assert none.first_value() is None
        assert done.wait_listening() and failed.wait_listening()
    finally:
        for h in (done, failed, none):
            h.close()


def test_a_helper_ended_at_once_ends_quietly(tmp_path):
    """A run that fails at once (a busy store) ends the helper it has just forked: the helper, forked with SIGTERM
    held until it has its own handlers, never meets the command line's handler (which raises KeyboardInterrupt,
    and printed a traceback from the helper)."""
    script = tmp_path / "parent.py"
    script.write_text("import signal\n"
                      "from relocverify.schedule.smt_helper import SmtHelper\n"
                      "def _terminate(signum, frame):\n"
                      "    raise KeyboardInterrupt\n"
                      "signal.signal(signal.SIGTERM, _terminate)  # as relocverify.cli.main installs it\n"
                      "codes = []\n"
                      "for _ in range(25):\n"
                      "    h = SmtHelper(0.5, lambda: b'x')\n"
                      "    h.close()\n"
                      "    codes.append(h.process.exitcode)\n"
                      "print(sorted(set(codes)))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr
