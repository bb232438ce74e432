"""The symbolic check: both sides executed over claripy, their difference asked of z3, and a model
replayed on unicorn before it is called a counterexample (``proof.prove`` comes here when the
fast path cannot decide; importing this module imports angr's IR operations and z3)."""

from __future__ import annotations

import time

import claripy

from ..plan.effects import Effect
from ..text import one_line
from ..x86.instruction import Instruction
from . import semantics as S
from . import smt
from .admission import Admission, reexecutes
from ..concrete.outcome import Difference
from .lifter_checks import flag_names, unaffected_flags
from .machine_model import RED_ZONE, ROWS, STACK_ALLOWANCE, Context
from .unproved import gap_result
from .verdict import Counterexample, ProofResult, Verdict


def check_by_smt(decoded: Instruction, code: bytes | None, effects: tuple[Effect, ...], tramp: int, tracer_ranges,
                 timeout_ms: int, admission: Admission, t0: float, context: Context | None = None) -> ProofResult:
    """``context``: CPL 0 or 3 (``machine_model.Context``), by default that of the original's address."""
    trusted = admission.trusted
    tracer_bytes = {}
    if code is not None:
        tracer_bytes = {tramp + k: b for k, b in enumerate(code)}
    world = S.World(tracer_bytes, tracer_ranges)
    why = admission.reason
    try:
        orig = S.execute_original(world, decoded.raw, decoded.address)
        if code is not None:
            reloc = S.execute_relocated(world, code, tramp, decoded.address)
        else:
            reloc = S.execute_effects(world, effects, decoded.address, tramp)
        x = claripy.BVS("x", 64, explicit_name=True)
        items = smt.items(world, orig, reloc, decoded.address, tramp, x)
        read_conds = smt.event_conditions(world, orig, reloc)
        if code is not None:
            self_writes = smt.code_writes(world, reloc, smt.code_spans(code, tramp))
            if self_writes:
                items.append(smt.flag_item("writes its own code", self_writes))
        solver = smt.solve(world, items, read_conds, x, timeout_ms, precondition=smt.private_tracer_memory(world, orig))
        if solver is None and trusted and not reexecutes(decoded, code, tramp):
            clobbered = smt.clobbered_flags(world, orig, decoded.address, unaffected_flags(decoded), timeout_ms)
            if clobbered:
                why = (f"not proved: the original is lifted writing {flag_names(clobbered)}, which the decoders say "
                       f"it leaves alone, and the relocation does not re-execute it, so VEX's values for it are not "
                       f"the CPU's")
                trusted = False
    except S.Gap as gap:
        return gap_result(decoded, code, tramp, gap.reason if trusted or not why else why, t0)
    except claripy.errors.ClaripyError as exc:
        return ProofResult(Verdict.UNKNOWN, f"solver: {type(exc).__name__}: {one_line(exc)}", "smt",
                           seconds=time.perf_counter() - t0)
    if solver is None and code is not None:  # equal in sequence: now the machine between instructions
        try:
            exposed = _stack_exposure(world, decoded, orig, reloc, tramp, timeout_ms, t0, context or Context.of(tramp))
        except claripy.errors.ClaripyError as exc:
            return ProofResult(Verdict.UNKNOWN, f"solver: {type(exc).__name__}: {one_line(exc)}", "smt",
                               seconds=time.perf_counter() - t0)
        if exposed is not None:
            return exposed
    if solver is None and not trusted:
        if admission.unvalidated:
            return gap_result(decoded, code, tramp, why, t0)
        return ProofResult(Verdict.UNKNOWN, why, "smt", seconds=time.perf_counter() - t0)
    if solver is None:
        return ProofResult(Verdict.PROVED, "z3: the negated obligation is unsatisfiable", "smt",
                           seconds=time.perf_counter() - t0)
    try:
        cex = smt.counterexample(world, solver, items, read_conds, x, decoded, tramp, code.hex() if code else "", effects)
    except claripy.errors.ClaripyError as exc:
        return ProofResult(Verdict.UNKNOWN, f"solver: {type(exc).__name__} while extracting a model", "smt",
                           seconds=time.perf_counter() - t0)
    confirmed, note = smt.replay(cex, decoded, code, effects, tramp, tracer_ranges)
    if not confirmed and note.startswith("not replayable") and "rcx" in world.reg_syms:
        # A counter the solver chose too large to replay (rep, loop): ask for a small one.
        try:
            small = smt.solve(world, items, read_conds, x, timeout_ms, (claripy.ULE(world.reg_syms["rcx"], 8),),
                              precondition=smt.private_tracer_memory(world, orig))
        except claripy.errors.ClaripyError:  # a timeout looking for a smaller one: keep the first
            small = None
        if small is not None:
            solver = small
            cex = smt.counterexample(world, solver, items, read_conds, x, decoded, tramp, code.hex() if code else "",
                                  effects)
            confirmed, note = smt.replay(cex, decoded, code, effects, tramp, tracer_ranges)
    cex = Counterexample(cex.registers, cex.memory, cex.differences, cex.orig_hex, cex.at, cex.tramp,
                         cex.reloc_hex, cex.effects_json, confirmed, note)
    if world.uf_results and not confirmed:
        return ProofResult(Verdict.UNKNOWN, "counterexample depends on an uninterpreted helper and did not replay",
                           "smt", cex, time.perf_counter() - t0)
    if not confirmed:
        return ProofResult(Verdict.UNKNOWN, f"z3 found a counterexample that unicorn did not confirm ({note})"
                           + (f"; {why}" if why else ""), "smt", cex, time.perf_counter() - t0)
    what = ", ".join(d.what for d in cex.differences) or "reads"
    return ProofResult(Verdict.REFUTED, f"differs in {what}", "smt", cex, time.perf_counter() - t0)


def _stack_exposure(world, decoded: Instruction, orig, reloc, tramp: int, timeout_ms: int, t0: float,
                    context: Context):
    """A refutation by the machine model's rows interrupt-frame and signal-frame (``smt.stack_exposure``),
    or None.  Not replayed on unicorn, which runs no interrupt between instructions; ``relocverify selftest``
    judges the class on the CPU by writing a frame at each boundary."""
    row = ROWS["interrupt-frame" if context is Context.KERNEL else "signal-frame"]
    conditions = smt.stack_exposure(world, orig, reloc, decoded.address, tramp,
                                    0 if context is Context.KERNEL else RED_ZONE, STACK_ALLOWANCE, context.stack_range)
    hit = smt.first_satisfiable(world, conditions, timeout_ms, smt.private_tracer_memory(world, orig))
    if hit is None:
        return None
    solver, why = hit
    regs, mem = smt.model_state(world, solver)
    cex = Counterexample(regs, mem, (Difference(f"an {'interrupt' if context is Context.KERNEL else 'signal'} "
                                                f"at {context.value}", "nothing lost", why),),
                         decoded.raw.hex(), decoded.address, tramp, "", replayed=None,
                         replay_note="an interrupt between instructions is not part of a sequential replay")
    return ProofResult(Verdict.REFUTED, f"{why}: {row.what}; {row.reason} ({row.source})", "machine-model", cex,
                       time.perf_counter() - t0)
