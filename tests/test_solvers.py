"""proof.solvers.unsatisfiable: the kept solver's scopes, held to a fresh claripy solver's answers.

Every check runs in a scope of one kept solver, so a constraint that outlived its check would make every later
check of the thread unsatisfiable: a false proof.  These tests interleave contradictions with satisfiable
questions, on the main thread, in threads (claripy's z3 backend keeps a context per thread) and in a forked
child, and compare each answer with a fresh claripy solver's."""

from __future__ import annotations

import os
import threading

import claripy
from hypothesis import given, settings
from hypothesis import strategies as st

from relocverify.proof.solvers import timed_solver, unsatisfiable


def _fresh_unsat(constraints) -> bool:
    solver = timed_solver(10_000)
    for c in constraints:
        solver.add(c)
    return not solver.satisfiable()


def test_a_contradiction_does_not_outlive_its_check():
    x = claripy.BVS("x", 64)
    assert unsatisfiable([x == 1, x == 2], 10_000)
    assert not unsatisfiable([x == 1], 10_000)
    assert not unsatisfiable([x == 2], 10_000)
    assert unsatisfiable([claripy.BoolV(False)], 10_000)
    assert not unsatisfiable([claripy.BoolV(True)], 10_000)
    assert not unsatisfiable([], 10_000)
    assert not unsatisfiable([True], 10_000)  # no expression: claripy's to answer
    assert unsatisfiable([x == 1, False], 10_000) and not unsatisfiable([x == 1, True], 10_000)


def test_a_timeout_is_not_an_answer():
    """A check the solver gives up on (unknown) is not called unsatisfiable: a multiplication a 1 ms limit does
    not let z3 invert."""
    a, b = claripy.BVS("a", 64), claripy.BVS("b", 64)
    hard = [a * b == 0x9E3779B97F4A7C15, a > 1, b > 1, a < b]
    assert not unsatisfiable(hard, 1)


_OPS = st.sampled_from(["eq", "ne", "ult", "uge"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_OPS, st.integers(0, 7), st.integers(0, 255)), min_size=1, max_size=5))
def test_answers_equal_a_fresh_solvers(spec):
    """Random conjunctions over two 8-bit inputs, many of them contradictions, each answered as a fresh claripy
    solver answers it, one after another on the same kept solver."""
    x, y = claripy.BVS("x", 8), claripy.BVS("y", 8)
    ops = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "ult": claripy.ULT, "uge": claripy.UGE}
    constraints = [ops[op]((x if k & 1 else y) + (k >> 1), v) for op, k, v in spec]
    assert unsatisfiable(constraints, 10_000) == _fresh_unsat(constraints)


def test_threads_and_a_forked_child_have_solvers_of_their_own():
    x = claripy.BVS("x", 32)
    results = []

    def ask():
        results.append((unsatisfiable([x == 1, x == 2], 10_000), unsatisfiable([x == 3], 10_000)))

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [(True, False)] * 3
    assert unsatisfiable([x == 1, x == 2], 10_000)
    pid = os.fork()
    if pid == 0:
        ok = unsatisfiable([x == 5, x == 6], 10_000) and not unsatisfiable([x == 5], 10_000)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not unsatisfiable([x == 7], 10_000)
