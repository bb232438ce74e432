"""Modules a run's parent process or a quick command imports stay light: no lifter (angr, pyvex) comes with
them.  ``proof.precondition`` once imported ``proof.smt`` for its timed solver, which brought angr into every
run's parent: 92 MB more peak memory on a whole-kernel run, with no test to say so."""

from __future__ import annotations

import subprocess
import sys

import pytest

LIGHT = ("relocverify.proof.precondition", "relocverify.proof.solvers", "relocverify.plan.plan",
         "relocverify.store.store", "relocverify.cli.main", "relocverify.engine.run", "relocverify.engine.verify",
         "relocverify.report.data")
HEAVY = ("angr", "pyvex")


@pytest.mark.parametrize("module", LIGHT)
def test_a_light_module_brings_no_lifter(module):
    code = f"import sys, {module}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"importing {module} imports {out}"


def test_the_check_can_fail():
    code = "import sys, relocverify.proof.smt; print('angr' in sys.modules or 'pyvex' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "True"
