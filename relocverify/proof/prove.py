"""Prove a relocation equivalent to the original instruction, or refute it.

The obligation (one instruction at A, its relocation at T):

  From one arbitrary machine state (every general-purpose register, RFLAGS
  (OF SF ZF AF PF CF, and DF, AC, ID), the fs/gs bases, every SIMD/x87
  register the code touches, and all of memory), run the original
  instruction at A and the relocation at T (its bytes, or an emulate plan's
  effects).  For every input the two must end with

    1. the same value in every register either side wrote (RFLAGS compared
       as flags, computed from VEX's lazy thunk, not the thunk itself);
    2. the same byte at every memory address outside tracer memory;
    3. the same sequence of memory reads (address and size, on the path taken),
       tracer memory excepted;
    4. the same next RIP, under the A <-> T correspondence: a jump back to T
       is the relocated instruction starting over, the image of the
       original jumping to A (rep string loops, CAS retries); every other
       exit must be the original's successor itself (A+len, the branch
       target, the call target with A+len pushed).

  Left out, and why: tracer memory, i.e. the trampoline bytes (and the
  absolute-jump qwords inside them) and a scratch plan's save slot.  The
  tracer allocates and writes them, no kernel code addresses them, and the
  original instruction cannot see them: they exist only for the relocation.
  A plan never writes below rsp except by an emulated push, which is the
  original's own push, compared like any other store.

  5. Atomicity, a separate obligation a sequential semantics cannot see:
     the relocated code performs the original's memory operation under
     LOCK exactly when the original does (a LOCK prefix, or xchg with
     memory, which is implicitly locked).

Semantics: ``semantics.py`` (VEX IR via pyvex, angr's claripy operations,
memory for all addresses).  A proof is an UNSAT answer from z3 for the
negated obligation, or the IR-identity fast path (``fast_path``), whose
soundness argument is in its docstring.  A SAT answer is a counterexample;
it is reported as ``refuted`` only after unicorn, an independent concrete
executor, replays both sides on it and sees a difference too; otherwise the
verdict is ``unknown``.
"""


from __future__ import annotations

import time

from ..concrete.outcome import Difference
from ..plan.effects import Effect
from ..plan.plan import Plan, PlanKind
from ..x86.instruction import Decoded, Instruction
from .atomicity import atomic, check_atomicity
from .fast_path import fast_path, fast_path_effects
from .lift import Gap
from .unproved import gap_result
from .admission import admit
from .lift_gaps import opaque_lift_reason
from .machine_model import Context, Machine, MachineCheck, check_machine, one_step
from .precondition import check_tracer_memory
from .verdict import Counterexample, ProofResult, Verdict

DEFAULT_TIMEOUT_MS = 10_000


def _outside_result(decoded: Instruction, code: bytes | None, tramp: int, method: str, what: str, reason: str,
                    note: str, t0: float, machine: MachineCheck | None = None) -> ProofResult:
    """A refutation by an obligation outside the sequential semantics (atomicity, memory ordering, the machine
    model)."""
    original, relocated = (machine.original, machine.relocated) if machine else ("the original's", "the relocation's")
    cex = Counterexample((), (), (Difference(what, original, relocated),), decoded.raw.hex(),
                         decoded.address, tramp, code.hex() if code else "", replayed=None, replay_note=note)
    return ProofResult(Verdict.REFUTED, reason, method, cex, time.perf_counter() - t0)


def _check(decoded: Instruction, code: bytes | None, effects: tuple[Effect, ...], tramp: int,
           tracer_ranges, timeout_ms: int, where: Machine | None = None, smt=None) -> ProofResult:
    """The verdict, with the machine model's preconditions attached to a proof (``machine_model``; ``where``
    the code runs: by default the context of its address; ``smt``: as for ``prove_plan``)."""
    t0 = time.perf_counter()
    where = where or Machine.at(tramp)  # the relocated code runs at T: its privilege is T's
    machine = check_machine(decoded.raw, decoded.address, code, effects, tramp, tuple(tracer_ranges), where)
    result = _check_semantics(decoded, code, effects, tramp, tracer_ranges, timeout_ms, t0, where.context, smt)
    if result.verdict is Verdict.REFUTED:
        return result  # a difference the semantics finds (replayed on unicorn) comes first
    if machine.refutes:
        return _outside_result(decoded, code, tramp, "machine-model", machine.what, machine.problem,
                               "the machine model's difference is not observable in a sequential replay "
                               "(docs/machine.md)", t0, machine)
    if result.verdict is not Verdict.PROVED:
        return result  # the semantics' reason for no proof stands whatever the machine model cannot decide
    if machine.problem is not None:
        return ProofResult(Verdict.UNKNOWN, machine.problem, "machine-model", seconds=time.perf_counter() - t0)
    if not machine.assumes:
        return result
    return ProofResult(result.verdict, result.reason, result.method, result.counterexample, result.seconds,
                       result.obligations, machine.assumes)  # ``replace`` with its field checks cost 3 µs a proof


def _check_semantics(decoded: Instruction, code: bytes | None, effects: tuple[Effect, ...], tramp: int,
                     tracer_ranges, timeout_ms: int, t0: float, context: Context, smt=None) -> ProofResult:
    lock = check_atomicity(decoded, code, tramp, tracer_ranges)
    if lock is not None:
        cex = Counterexample((), (), (Difference("lock", "locked" if atomic(decoded) else "unlocked",
                                                 "unlocked" if atomic(decoded) else "locked"),),
                             decoded.raw.hex(), decoded.address, tramp, code.hex() if code else "",
                             replayed=None, replay_note="atomicity is not observable in a sequential replay")
        return ProofResult(Verdict.REFUTED, lock, "atomicity", cex, time.perf_counter() - t0)
    opaque = opaque_lift_reason(decoded)
    if opaque is not None:
        return gap_result(decoded, code, tramp, opaque, t0)
    admission = admit([decoded], [(code, tramp)])
    if admission.refutation is not None:
        return _outside_result(decoded, code, tramp, "memory-model", "memory ordering", admission.refutation,
                               "memory ordering is not observable in a sequential replay (SDM Vol. 3 §9.2)", t0)
    trusted = admission.trusted  # untrusted: no proof, but a counterexample unicorn confirms still refutes
    try:
        if trusted and code is None and fast_path_effects(decoded.raw, decoded.address, effects):
            return ProofResult(Verdict.PROVED, "the original's IR is the effect program's IR image",
                               "fast-path", seconds=time.perf_counter() - t0)
    except Gap as gap:
        return gap_result(decoded, code, tramp, gap.reason, t0)
    if trusted and code is not None and one_step(code, tramp, tuple(tracer_ranges)):
        try:
            if fast_path(decoded.raw, decoded.address, code, tramp):
                return ProofResult(Verdict.PROVED, "the relocated IR is the original's up to A <-> T",
                                   "fast-path", seconds=time.perf_counter() - t0)
        except Gap as gap:
            return gap_result(decoded, code, tramp, gap.reason, t0)
    checker = smt
    if checker is None:  # claripy, angr's IR operations and z3: imported only when the fast path cannot decide
        from .smt_check import check_by_smt as checker
    return checker(decoded, code, effects, tramp, tracer_ranges, timeout_ms, admission, t0, context)


def prove_plan(decoded: Decoded, plan: Plan, timeout_ms: int = DEFAULT_TIMEOUT_MS, smt=None) -> ProofResult:
    """The verdict for one of our own plans.  ``smt``: what runs the SMT check when the fast path cannot decide, a
    function called as ``smt_check.check_by_smt`` is, which returns what it returns or raises what it raises (the
    scheduler's SMT helper: the same call, in another process); None: ``smt_check`` is imported and runs here."""
    if plan.kind is PlanKind.REJECT or not isinstance(decoded, Instruction):
        return ProofResult(Verdict.REJECTED, plan.reason, "policy")
    if plan.kind is PlanKind.EMULATE:
        return _check(decoded, None, plan.effects, plan.tramp, (), int(timeout_ms), smt=smt)
    return _check(decoded, plan.trampoline, (), plan.tramp, plan.tracer_memory, int(timeout_ms), smt=smt)


def prove_relocation(decoded: Decoded, reloc: bytes, tramp: int, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                     tracer_memory: tuple[tuple[int, int], ...] = (), where: Machine | None = None,
                     smt=None) -> ProofResult:
    """The verdict for relocated bytes made by any tool, run from ``tramp``.

    Tracer memory is the relocated bytes themselves, plus ``tracer_memory``:
    (address, size) ranges the tool keeps its own data in (save slots).  ``where``: the machine the code
    runs in (``machine_model.Machine``: a user-space tracer's, a kernel without IBT), by default the
    context of the instruction's address; ``smt``: as for ``prove_plan``.
    Raises ``InputError`` when those ranges make the precondition vacuous
    (``precondition.check_tracer_memory``)."""
    if not isinstance(decoded, Instruction):
        return ProofResult(Verdict.UNKNOWN, f"the original does not decode: {decoded.reason}")
    check_tracer_memory(decoded, tramp, len(reloc), tuple(tracer_memory))
    ranges = ((tramp, len(reloc)),) + tuple(tracer_memory)
    return _check(decoded, bytes(reloc), (), tramp, ranges, int(timeout_ms), where, smt)


def prove_effects(decoded: Decoded, effects: tuple[Effect, ...], tramp: int,
                  timeout_ms: int = DEFAULT_TIMEOUT_MS, where: Machine | None = None, smt=None) -> ProofResult:
    """The verdict for an emulation program made by any tool (``where``, ``smt``: as for ``prove_relocation``)."""
    if not isinstance(decoded, Instruction):
        return ProofResult(Verdict.UNKNOWN, f"the original does not decode: {decoded.reason}")
    return _check(decoded, None, tuple(effects), tramp, (), int(timeout_ms), where, smt)



def plan_assumptions(decoded: Decoded, plan: Plan, where: Machine | None = None) -> tuple[str, ...]:
    """The machine model's preconditions a proof of ``plan`` depends on (``ProofResult.assumes``), for a
    verdict read back from a store or the proof cache, which keep the verdict, not its preconditions."""
    if plan.kind is PlanKind.REJECT or not isinstance(decoded, Instruction):
        return ()
    code = plan.trampoline if plan.kind is not PlanKind.EMULATE else None
    return check_machine(decoded.raw, decoded.address, code, plan.effects, plan.tramp,
                         tuple(plan.tracer_memory), where).assumes
