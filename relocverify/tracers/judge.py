"""A tracer's answer, judged: the proof of its relocation, and the key that proof is shared under.

A tracer's relocation is keyed exactly as the engine keys its own plans (``proof.cache_key``):
the relocated bytes (or the effect program) with every address-valued field zeroed, and the
role of each field's value.  So the same relocated bytes get the same proof, whichever tracer
made them, and a tracer relocation byte-identical to relocverify's own plan (kprobes copying a
position-independent instruction and jumping back with rel32, as our ``copy`` plan does) takes
the proof the engine stored for that plan, and the other way round.  Only what
``cache_key.reusable`` allows is kept under a shared key (copies: any verdict; other shapes:
fast-path proofs).

A counterexample z3 found and unicorn did not confirm (unicorn cannot run VEX.256 ``vpcmpeqb``, or
saw no difference) is run on this machine's CPU (``replay_unconfirmed``, ``concrete.cpu_replay``):
confirmed there, the answer is refuted ("confirmed on CPU", method ``cpu``); otherwise it stays
``unknown`` and says what the CPU did (method ``cpu-same``: no difference there either;
``cpu-guest``: not user-mode safe, it needs the confirm guest; ``cpu-not-run``: why not).  Such a
verdict depends on this CPU and its feature mask (``RELOCVERIFY_CPU_FEATURES``), so it is never
filed in the shared proof cache (``reusable_here``).
"""

from __future__ import annotations

import time

from ..concrete.cpu_replay import replay_on_cpu
from ..concrete.outcome import Difference
from ..engine.pipeline import WATCHDOG_MARGIN_S, ProofTimeout, watchdog
from ..plan.plan import Plan, PlanKind, make_plan
from ..processes import refused
from ..proof.cache_key import cache_key
from ..proof.machine_model import Machine
from ..proof.verdict import Counterexample, ProofResult, Verdict
from ..x86.decode import decode
from ..x86.encoding import jump
from ..x86.instruction import Instruction
from .model import Answer, Emulate, Refuse, Relocate, RelocateBlock, Unmodelled



def plan_of(insn: Instruction, answer: Answer, tramp: int, rules=None) -> Plan | None:
    """The answer as a ``Plan`` for ``cache_key``: our own plan itself when the bytes are the same
    (None for a block: its key is ``proof.block.block_key``)."""
    if isinstance(answer, Emulate):
        return Plan(PlanKind.EMULATE, "tracer", "", insn.address, insn.length, tramp, effects=answer.effects)
    if not isinstance(answer, Relocate):
        return None
    memory = ((tramp, len(answer.code)),) + answer.tracer_memory
    if answer.code == insn.raw + jump(tramp + insn.length, insn.end) and not answer.tracer_memory:
        return Plan(PlanKind.COPY, "tracer", "", insn.address, insn.length, tramp, answer.code, tracer_memory=memory)
    own = make_plan(insn, tramp, rules)
    if own.kind in (PlanKind.COPY, PlanKind.REWRITE) and own.trampoline == answer.code \
            and own.tracer_memory == memory:
        return own
    return Plan(PlanKind.REWRITE, "tracer", "", insn.address, insn.length, tramp, answer.code, tracer_memory=memory)


def proof_key(insn: Instruction, answer: Answer, tramp: int, rules=None, where: Machine | None = None) -> bytes | None:
    if isinstance(answer, RelocateBlock):
        if answer.entries:
            return None
        from ..proof.block import block_key

        return block_key(answer.block)
    plan = plan_of(insn, answer, tramp, rules)
    return None if plan is None else cache_key(insn, plan, where)


def prove_answer(insn: Instruction, answer: Answer, tramp: int, timeout_s: float = 10.0,
                 where: Machine | None = None) -> ProofResult | None:
    """The verdict on a relocating answer (None for a refusal), under a watchdog: anything that
    hangs past the solver's timeout is ``unknown``.  ``where``: the machine the tracer's relocations run
    in (``tracers.model.machine_of``), by default the context of the address."""
    if isinstance(answer, Refuse):
        return None
    if isinstance(answer, Unmodelled):
        return ProofResult(Verdict.UNKNOWN, f"not modelled: {answer.reason}", "unmodelled")
    from ..proof.prove import prove_effects, prove_relocation

    if isinstance(answer, RelocateBlock) and answer.entries:
        return entry_refutation(answer)
    t0 = time.perf_counter()
    try:
        with watchdog(timeout_s + WATCHDOG_MARGIN_S):
            if isinstance(answer, RelocateBlock):
                from ..proof.block import prove_block

                return prove_block(answer.block, timeout_ms=int(timeout_s * 1000))
            if isinstance(answer, Emulate):
                return prove_effects(insn, answer.effects, tramp, timeout_ms=int(timeout_s * 1000), where=where)
            return prove_relocation(insn, answer.code, tramp, timeout_ms=int(timeout_s * 1000),
                                    tracer_memory=answer.tracer_memory, where=where)
    except ProofTimeout:
        return ProofResult(Verdict.UNKNOWN, f"timeout: no verdict within {timeout_s:g} s", "timeout",
                           seconds=time.perf_counter() - t0)
    except Exception as exc:  # a bug in a third-party library must not stop an audit
        if refused(exc) is not None:  # the system's limit is no verdict: the audit stops
            raise
        return ProofResult(Verdict.UNKNOWN, f"internal error: {type(exc).__name__}: {exc}"[:300], "error",
                           seconds=time.perf_counter() - t0)


UNCONFIRMED = "z3 found a counterexample that"  # the start of an unconfirmed counterexample's reason
CPU_METHODS = {"cpu": "confirmed on CPU", "cpu-same": "the CPU saw no difference",
               "cpu-guest": "needs the guest", "cpu-not-run": "not run on the CPU"}


def reusable_here(method: str) -> bool:
    """May a verdict made by ``method`` go into the shared proof cache?  Not one the CPU decided."""
    return method not in CPU_METHODS


def replay_unconfirmed(insn: Instruction, answer: Answer, result: ProofResult) -> ProofResult:
    """``result`` itself, or, for an unknown whose counterexample unicorn did not confirm, the verdict of
    that counterexample replayed on this CPU (see the module doc).  Blocks are replayed by the block proof
    (unicorn) only: said as such."""
    cex = result.counterexample
    if result.verdict is not Verdict.UNKNOWN or cex is None or not result.reason.startswith(UNCONFIRMED) \
            or not isinstance(answer, (Relocate, Emulate)):
        return result

    reloc = answer.code if isinstance(answer, Relocate) else None
    effects = answer.effects if isinstance(answer, Emulate) else None
    memory = answer.tracer_memory if isinstance(answer, Relocate) else ()
    try:
        rep = replay_on_cpu(insn.raw, cex.at, cex.tramp, cex.state(), reloc, effects, memory)
    except Exception as exc:  # the judge's own failure must not stop an audit: said, and the verdict stays
        if refused(exc) is not None:
            raise
        return _with(result, "cpu-not-run", f"not run on the CPU ({type(exc).__name__}: {exc})"[:300])
    if rep.confirmed:
        what = ", ".join(d.what for d in rep.differences)
        note = (f"confirmed on CPU ({rep.cpu}; {rep.note}): "
                + ", ".join(f"{d.what}: {d.original} vs {d.relocated}" for d in rep.differences[:4]))
        regs, memory = cex.registers, cex.memory
        if rep.state is not None:  # the judge's own state, not z3's
            regs = tuple(sorted(rep.state.registers.items()))
            memory = tuple(sorted(rep.state.memory.items()))
        cex = Counterexample(regs, memory, rep.differences, cex.orig_hex, cex.at, cex.tramp,
                             cex.reloc_hex, cex.effects_json, True, note + f"; unicorn: {cex.replay_note}")
        return ProofResult(Verdict.REFUTED, f"differs in {what} (confirmed on CPU: {rep.cpu})", "cpu", cex,
                           result.seconds)
    if rep.status == "same":
        return _with(result, "cpu-same", f"the CPU saw no difference either ({rep.cpu}; {rep.note})")
    if rep.status == "guest":
        return _with(result, "cpu-guest", rep.note)
    return _with(result, "cpu-not-run", f"not run on the CPU: {rep.note}")


def _with(result: ProofResult, method: str, said: str) -> ProofResult:
    return ProofResult(result.verdict, f"{result.reason}; {said}", method, result.counterexample, result.seconds)


def entry_refutation(answer: RelocateBlock) -> ProofResult:
    """A block probe whose overwritten bytes other code jumps into: refuted without a solver, like
    ``proof.block``'s patched-range exit.  The difference shows what the CPU finds at the target
    once the jump is written: the original instruction there, and the patched bytes' decode.  The
    verdict needs no particular jump: the 5 bytes written over [A, A+5) replace the first bytes of
    the instruction at the target.  The displacement shown is the one to T (the real jump aims at
    the slot's template, before T), so its exact bytes are an illustration."""
    block = answer.block
    run = b"".join(i.raw for i in block.instructions)
    patched = b"\xe9" + (block.tramp - block.address - 5 + (1 << 32)).to_bytes(8, "little")[:4] + run[5:]
    differences = []
    for e in answer.entries:
        k = (e.target - block.address) & ((1 << 64) - 1)
        before = decode(run[k:], e.target)
        after = decode(patched[k:], e.target)
        differences.append(Difference(
            f"patched-range entry at {e.target:#x}",
            f"{e.source:#x} ({e.where}, {e.how}) reaches {_text(before)}",
            f"it lands {k} byte(s) into the probe's jmp: {patched[k:5].hex()} {_text(after)}"))
    cex = Counterexample((), (), tuple(differences), run.hex(), block.address, block.tramp, block.trampoline.hex(),
                         replayed=None, replay_note="a transfer from other code into the overwritten bytes: no state "
                         "of the probed run is involved, so there is nothing to replay")
    first = answer.entries[0]
    return ProofResult(Verdict.REFUTED, f"{first.source:#x} in {first.where} ({first.how}) transfers to {first.target:#x}, "
                       f"inside the bytes the probe's jmp overwrites; the tracer's checks do not see it",
                       "patched-range entry", cex)


def _text(d) -> str:
    return d.text if isinstance(d, Instruction) else f"(no instruction: {d.reason})"
