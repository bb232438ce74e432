"""Jump probes on the real Debian 6.1 cloud kernel, patched by the cross-modifying-code protocol
while a second context runs the probed function: every interleaving point of a call against
every step, checked for torn instructions and against an unprobed run."""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass

import iced_x86
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from unicorn import UC_HOOK_CODE

from relocverify.image.loader import load_image
from relocverify.proof.verdict import Verdict
from relocverify.runtime.args import parse_spec
from relocverify.runtime.differential import Execution, find_function, first_difference, live_instructions
from relocverify.runtime.jump_probes import (Deferred, Interleaving, JumpDifferential, JumpEnabled, JumpRefused,
                                             Patch, PatchStep, jump_summary_lines)

#: (function, SPEC, seed, full sweeps, sampled stops): short inputs, so that every fetch index of a
#: call can be a stop point at ``full sweeps`` probe points; the other points stop around the first
#: ``sampled stops`` fetches of their range and at as many random fetches.
FUNCTIONS = [("strlen", "str:6", 3, 3, 6), ("gcd", "u64:1-60,u64:1-60", 5, 3, 6), ("__sw_hweight64", "u64", 1, 3, 6),
             ("memcmp", "buf:6,buf:6,u64:0-6", 2, 3, 6), ("xxh64", "buf:64,u64:0-12,u64", 4, 0, 2)]


@pytest.fixture(scope="module")
def image(debian_kernels):
    kernel, _ = debian_kernels("debian-6.1-cloud")
    return load_image(kernel.vmlinux)


@pytest.fixture(scope="module")
def jd(image):
    return JumpDifferential(image)  # the real plan.block, proof.block and kernel.patch_range


def _noop(address, context):
    pass


# -- the reference: an unprobed call on context 1, every fetch in the function's text -----------

@dataclass
class Reference:
    execution: Execution
    trace: list[int]  # every fetch in the function's text, in order

    def executions(self, address: int) -> int:
        return self.trace.count(address)  # no rep string instruction in these functions


def _inputs(jd, spec, seed, context=1):
    return jd.trial_inputs(parse_spec(spec), seed, context=context)


def _reference(jd, fn, spec, seed, context=1) -> Reference:
    rt = jd.ref_runtime
    regs, memory = _inputs(jd, spec, seed, context)
    for a, data in memory.items():
        rt.write_memory(a, data)
    trace: list[int] = []
    hook = rt.uc.hook_add(UC_HOOK_CODE, lambda uc, a, n, d: trace.append(a), begin=fn.start, end=fn.end - 1)
    try:
        t = rt.start(jd.reference.contexts[context], fn.start, regs)
        stop = rt.run(t, jd.budget)
    finally:
        rt.uc.hook_del(hook)
    out = Execution(stop, dict(t.regs), rt.written(), {})
    rt.rollback()
    assert stop.ok, stop
    return Reference(out, trace)


# -- one interleaving ---------------------------------------------------------------------------

@dataclass
class Outcome:
    torn: list
    execution: Execution
    callbacks: int
    head_fetches: Counter
    deferrals: int
    stop: object


def _interleave(jd, fn, spec, seed, address, direction, s, k, steps=None, in_trampoline=False, gap=1) -> Outcome:
    """A call on context 1, stopped before its k-th fetch in ``fn`` (and in the probe's trampoline,
    with ``in_trampoline``); step ``s`` of the ``direction`` protocol is applied there (steps before
    it before the call starts), each later step ``gap`` fetches later (0: at once, a patcher faster
    than the context; a deferred sync still lets the call run one fetch); then the call runs to
    its end."""
    rt = jd.runtime
    calls = []
    cb = lambda a, ctx: calls.append((a, ctx.index))  # noqa: E731
    if direction == "disable":
        assert isinstance(rt.enable_jump(address, cb), JumpEnabled)
        patch = rt.begin_disable(address)
    else:
        patch = rt.begin_enable(address, cb)
        assert isinstance(patch, Patch)
    if steps is not None:
        patch.steps = steps
    for _ in range(s):
        assert not isinstance(rt.apply_step(patch), Deferred)  # no call in flight yet
    regs, memory = _inputs(jd, spec, seed)
    for a, data in memory.items():
        rt.write_memory(a, data)
    t = rt.start(jd.kernel.contexts[1], fn.start, regs)
    il = Interleaving(rt, fn, patch.probe, t, budget=jd.budget, in_trampoline=in_trampoline)
    il.applied += [f"{direction} {st.kind}" for st in patch.steps[:s]]
    try:
        il.run_until(k)
        while not patch.done:
            il.advance(patch)
            if gap:
                il.run_until(il.fetched + gap)
        stop = il.run_until(None)
    finally:
        il.close()
    got = Execution(stop, dict(t.regs), rt.written(), {})
    rt.rollback()
    if direction == "enable" and rt.jump_at(address) is not None:
        rt.disable_jump(address)
    assert rt.jump_at(address) is None
    return Outcome(il.torn, got, len(calls), il.fetches_at_head, il.deferrals, stop)


def _points(jd, fn) -> tuple[list[int], Counter]:
    """Every instruction of ``fn`` where a jump probe is planned, proved and safe; refusals by key."""
    points, refused = [], Counter()
    for ins in live_instructions(jd.runtime, fn):
        if ins.code == iced_x86.Code.INT3:
            continue
        got = jd.runtime.enable_jump(ins.ip, _noop)
        if isinstance(got, JumpEnabled):
            points.append(ins.ip)
            jd.runtime.disable_jump(ins.ip)
        else:
            refused[got.key] += 1
    return points, refused


STATS: Counter = Counter()
#: (direction, the step applied at the stop point, fetches between the later steps)
SCHEDULES = [(d, s, gap) for d in ("enable", "disable") for gap in (1, 0) for s in range(5 if gap else 3)]


@pytest.mark.parametrize("name,spec,seed,full_sweeps,sampled", FUNCTIONS)
def test_every_interleaving_of_the_protocol_is_untorn_and_changes_no_result(jd, image, name, spec, seed, full_sweeps,
                                                                            sampled):
    fn = find_function(image, name)
    ref = _reference(jd, fn, spec, seed)
    points, refused = _points(jd, fn)
    executed = [a for a in points if ref.executions(a)]
    assert len(executed) >= 5, (name, points, refused)
    rng = random.Random(name)  # the same sample every session
    full = set(rng.sample(executed, min(full_sweeps, len(executed))))
    n = len(ref.trace)
    t0 = time.time()
    for address in points:
        if address in full:  # every fetch, in the text and in the trampoline
            stops = range(n + 2 + ref.executions(address) * 4)
        elif ref.executions(address):  # around the first fetches of the range, and a few others
            near = [i for i, a in enumerate(ref.trace) if address <= a < address + 15]
            stops = sorted(set(near[:sampled] + [max(i - 1, 0) for i in near[:sampled]]
                               + rng.sample(range(n + 1), min(sampled, n + 1))))
        else:  # not run by this call: the protocol must still leave its results alone
            stops = [rng.randrange(n + 1)]
        schedules = SCHEDULES if ref.executions(address) else [("enable", 0, 0), ("disable", 0, 0)]
        for direction, s, gap in schedules:
            for k in stops:
                out = _interleave(jd, fn, spec, seed, address, direction, s, k, in_trampoline=address in full,
                                  gap=gap)
                where = f"{name} probe {address:#x}, {direction} step {s} at fetch {k}, then every {gap}"
                assert out.torn == [], f"{where}: {out.torn[0]}"
                assert out.stop.ok, f"{where}: {out.stop}"
                diff = first_difference(ref.execution, out.execution)
                assert diff is None, f"{where}: {diff}"
                hits = out.head_fetches["int3"] + out.head_fetches["jmp"]
                assert out.callbacks == hits, f"{where}: {out.callbacks} callbacks for {hits} hits"
                assert sum(out.head_fetches.values()) == ref.executions(address), where
                STATS["interleavings"] += 1
                STATS["deferrals"] += out.deferrals
                STATS["hits"] += hits
        STATS["points"] += 1
        STATS["full sweeps"] += address in full
    STATS[f"{name} seconds"] += round(time.time() - t0, 1)
    print(f"\n{name}: {len(points)} jump points ({len(executed)} executed), refused {dict(refused)}; {dict(STATS)}")


def test_the_protocol_is_five_explicit_steps_and_disable_restores_every_byte(jd, image):
    fn = find_function(image, "__sw_hweight64")
    address = _points(jd, fn)[0][0]
    rt = jd.runtime
    before = jd.kernel.read(address, 16)
    patch = rt.begin_enable(address, _noop)
    probe = patch.probe
    assert [st.kind for st in patch.steps] == ["int3", "sync", "tail", "sync", "head"]
    assert patch.steps[0].writes == ((address, b"\xcc"),) and patch.steps[4].writes == ((address, b"\xe9"),)
    assert patch.steps[2].writes == ((address + 1, probe.jump[1:] + b"\xcc" * (probe.length - 5)),)
    assert jd.kernel.read(address, 16) == before  # nothing in the text before the first step
    seen = []
    for i in range(5):
        rt.apply_step(patch)
        seen.append(jd.kernel.read(address, probe.length))
    assert seen[0][:1] == b"\xcc" and seen[0][1:] == before[1:probe.length]
    assert seen[2][:1] == b"\xcc" and seen[2][1:5] == probe.jump[1:]
    assert seen[4][:5] == probe.jump and rt.jump_at(address).state == "enabled"
    assert rt.read_live(address, 16) == before
    # an int3 probe inside the range is refused; one at A shares the jump probe's callbacks
    inside = probe.boundaries[1] if len(probe.boundaries) > 1 else None
    if inside is not None:
        assert "inside the jump probe" in rt.enable(inside, _noop).reason
    other = lambda a, c: None  # noqa: E731
    rt.enable(address, other)
    rt.disable(address, other)
    assert jd.kernel.read(address, 5) == probe.jump  # the first consumer still holds it
    off = rt.begin_disable(address)
    assert [st.kind for st in off.steps] == ["int3", "sync", "tail", "sync", "head"]
    assert rt.finish(off) is off and rt.jump_at(address) is None
    assert jd.kernel.read(address, 16) == before and not rt.is_enabled(address)


@pytest.mark.parametrize("name,spec,seeds", [("__sw_hweight64", "u64", (1, 2)),
                                             ("memcmp", "buf:6,buf:6,u64:0-6", (2, 9))])
def test_two_contexts_in_the_function_while_a_probe_is_enabled_and_disabled(jd, image, name, spec, seeds):
    """Both contexts run the function one fetch at a time, the second started ``delay`` fetches
    later; after every round the patcher tries its next step (enable, then disable)."""
    fn = find_function(image, name)
    refs = [_reference(jd, fn, spec, seed, context=i) for i, seed in enumerate(seeds)]
    rt = jd.runtime
    points = [a for a in _points(jd, fn)[0] if refs[0].executions(a) and refs[1].executions(a)][:4]
    assert points
    runs = 0
    for address in points:
        for delay in range(0, 10):
            calls = []
            patch = rt.begin_enable(address, lambda a, ctx: calls.append(ctx.index))
            threads, ils = [], []
            for i, seed in enumerate(seeds):
                regs, memory = _inputs(jd, spec, seed, i)
                for a, data in memory.items():
                    rt.write_memory(a, data)
                threads.append(rt.start(jd.kernel.contexts[i], fn.start, regs))
                ils.append(Interleaving(rt, fn, patch.probe, threads[-1]))
            try:
                ils[0].run_until(delay)
                while any(t.stop is None for t in threads) or not patch.done:
                    for il in ils:
                        if il.thread.stop is None:
                            il.run_until(il.fetched + 1)
                    if not patch.done:
                        rt.apply_step(patch)  # a deferred sync is tried again next round
                    elif patch.direction == "enable":
                        patch = rt.begin_disable(address)
            finally:
                for il in ils:
                    il.close()
            written = rt.written()
            rt.rollback()
            assert rt.jump_at(address) is None
            for il, ref in zip(ils, refs):
                assert il.torn == [], il.torn[0]
                registers_only = Execution(ref.execution.stop, ref.execution.registers, {}, {})
                got = Execution(il.thread.stop, dict(il.thread.regs), {}, {})
                assert first_difference(registers_only, got) is None, first_difference(registers_only, got)
                assert sum(il.fetches_at_head.values()) == ref.executions(address)
            assert written == {**refs[0].execution.writes, **refs[1].execution.writes}
            assert len(calls) == sum(il.fetches_at_head["int3"] + il.fetches_at_head["jmp"] for il in ils)
            runs += 1
    print(f"\n{name}: {runs} two-context runs over {len(points)} points")


# -- the checker can fail ------------------------------------------------------------------------

def _a_point_with_two_instructions(jd, image, name="strlen", spec="str:6", seed=3):
    fn = find_function(image, name)
    ref = _reference(jd, fn, spec, seed)
    for address in _points(jd, fn)[0]:
        patch = jd.runtime.begin_enable(address, _noop)
        probe = patch.probe
        jd.runtime.finish(patch)
        jd.runtime.disable_jump(address)
        inside = [i for i, a in enumerate(ref.trace) if probe.address < a < probe.end]
        first = [i for i, a in enumerate(ref.trace) if a == probe.address]
        if len(probe.boundaries) >= 2 and inside and first:
            return fn, spec, seed, probe, ref, first[0], inside[0]
    raise AssertionError(f"{name}: no executed jump point of two instructions")


def test_head_before_tail_is_caught_as_torn(jd, image):
    fn, spec, seed, probe, ref, at_head, _ = _a_point_with_two_instructions(jd, image)
    right = probe.enable_steps()
    wrong = (right[0], right[1], right[4], right[3], right[2])  # int3, sync, head, sync, tail
    out = _interleave(jd, fn, spec, seed, probe.address, "enable", 2, at_head, steps=wrong)
    assert out.torn, "a jmp with the original bytes as its rel32 went unnoticed"
    torn = out.torn[0]
    assert torn.address == probe.address and torn.fetched[:1] == b"\xe9" and torn.fetched != probe.jump
    assert "enable head" in torn.step and "enable tail" not in torn.step and torn.context == 1


def test_a_tail_written_without_sync_over_a_context_inside_the_range_is_torn(jd, image):
    fn, spec, seed, probe, ref, _, inside = _a_point_with_two_instructions(jd, image)
    rt = jd.runtime
    # with the protocol's sync, the same point defers
    patch = rt.begin_enable(probe.address, _noop)
    regs, memory = _inputs(jd, spec, seed)
    for a, data in memory.items():
        rt.write_memory(a, data)
    t = rt.start(jd.kernel.contexts[1], fn.start, regs)
    il = Interleaving(rt, fn, probe, t)
    try:
        il.run_until(inside)
        assert probe.address < t.regs["rip"] < probe.end
        assert isinstance(rt.apply_step(patch), PatchStep)  # int3
        deferred = rt.apply_step(patch)
        assert isinstance(deferred, Deferred) and deferred.contexts == (1,) and patch.next == 1
        # skip the sync: the tail lands under the context's feet
        patch.steps = patch.steps[:1] + patch.steps[2:]
        assert rt.apply_step(patch).kind == "tail"
        il.applied += ["enable int3", "enable tail (no sync)"]
        il.run_until(il.fetched + 1)
    finally:
        il.close()
        rt.rollback()
        rt.finish(patch)
        rt.disable_jump(probe.address)
    assert il.torn and il.torn[0].address == ref.trace[inside]
    assert il.torn[0].context == 1 and "tail" in il.torn[0].step
    assert il.torn[0].fetched not in il.torn[0].allowed


def test_the_single_instruction_plan_in_the_window_would_tear_so_the_trap_jumps_to_the_trampoline(
        jd, image, monkeypatch):
    """While the int3 is at A, a hit that ran A's own single-instruction plan would come back at
    A+len(A), inside the range, where the tail is about to land (the sync before the tail cannot
    help: the context enters after it).  The runtime's trap emulates the new jmp instead
    (text_poke_bp); the same schedule with the single-instruction plan is torn."""
    from relocverify.plan.plan import make_plan
    from relocverify.runtime.probes import ProbeRuntime
    from relocverify.x86.decode import decode

    fn, spec, seed, probe, ref, at_head, _ = _a_point_with_two_instructions(jd, image)
    rt = jd.runtime
    clean = _interleave(jd, fn, spec, seed, probe.address, "enable", 1, at_head)
    assert clean.torn == [] and first_difference(ref.execution, clean.execution) is None

    def single_instruction(t, address):
        p = rt._probes[address]
        if not p.plans:  # copy/rewrite plans of A alone, per context (the int3 probe's)
            p.plans[:] = [make_plan(decode(p.raw, address), c.tramp) for c in rt.kernel.contexts]
        ProbeRuntime._handle(rt, t, address)

    monkeypatch.setattr(rt, "_handle", single_instruction)
    torn = _interleave(jd, fn, spec, seed, probe.address, "enable", 1, at_head)
    assert torn.torn and torn.torn[0].address == probe.boundaries[1] and "tail" in torn.torn[0].step


def test_a_wrong_trampoline_is_caught_by_the_differential(jd, image):
    """The comparison with the unprobed run can fail: the first relocated instruction of a block
    replaced by NOPs (the trampoline written behind the prover's back) diverges."""
    from relocverify.runtime.jump_probes import HOOK_SLOT
    from relocverify.runtime.kernel import nop_pad

    fn = find_function(image, "__sw_hweight64")
    ref = _reference(jd, fn, "u64", 1)
    address = next(a for a in _points(jd, fn)[0] if ref.executions(a))
    patch = jd.runtime.begin_enable(address, _noop)
    probe = patch.probe
    jd.runtime.finish(patch)
    jd.runtime.disable_jump(address)
    first = probe.block.piece(0)
    size = len(probe.block.instructions[0].raw)
    at = probe.tramp + len(HOOK_SLOT)
    assert first[:size] == probe.block.instructions[0].raw  # a copy: the instruction verbatim
    jd.kernel.write_code(at, nop_pad(size))
    try:
        out = _interleave(jd, fn, "u64", 1, address, "enable", 0, 0)
    finally:
        jd.kernel.write_code(at, first[:size])
    assert out.torn == [] and first_difference(ref.execution, out.execution) is not None


# -- refusals ----------------------------------------------------------------------------------------

def test_a_branch_target_inside_the_range_is_refused_and_nothing_is_written(jd, image):
    fn = find_function(image, "strlen")
    insns = live_instructions(jd.runtime, fn)
    targets = {i.near_branch_target for i in insns if i.is_jcc_short_or_near or i.is_jmp_short_or_near}
    for ins in insns:
        end = ins.ip
        for nxt in insns:
            if nxt.ip >= ins.ip and end - ins.ip < 5:
                end = nxt.ip + nxt.len
        if any(ins.ip < x < end for x in targets):
            break
    else:
        raise AssertionError("strlen has no instruction whose range holds a branch target")
    before = jd.kernel.read(ins.ip, 16)
    got = jd.runtime.enable_jump(ins.ip, _noop)
    assert isinstance(got, JumpRefused) and got.key.startswith("range:"), got
    assert "patch range" in got.reason
    assert jd.kernel.read(ins.ip, 16) == before and jd.runtime.jump_at(ins.ip) is None
    # the int3 probe is still available there
    assert not isinstance(jd.runtime.enable(ins.ip, _noop), JumpRefused)
    assert jd.kernel.read(ins.ip, 1) == b"\xcc"
    jd.runtime.disable(ins.ip)
    assert jd.kernel.read(ins.ip, 16) == before


def test_a_call_in_the_range_and_the_function_end_are_refused_by_the_planner(jd, image):
    strim = find_function(image, "strim")
    call = next(i for i in live_instructions(jd.runtime, strim) if i.flow_control == iced_x86.FlowControl.CALL)
    got = jd.runtime.enable_jump(call.ip, _noop)
    assert isinstance(got, JumpRefused) and got.key == "block:call-in-range"
    ret = [i for i in live_instructions(jd.runtime, find_function(image, "strlen"))
           if i.flow_control == iced_x86.FlowControl.RETURN][-1]
    got = jd.runtime.enable_jump(ret.ip, _noop)
    assert isinstance(got, JumpRefused) and got.key in ("block:emulated", "block:past-function-end")


# -- the command line ------------------------------------------------------------------------------

def test_jump_differential_places_jump_probes_and_int3_probes_elsewhere(jd, image):
    report = jd.run("gcd", parse_spec("u64:1-1000000,u64:1-1000000"), 10, seed=1, probe_all=True)
    assert report.divergences == [] and report.stopped is None and report.refused == []
    assert jd.summary["jump"] > 0 and jd.summary["int3"] > 0
    lines = jump_summary_lines(jd.summary)
    assert lines[0].startswith(f"jump probes: {jd.summary['jump']} placed")
    assert not jd.runtime.jump_probes()


def test_cli_jump_probes_flag(debian_kernels):
    import io
    from relocverify.cli.main import build_parser

    kernel, _ = debian_kernels("debian-6.1-cloud")
    p = build_parser()  # the real command line, with its typed arguments
    args = p.parse_args(["run", "--image", str(kernel.vmlinux), "--function", "strlen", "--args", "str:32",
                         "--trials", "5", "--probe-all", "--jump-probes"])
    out = io.StringIO()
    assert args.func(args, out) == 0
    text = out.getvalue()
    assert "0 divergences" in text and "jump probes: " in text and "int3 probes: " in text


def test_proved_means_proved(jd, image):
    """Every jump probe placed rests on a block proof: the prover is the real one."""
    fn = find_function(image, "gcd")
    address = _points(jd, fn)[0][0]
    patch = jd.runtime.begin_enable(address, _noop)
    proof = jd.runtime.trampolines.prove_block(patch.probe.block, 10_000)
    assert proof.verdict is Verdict.PROVED
    jd.runtime.finish(patch)
    jd.runtime.disable_jump(address)


# -- the batch phase: blocks composed from their pieces get prove_block's answers --------------------------

def test_composed_jump_answers_are_prove_blocks_answers_on_real_functions(image):
    """``engine.jumps`` proves most blocks by composing pieces it has proved before, and answers runs of
    known copies without decoding them; over a sample of the kernel's functions, twice (the second
    pass answered from what the first learned), every answer is the one ``prove_block`` gives alone."""
    from relocverify.engine.jumps import CALL_IN_RANGE, ELIGIBLE, JumpProver, patch_ranges
    from relocverify.engine.keys import KeyMaker
    from relocverify.image.functions import find_functions
    from relocverify.kernel.sites import find_sites
    from relocverify.plan.plan import DEFAULT_TRAMP

    functions = find_functions(image)
    ranges = patch_ranges(image, functions, find_sites(image), "kernel")
    composed = JumpProver(ranges, DEFAULT_TRAMP, 10.0)
    alone = JumpProver(ranges, DEFAULT_TRAMP, 10.0, compose=False)
    keys = KeyMaker(DEFAULT_TRAMP)
    buckets: Counter = Counter()
    for fn in functions[::300]:
        section = image.get_section(fn.section)
        data = section.data[fn.start - section.address:fn.start - section.address + fn.size]
        spans = [(off, n) for off, n, _ in keys.keys(data, fn.start)]
        want = alone.function(fn, data, spans)
        for got in composed.function(fn, data, spans), composed.function(fn, data, spans):
            assert [(off, bucket) for off, bucket, _ in got] == [(off, bucket) for off, bucket, _ in want], fn.name
            # the reasons too, but a call refused from its key's facts is not decoded: no text of it
            assert [(off, reason) for off, bucket, reason in got if bucket != CALL_IN_RANGE] == \
                [(off, reason) for off, bucket, reason in want if bucket != CALL_IN_RANGE], fn.name
        buckets.update(bucket for _, bucket, _ in want)
    assert buckets[ELIGIBLE] > 2000 and len(buckets) > 5, buckets
    assert composed.composed > buckets[ELIGIBLE] // 2 and composed.proofs < alone.proofs // 10
    assert composed.calls > buckets[CALL_IN_RANGE] // 2  # most calls refused without a decode
    assert composed.conflicts == 0  # every token stood for one piece key, every key for one set of facts


def test_jump_answers_kept_in_the_cache_answer_a_later_run_the_same(image, tmp_path):
    """The pieces and blocks one prover learned, written to a real proof cache and read back by a new
    prover (a later run's worker), give every answer again without a piece proof."""
    from relocverify.engine.jumps import CALL_IN_RANGE, JumpMemory, JumpProver, jump_tag, patch_ranges
    from relocverify.engine.keys import KeyMaker
    from relocverify.image.functions import find_functions
    from relocverify.kernel.sites import find_sites
    from relocverify.plan.plan import DEFAULT_TRAMP
    from relocverify.proof.cache_key import cache_tag
    from relocverify.store.cache import ProofCache

    functions = find_functions(image)[::400]
    ranges = patch_ranges(image, functions, find_sites(image), "kernel")
    keys = KeyMaker(DEFAULT_TRAMP)
    inputs = []
    for fn in functions:
        section = image.get_section(fn.section)
        data = section.data[fn.start - section.address:fn.start - section.address + fn.size]
        inputs.append((fn, data, [(off, n) for off, n, _ in keys.keys(data, fn.start)]))
    first = JumpProver(ranges, DEFAULT_TRAMP, 10.0)
    answers = [first.function(*args) for args in inputs]
    tag = jump_tag(cache_tag())
    cache = ProofCache(str(tmp_path))
    cache.add_jump_entries(tag, first.memory.take_new())
    cache.close()
    cache = ProofCache(str(tmp_path))
    later = JumpProver(ranges, DEFAULT_TRAMP, 10.0, memory=JumpMemory(cache.jump_entries(tag)))
    again = [later.function(*args) for args in inputs]
    # the same buckets, and the same reasons but for calls (refused with or without decoding them, as
    # each prover learned the facts of their keys)
    assert [[(o, b, r if b != CALL_IN_RANGE else "") for o, b, r in a] for a in again] == \
        [[(o, b, r if b != CALL_IN_RANGE else "") for o, b, r in a] for a in answers]
    assert first.piece_proofs > 100 and later.piece_proofs == 0 and later.composed > first.composed
    assert later.proofs <= first.proofs and not later.memory.new  # only SMT-proved blocks are proved again


def test_the_jump_tag_follows_every_byte_of_the_source(tmp_path):
    """Jump answers are filed under a digest of relocverify's own source: a copy of the package
    has the same, and one byte changed in the planner gives another."""
    import shutil
    from pathlib import Path

    import relocverify
    from relocverify.versions import source_digest

    root = Path(relocverify.__file__).resolve().parent
    copy = tmp_path / "relocverify"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert source_digest(copy) == source_digest(root)
    planner = copy / "plan" / "plan.py"
    planner.write_bytes(planner.read_bytes().replace(b"rel32", b"rel31", 1))
    assert source_digest.__wrapped__(copy) != source_digest(root)


def test_a_moved_decode_is_the_decode_at_the_new_address(image):
    """``engine.jumps.MovedDecodes`` hands out an earlier decode of the same bytes moved to a new
    address, for instructions whose instance key says they have no address-valued field: on every
    such instruction of a sample of the kernel, first decoded elsewhere, it is ``decode`` there,
    the decoders' answers included."""
    from relocverify.engine.jumps import MovedDecodes, lane_token
    from relocverify.engine.keys import KeyMaker
    from relocverify.image.functions import find_functions
    from relocverify.plan.plan import DEFAULT_TRAMP
    from relocverify.x86.decode import decode

    moved, keys, checked = MovedDecodes(), KeyMaker(DEFAULT_TRAMP), 0
    for fn in find_functions(image)[::500]:
        section = image.get_section(fn.section)
        data = section.data[fn.start - section.address:fn.start - section.address + fn.size]
        for off, n, key in keys.keys(data, fn.start):
            raw = data[off:off + n]
            if type(lane_token(key, raw)) is bytes:
                moved.decode(raw, fn.start + off + 0x12345)
                got, want = moved.decode(raw, fn.start + off), decode(raw, fn.start + off)
                assert got == want and got.answers == want.answers and got.notes == want.notes, raw.hex()
                checked += 1
    assert checked > 3000


#: Instructions to build runs from: calls of every form, short branches aimed into and past a
#: 5-byte range, a RIP-relative load, plain ones, and bytes no decoder takes in 64-bit mode.
_RUN_PIECES = [bytes.fromhex(h) for h in (
    "e800000000", "e8f0ffffff", "ffd0", "41ffd3", "ff5008", "ff1500001000", "7501", "7502", "75fe", "eb01",
    "e901000000", "488b0500000000", "90", "4889e5", "55", "c3", "06", "0f0b", "f0ff00")]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_RUN_PIECES), min_size=2, max_size=10))
def test_a_call_refused_from_its_keys_facts_is_plan_blocks_refusal(pieces):
    """``JumpProver._call_first`` refuses a run as call-in-range without decoding it only where
    ``plan_block`` does: over generated runs of calls, branches into the range, undecodable bytes and
    plain instructions, with the facts of every key learned from the real decoders."""
    from relocverify.engine.jumps import JumpProver
    from relocverify.engine.keys import KeyMaker
    from relocverify.plan.block import NoBlock, call_reason, plan_block
    from relocverify.plan.plan import DEFAULT_TRAMP
    from relocverify.x86.decode import decode

    data, start = b"".join(pieces), 0xFFFFFFFF81000000
    found = KeyMaker(DEFAULT_TRAMP).keys(data, start)
    keys, spans = [k for _, _, k in found], [(off, n) for off, n, _ in found]
    decoded = [decode(data[off:off + n], start + off) for off, n in spans]
    prover = JumpProver(None, DEFAULT_TRAMP, 10.0)
    for key, d in zip(keys, decoded):
        prover._learn_facts(key, d)
    for i in range(len(spans)):
        j, length = i, 0
        while length < 5 and j < len(spans):
            length, j = length + spans[j][1], j + 1
        call = prover._call_first(keys, i, j) if length >= 5 else None
        if call is not None:
            block = plan_block(decoded[i:j], DEFAULT_TRAMP)
            assert isinstance(block, NoBlock) and block.key == "call-in-range", (data.hex(), i, block)
            assert block.reason == call_reason(start + spans[call][0], start + spans[i][0],
                                               start + spans[i][0] + length), (data.hex(), i, block)
    assert prover.conflicts == 0


def test_calls_refused_from_facts_cover_the_forms():
    """The shortcut is taken (the property above is not vacuous): a call first, a call after a
    plain instruction, and not after a branch or before undecodable bytes; it names the call."""
    from relocverify.engine.jumps import JumpProver
    from relocverify.engine.keys import KeyMaker
    from relocverify.plan.plan import DEFAULT_TRAMP
    from relocverify.x86.decode import decode

    def first(code: str) -> int | None:
        data, start = bytes.fromhex(code), 0xFFFFFFFF81000000
        found = KeyMaker(DEFAULT_TRAMP).keys(data, start)
        prover = JumpProver(None, DEFAULT_TRAMP, 10.0)
        for off, n, key in found:
            prover._learn_facts(key, decode(data[off:off + n], start + off))
        j = next(k for k in range(len(found)) if found[k][0] + found[k][1] >= 5) + 1
        return prover._call_first([k for _, _, k in found], 0, j)

    assert first("e800000000") == 0 and first("55ffd0c3c3") == 1 and first("4889e5e800000000") == 1
    assert first("7502ffd0c3") is first("ffd006c3c3") is first("4889e5c3c3") is None
