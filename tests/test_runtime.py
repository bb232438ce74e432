"""The probe runtime on the real Debian 6.1 cloud kernel, in real unicorn, with the real prover."""

from __future__ import annotations

import argparse
import io
import json
from dataclasses import replace

import pytest

from relocverify.errors import InputError
from relocverify.image.loader import load_image
from relocverify.plan.plan import PlanKind
from relocverify.runtime.args import parse_spec
from relocverify.runtime.differential import (Differential, Execution, first_difference, find_function, interleave, is_leaf,
                                              live_instructions)
from relocverify.runtime.kernel import KernelMachine, parse_cpu_features
from relocverify.runtime.leaf_functions import LEAF_FUNCTIONS
from relocverify.runtime.probes import Enabled, Refused

TRIALS = 8  # per function here; benchmarks/bench_runtime.py runs hundreds


@pytest.fixture(scope="module")
def image(debian_kernels):
    kernel, _ = debian_kernels("debian-6.1-cloud")
    return load_image(kernel.vmlinux)


@pytest.fixture(scope="module")
def diff(image):
    return Differential(image)


def _noop(address, context):
    pass


# -- the function list -----------------------------------------------------------

def test_the_function_list_is_at_least_20_real_leaf_functions(diff, image):
    assert len(LEAF_FUNCTIONS) >= 20
    assert len({f.name for f in LEAF_FUNCTIONS}) == len(LEAF_FUNCTIONS)
    for f in LEAF_FUNCTIONS:
        fn = find_function(image, f.name)
        assert is_leaf(diff.runtime, fn), f.name
        parse_spec(f.spec)


@pytest.mark.parametrize("name,spec", [(f.name, f.spec) for f in LEAF_FUNCTIONS])
def test_every_instruction_probed_gives_the_same_results(diff, name, spec):
    report = diff.run(name, parse_spec(spec), TRIALS, seed=7, probe_all=True)
    assert report.refused == []
    assert report.divergences == [], report.divergences[0]
    assert report.stopped is None
    assert report.trials == TRIALS
    assert report.probes_fired == report.instructions_executed > 0
    assert not any(diff.runtime.is_enabled(i.ip) for i in live_instructions(diff.runtime, find_function(diff.image, name)))


# -- a wrong plan is caught ----------------------------------------------------------

def test_a_deliberately_wrong_plan_diverges_and_is_caught(diff):
    def tamper(runtime, enabled):
        for e in enabled:  # strlen's `add rax, 1` (48 83 c0 01) in the loop: make it add 2
            plan = runtime.plan_of(e.address, 0)
            if plan.kind is PlanKind.COPY and plan.trampoline.startswith(bytes.fromhex("4883c001")):
                runtime.force_plan_for_testing(e.address, 0, replace(plan, trampoline=bytes.fromhex("4883c002")
                                                                     + plan.trampoline[4:]))
                return
        raise AssertionError("strlen has no `add rax, 1` copy plan")

    report = diff.run("strlen", parse_spec("str:64"), 20, seed=1, probe_all=True, replay="relocverify run ...",
                      prepare=tamper)
    assert len(report.divergences) == 1
    d = report.divergences[0]
    assert d.what in ("rax", "rip", "stop") or d.what.startswith(("mem", "executions"))
    assert d.replay.endswith(f"--trials 1 --seed {1 + d.trial}")
    # the probes are gone afterwards, and the same run is clean again
    assert diff.run("strlen", parse_spec("str:64"), 5, seed=1, probe_all=True).divergences == []


def test_the_comparison_reports_the_first_differing_output():
    from relocverify.runtime.probes import Stop
    regs = {r: 0 for r in ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11",
                           "r12", "r13", "r14", "r15", "rip", "rflags")}
    a = Execution(Stop("returned"), regs, {0x10: 1}, {0x1: 2})
    assert first_difference(a, a) is None
    assert first_difference(a, replace(a, registers={**regs, "rdx": 5}))[0] == "rdx"
    assert first_difference(a, replace(a, writes={0x10: 2}))[0] == "mem[0x10]"
    assert first_difference(a, replace(a, counts={0x1: 3}))[0] == "executions of 0x1"
    assert first_difference(a, replace(a, registers={**regs, "rflags": 0x200})) is None  # IF is not compared


# -- enable refuses anything but proved --------------------------------------------

def test_enable_refuses_a_bug_site_with_its_reason(diff):
    site = next(iter(diff.kernel.sites.iter_sites("bug")))
    before = diff.kernel.read(site.address, 2)
    r = diff.runtime.enable(site.address, _noop)
    assert isinstance(r, Refused) and r.verdict == "rejected" and "site bug" in r.reason
    assert diff.kernel.read(site.address, 2) == before and not diff.runtime.is_enabled(site.address)


def test_enable_refuses_a_paravirt_site_as_unknown(diff):
    site = next(iter(diff.kernel.sites.iter_sites("paravirt")))
    r = diff.runtime.enable(site.address, _noop)
    assert isinstance(r, Refused) and r.verdict == "unknown" and "paravirt" in r.reason


def test_enable_refuses_int3_padding_and_a_non_boundary(diff, image):
    fn = find_function(image, "strlen")
    insns = live_instructions(diff.runtime, fn)
    pad = next(i.ip for i in insns if i.len == 1 and diff.kernel.read(i.ip, 1) == b"\xcc")
    r = diff.runtime.enable(pad, _noop)
    assert isinstance(r, Refused) and r.verdict == "rejected" and "int3" in r.reason
    long_one = next(i for i in insns if i.len > 1)
    r = diff.runtime.enable(long_one.ip + 1, _noop)
    assert isinstance(r, Refused) and "instruction boundary" in r.reason


def test_shared_probes_run_every_consumer_and_restore_bytes_with_the_last(diff, image):
    fn = find_function(image, "strlen")
    before = diff.kernel.read(fn.start, 4)
    seen = []
    a, b = (lambda addr, ctx: seen.append("a")), (lambda addr, ctx: seen.append("b"))
    assert isinstance(diff.runtime.enable(fn.start, a), Enabled)
    assert isinstance(diff.runtime.enable(fn.start, b), Enabled)
    assert diff.kernel.read(fn.start, 1) == b"\xcc"
    regs, memory = diff.trial_inputs(parse_spec("str:8"), 3)
    diff.execute(diff.runtime, fn, regs, memory, None)
    assert seen == ["a", "b"]
    diff.runtime.disable(fn.start, a)
    assert diff.kernel.read(fn.start, 1) == b"\xcc"
    diff.runtime.disable(fn.start, b)
    assert diff.kernel.read(fn.start, 4) == before


# -- boot patches: the live variant's verdict ------------------------------------------

def test_a_return_thunk_site_is_probed_as_the_live_ret(diff, image):
    fn = find_function(image, "strlen")
    ret = next(i.ip for i in live_instructions(diff.runtime, fn) if diff.kernel.patches.get(i.ip))
    assert image.read(ret, 1) == b"\xe9"  # jmp __x86_return_thunk on disk
    r = diff.runtime.enable(ret, _noop)
    assert isinstance(r, Enabled) and r.variant == "ret (apply_returns)" and r.length == 1
    assert all(f.klass == "ret" and f.plan_kind == "emulate" for f in r.findings)
    diff.runtime.disable(ret)


def test_a_fentry_site_is_probed_as_the_live_nop5(diff):
    site = next(iter(diff.kernel.sites.iter_sites("fentry")))
    r = diff.runtime.enable(site.address, _noop)
    assert isinstance(r, Enabled) and r.variant == "nop5 (ftrace off)"
    assert all(f.klass == "nop" and f.plan_kind == "copy" for f in r.findings)
    diff.runtime.disable(site.address)


def test_cpu_features_choose_what_boot_patching_writes(image, diff):
    with_rethunk = KernelMachine(image, parse_cpu_features("default,RETHUNK,RETPOLINE"), sites=diff.kernel.sites)
    fn = find_function(image, "strlen")
    ret = next(i.ip for i in live_instructions(diff.runtime, fn) if diff.kernel.patches.get(i.ip))
    assert with_rethunk.read(ret, 1) == b"\xe9" and ret not in with_rethunk.patches
    kinds = {p.kind for p in with_rethunk.patches.values()}
    assert "return_thunk" not in kinds and "retpoline" not in kinds and "fentry" in kinds
    with pytest.raises(InputError, match="unknown feature"):
        parse_cpu_features("AVX9000")


# -- two contexts --------------------------------------------------------------------

def _threads(diff, name, spec, seeds):
    fn = find_function(diff.image, name)
    out = []
    for i, seed in enumerate(seeds):
        regs, memory = diff.trial_inputs(parse_spec(spec), seed, context=i)
        for addr, data in memory.items():
            diff.runtime.write_memory(addr, data)
        out.append(diff.runtime.start(diff.kernel.contexts[i], fn.start, regs))
    return out


@pytest.mark.parametrize("name,spec", [("strncpy", "buf:64,str:32,u64:0-64"), ("xxh64", "buf:64,u64:0-64,u64"),
                                       ("gcd", "u64:1-1000000,u64:1-1000000")])
def test_two_contexts_interleaved_at_every_instruction_match_one_after_the_other(diff, name, spec):
    fn = find_function(diff.image, name)
    enabled, refused = diff.probe(fn, probe_all=True)
    assert not refused
    try:
        for seeds in ((1, 2), (3, 4)):
            threads = _threads(diff, name, spec, seeds)
            stops = [diff.runtime.run(t, 100_000) for t in threads]
            one_after_other = ([t.regs for t in threads], diff.runtime.written(), stops)
            diff.runtime.rollback()
            threads = _threads(diff, name, spec, seeds)
            stops = interleave(diff.runtime, threads, 100_000)
            interleaved = ([t.regs for t in threads], diff.runtime.written(), stops)
            diff.runtime.rollback()
            assert all(s.ok for s in stops)
            assert interleaved == one_after_other
    finally:
        diff.unprobe(enabled)


def test_disable_while_a_context_is_inside_an_emulated_call(diff, image):
    """strim calls strlen through an emulated call: disabling every probe while the context is in
    strlen leaves a return address in the original text, and the call finishes as unprobed."""
    strim, strlen = find_function(image, "strim"), find_function(image, "strlen")
    regs, memory = diff.trial_inputs(parse_spec("str:32"), 11)
    reference = diff.execute(diff.ref_runtime, strim, regs, memory, None)
    enabled, refused = diff.probe(strim, probe_all=True)
    assert not refused
    (t,) = _threads(diff, "strim", "str:32", (11,))
    while not strlen.start <= t.regs["rip"] < strlen.end:
        assert diff.runtime.step(t, 10_000) is None
    diff.unprobe(enabled)
    assert diff.runtime.run(t, 10_000).ok
    written = diff.runtime.written()
    diff.runtime.rollback()
    assert t.regs["rax"] == reference.registers["rax"] and written == reference.writes


# -- bad input ----------------------------------------------------------------------------

def test_a_runaway_loop_and_an_unmapped_access_are_stops_not_hangs(diff):
    budget, diff.budget = diff.budget, 50
    try:
        report = diff.run("strlen", parse_spec("str:64"), 20, seed=0, probe_all=True)
    finally:
        diff.budget = budget
    assert report.stopped and "runaway loop" in report.stopped and not report.divergences
    report = diff.run("strlen", parse_spec("u64"), 3, seed=0, probe_all=True)
    assert report.stopped and "unmapped read" in report.stopped and not report.divergences


@pytest.mark.parametrize("spec,message", [("u65", "is not u64"), ("str", "str:N"), ("u64:5-1", "LO <= HI"),
                                          ("buf:1,buf:1,buf:1,buf:1,buf:1,buf:1,buf:1", "at most 6"),
                                          ("buf:0x", "number")])
def test_bad_specs_are_input_errors(spec, message):
    with pytest.raises(InputError, match=message):
        parse_spec(spec)


def _cli(*argv):
    from relocverify.cli.main import build_parser

    p = build_parser()  # the real command line, with its typed arguments
    args = p.parse_args(["run", *argv])
    out = io.StringIO()
    return args.func(args, out), out.getvalue()


def test_cli_unknown_function_and_bad_spec_exit_2(debian_kernels):
    kernel, _ = debian_kernels("debian-6.1-cloud")
    with pytest.raises(InputError, match="no function named"):
        _cli("--image", str(kernel.vmlinux), "--function", "no_such_function", "--args", "u64")
    with pytest.raises(InputError, match="--args"):
        _cli("--image", str(kernel.vmlinux), "--function", "strlen", "--args", "ptr:8")


@pytest.mark.slow
def test_cli_json_report(debian_kernels):
    kernel, _ = debian_kernels("debian-6.1-cloud")
    code, out = _cli("--image", str(kernel.vmlinux), "--function", "gcd", "--args", "u64:1-99,u64:1-99",
                     "--trials", "20", "--probe-all", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["divergences"] == 0 and doc["trials"] == 20 and doc["refused"] == []
    assert doc["probes_fired"] == doc["instructions_executed"] > 0
    code, out = _cli("--image", str(kernel.vmlinux), "--function", "strlen", "--args", "u64", "--trials", "2")
    assert code == 3 and "unmapped read" in out


@pytest.mark.slow
def test_cli_on_a_stripped_image_with_system_map(debian_kernels):
    kernel, stripped = debian_kernels("debian-6.1-cloud")
    code, out = _cli("--image", stripped, "--system-map", str(kernel.system_map), "--function", "xxh64",
                     "--args", "buf:64,u64:0-64,u64", "--trials", "20", "--probe-all")
    assert code == 0 and "0 divergences" in out and "0 refused" in out


@pytest.mark.slow
def test_verdicts_by_address_from_a_store(image, diff, tmp_path):
    """A store's verdict first (the weakest over every variant), then the checker per trampoline."""
    from relocverify.engine.run import RunOptions, run
    from relocverify.runtime.probes import ProbeRuntime
    from relocverify.runtime.verdicts import StoreVerdicts
    from relocverify.store.store import Results

    db = str(tmp_path / "store.sqlite")
    run(image, db, RunOptions(0xFFFFFFFFC0001000, 1, 10.0, limit=12, with_sites=True, cache_dir=None))
    store = Results(db)
    image_id = store.find_image(image.identity)
    rows = list(store.iter_rows(image_id))
    kernel = KernelMachine(image, sites=diff.kernel.sites)
    runtime = ProbeRuntime(kernel, StoreVerdicts(kernel.sites, store, image_id))
    weak = [(r, runtime.enable(r.address, _noop)) for r in rows if r.verdict in ("opaque", "unknown", "rejected")]
    assert all(isinstance(got, Refused) for _, got in weak)
    stored = [(r, got) for r, got in weak if "stored: " in got.reason]  # the others: not in a sized function
    assert stored and all(got.verdict == r.verdict for r, got in stored)
    sized = {s.name for s in image.symbols if s.kind == "func" and s.size}
    proved = [runtime.enable(r.address, _noop) for r in rows if r.verdict == "proved" and r.function in sized][:40]
    assert proved and all(isinstance(p, Enabled) for p in proved)
    absent = runtime.enable(find_function(image, "strlen").start, _noop)
    assert isinstance(absent, Refused) and "the store has no instruction" in absent.reason
