"""engine.passes: a pass added here, with no change to the scheduler or the run, runs through ``vmlinux`` and
``package``, is resumed after a kill -9, and leaves every verdict as it was."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from relocverify.engine.requests import KernelRequest, PackageRequest
from relocverify.engine.run import RunOptions
from relocverify.engine.verify import verify
from relocverify.image.fetch import fetch
from relocverify.image.functions import find_functions, iter_instruction_spans
from relocverify.image.loader import load_image

from opcode_pass import OpcodeCount
from test_engine import SMALL_ASM, SMALL_LDS, TRAMP

HERE = Path(__file__).resolve().parent


def _options(**kw) -> RunOptions:
    return RunOptions(TRAMP, 2, 10.0, **kw)


def _counted(image) -> Counter:
    """Instructions per mnemonic, counted here without the engine (capstone over the functions' spans)."""
    p = OpcodeCount()
    return Counter(p.compute(raw) for fn in find_functions(image) for _, raw in iter_instruction_spans(image, fn))


def test_a_pass_runs_through_vmlinux_beside_the_verdicts(tmp_path):
    import elfbuild

    path = str(elfbuild.build_elf(tmp_path, SMALL_ASM, SMALL_LDS))
    plain = verify(KernelRequest(path, _options(), str(tmp_path / "plain.sqlite"))).document
    got = verify(KernelRequest(path, _options(passes=(OpcodeCount(),)), str(tmp_path / "p.sqlite"))).document
    section = got["passes"]["opcodes"]
    assert section["instructions"] == got["instructions"] == 19
    assert section["by_opcode"] == dict(sorted(_counted(load_image(path)).items()))
    assert section["functions"] == got["functions"] == 4
    assert "passes" not in plain
    assert {k: v for k, v in got.items() if k not in ("passes", "run", "wall_s", "instructions_per_s")} == \
        {k: v for k, v in plain.items() if k not in ("run", "wall_s", "instructions_per_s")}
    # the same command again is answered from the store, the pass's section included
    again = verify(KernelRequest(path, _options(passes=(OpcodeCount(),)), str(tmp_path / "p.sqlite"))).document
    assert again["passes"] == got["passes"] and again["run"]["verified_now"] == 0


def test_a_pass_runs_through_package(tmp_path):
    summary = verify(PackageRequest("debian-6.1-cloud", _options(limit=40, passes=(OpcodeCount(),)),
                                    str(tmp_path / "k.sqlite"), limit_modules=3))
    images = summary.document["images"]
    assert len(images) == 4
    for name, doc in images.items():
        if doc.get("functions"):
            section = doc["passes"]["opcodes"]
            assert section["functions"] == doc["functions"], name
            assert section["instructions"] >= doc["instructions"], name  # overlapping functions: each counts its own
    kernel = fetch("debian-6.1-cloud")
    vmlinux = load_image(kernel.vmlinux)
    first = find_functions(vmlinux)[:40]
    want = Counter(OpcodeCount().compute(raw) for fn in first for _, raw in iter_instruction_spans(vmlinux, fn))
    assert images["vmlinux"]["passes"]["opcodes"]["by_opcode"] == dict(sorted(want.items()))


SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
from opcode_pass import OpcodeCount
from relocverify.engine.run import RunOptions
from relocverify.engine.requests import KernelRequest
from relocverify.engine.verify import verify
doc = verify(KernelRequest({path!r}, RunOptions({tramp}, 2, 10.0, limit={limit}, passes=(OpcodeCount(),)), {db!r})).document
print(json.dumps({{"by_verdict": doc["by_verdict"], "passes": doc["passes"], "instructions": doc["instructions"]}}))
"""


def _script(db, limit: int) -> list[str]:
    return [sys.executable, "-c", SCRIPT.format(tests=str(HERE), path=fetch("debian-6.1-cloud").vmlinux, tramp=TRAMP,
                                                limit=limit, db=str(db))]


def _pass_rows(db) -> int:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.1)
        try:
            return con.execute("SELECT count(*) FROM pass_rows").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def test_kill_9_in_a_pass_then_rerun_equals_an_uninterrupted_run(tmp_path):
    limit = 1500
    env = dict(os.environ, RV_TEST_PASS_DELAY="0.004")
    whole = json.loads(subprocess.run(_script(tmp_path / "whole.sqlite", limit), capture_output=True, text=True,
                                      check=True).stdout)
    db = tmp_path / "killed.sqlite"
    proc = subprocess.Popen(_script(db, limit), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    t0 = time.monotonic()
    while _pass_rows(db) == 0 and proc.poll() is None and time.monotonic() - t0 < 300:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before the test could kill it in its pass"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = _pass_rows(db)
    assert 0 < done < limit
    again = json.loads(subprocess.run(_script(db, limit), capture_output=True, text=True, check=True).stdout)
    assert again == whole
