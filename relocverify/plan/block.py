"""Plan a jump-optimized probe: the run of whole instructions a 5-byte ``jmp rel32`` overwrites.

kprobes' optprobes (arch/x86/kernel/kprobes/opt.c) replace the probed
instruction at A, and as many following ones as it takes to cover
``JUMP_SIZE`` bytes, with ``jmp T``.  The trampoline at T must then run the
whole patched range [A, A+L) and leave where the original run would.

``plan_block(decoded, tramp)`` returns a frozen ``BlockPlan`` or a
``NoBlock`` value (never raises for input it cannot plan).  Instruction i
(at A_i) is planned with ``plan.make_plan`` at T_i, its continuation linked to
T_{i+1}, the next instruction's relocation; the last one continues at A+L.
The trampoline is those relocations back to back (a scratch plan's save
slot, zero-filled, before the next one), so T_0 = T and every T_i is the
image of A_i: the correspondence ``proof.block`` proves the block under.

Refused, each with a ``NoBlock.key`` for counting:

* ``undecodable``        an instruction of the range does not decode (or the decoders disagree);
* ``past-function-end``  the instructions given cover fewer than 5 bytes;
* ``rejected``           an instruction the single-instruction policy rejects (int3, ud2, hlt, syscall ...);
* ``call-in-range``      a call: its copy pushes a return address inside the trampoline, and an
                         emulated one needs the trap handler a jump probe does not have;
* ``emulated``           any other emulate plan (ret, indirect jmp, out-of-reach branches): emulation
                         runs in the int3 handler, and a jump probe has none;
* ``branch-into-range``  a branch (or RIP-relative operand) of the range aims strictly inside
                         (A, A+L): those bytes are the jump's once patched;
* ``tramp-overlap``      the trampoline overlaps the patched range.

Not decided here: whether the rest of the function or image jumps into the
range, or whether the range holds a kernel site (``kernel.patch_range``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..x86.instruction import Decoded, Instruction
from ..x86.registers import MASK64
from .plan import Plan, PlanKind, make_plan

JUMP_SIZE = 5  # jmp rel32: what the probe writes at A
_LINK_TRIES = 4
_PLACEHOLDER = 64  # a guess at the next relocation's distance (any near address gives a rel32 link)


@dataclass(frozen=True)
class BlockPlan:
    """The relocation of the patched range [address, address+length) to ``tramp``.

    ``starts[i]`` is T_i, where instruction i's relocation begins (``starts[0] == tramp``);
    ``plans[i]`` is that relocation as linked into the block (``plans[i].trampoline`` is
    ``trampoline[starts[i]-tramp:...]``).  ``tracer_memory`` is the whole trampoline, save
    slots included."""

    address: int
    length: int
    tramp: int
    instructions: tuple[Instruction, ...]
    plans: tuple[Plan, ...]
    starts: tuple[int, ...]
    trampoline: bytes
    tracer_memory: tuple[tuple[int, int], ...]
    rule: str = "block"
    reason: str = ""

    @property
    def end(self) -> int:
        return (self.address + self.length) & MASK64

    @property
    def boundaries(self) -> tuple[int, ...]:
        """A_0 .. A_{k-1}: the instruction boundaries of the range."""
        return tuple(insn.address for insn in self.instructions)

    @property
    def save_slots(self) -> tuple[tuple[int, int], ...]:
        return tuple((p.save_slot, 8) for p in self.plans if p.save_slot is not None)

    def piece(self, i: int) -> bytes:
        """The bytes of instruction i's relocation (up to the next T_i, or the trampoline's end)."""
        lo = self.starts[i] - self.tramp
        hi = self.starts[i + 1] - self.tramp if i + 1 < len(self.starts) else len(self.trampoline)
        return self.trampoline[lo:hi]

    def as_json(self) -> dict:
        return {
            "address": hex(self.address),
            "length": self.length,
            "tramp": hex(self.tramp),
            "rule": self.rule,
            "reason": self.reason,
            "instructions": [insn.raw.hex() for insn in self.instructions],
            "starts": [hex(t) for t in self.starts],
            "plans": [p.as_json() for p in self.plans],
            "trampoline": self.trampoline.hex(),
            "tracer_memory": [[hex(a), n] for a, n in self.tracer_memory],
        }


@dataclass(frozen=True)
class NoBlock:
    """No jump probe here: ``reason`` says why, ``key`` is a stable bucket for counting."""

    reason: str
    key: str = "rejected"


def patched_run(decoded: Sequence[Decoded]) -> list[Decoded] | NoBlock:
    """The smallest prefix of ``decoded`` covering ``JUMP_SIZE`` bytes from its first address."""
    if not decoded:
        return NoBlock("no instructions given", "past-function-end")
    start = decoded[0].address
    run: list[Decoded] = []
    covered = 0
    for d in decoded:
        if covered >= JUMP_SIZE:
            break
        if d.address != (start + covered) & MASK64:
            raise ValueError(f"instructions are not consecutive: {d.address:#x} after {start + covered:#x}")
        run.append(d)
        covered += d.length
        if not isinstance(d, Instruction):
            return NoBlock(f"the instruction at {d.address:#x} does not decode: {d.reason}", "undecodable")
    if covered < JUMP_SIZE:
        return NoBlock(f"only {covered} bytes of whole instructions from {start:#x}: a {JUMP_SIZE}-byte jump "
                       f"would overwrite what follows", "past-function-end")
    return run


def call_reason(call: int, a: int, end: int) -> str:
    """Why a run [a, end) with a call at ``call`` is refused (``engine.jumps`` says it the same way when
    it refuses a run from its instructions' keys, without decoding them)."""
    return (f"a call at {call:#x} in the range [{a:#x}, {end:#x}): its copy would return into the trampoline, "
            f"and emulating it needs the trap handler a jump probe has not")


def is_call(insn: Instruction) -> bool:
    """Whether ``plan_block`` refuses a run holding ``insn`` as ``call-in-range`` (when no instruction
    before it in the run is refused first)."""
    return insn.opname == "call" and insn.flow in ("call", "indirect_call")


def _refusal(insn: Instruction, a: int, end: int) -> NoBlock | None:
    if is_call(insn):
        return NoBlock(call_reason(insn.address, a, end), "call-in-range")
    target = insn.branch_target
    if target is not None and a < target < end:
        return NoBlock(f"{insn.text} at {insn.address:#x} branches to {target:#x}, inside the patched range "
                       f"[{a:#x}, {end:#x}): those bytes are the jump's once patched", "branch-into-range")
    rip = insn.rip_target
    if rip is not None and (rip - a) & MASK64 < end - a:
        return NoBlock(f"{insn.text} at {insn.address:#x} addresses {rip:#x}, inside the patched range: "
                       f"it would read the jump's bytes", "branch-into-range")
    return None


def _plan_linked(insn: Instruction, t: int, rules, last: bool, end: int) -> Plan | NoBlock:
    """Instruction ``insn`` planned at ``t``, continuing at the next relocation (or ``end`` when last)."""
    if last:
        return make_plan(insn, t, rules, resume=end)
    nxt = t + _PLACEHOLDER
    for _ in range(_LINK_TRIES):
        plan = make_plan(insn, t, rules, resume=nxt)
        if plan.kind in (PlanKind.REJECT, PlanKind.EMULATE):
            return plan
        found = _next_start(plan)
        if found == nxt:
            return plan
        nxt = found
    return NoBlock(f"the relocation of {insn.text} at {insn.address:#x} did not settle on a length", "rejected")


def _next_start(plan: Plan) -> int:
    """Where the next relocation may start: after the code and after any save slot."""
    end = plan.tramp + len(plan.trampoline)
    if plan.save_slot is not None:
        end = max(end, plan.save_slot + 8)
    return end & MASK64


def plan_block(decoded: Sequence[Decoded], tramp: int, rules=None) -> BlockPlan | NoBlock:
    """Plan a jump probe at ``decoded[0].address`` with its trampoline at ``tramp``.

    ``decoded`` are consecutive decoded instructions starting at A, enough to
    cover ``JUMP_SIZE`` bytes (more are ignored); ``rules`` is the policy table
    (``policy.POLICIES``; the kernel's by default).  See the module doc for
    what is refused."""
    tramp &= MASK64
    run = patched_run(decoded)
    if isinstance(run, NoBlock):
        return run
    a = run[0].address
    length = sum(d.length for d in run)
    end = (a + length) & MASK64
    for insn in run:
        refused = _refusal(insn, a, end)
        if refused is not None:
            return refused
    plans: list[Plan] = []
    starts: list[int] = []
    code = bytearray()
    t = tramp
    for i, insn in enumerate(run):
        plan = _plan_linked(insn, t, rules, i == len(run) - 1, end)
        if isinstance(plan, NoBlock):
            return plan
        if plan.kind is PlanKind.REJECT:
            return NoBlock(f"{insn.text} at {insn.address:#x} is not relocatable: {plan.reason}", "rejected")
        if plan.kind is PlanKind.EMULATE:
            return NoBlock(f"{insn.text} at {insn.address:#x} can only be emulated ({plan.rule}), and emulation "
                           f"runs in the int3 handler, which a jump probe does not have", "emulated")
        starts.append(t)
        plans.append(plan)
        nxt = _next_start(plan)
        code += plan.trampoline + bytes(nxt - t - len(plan.trampoline))
        t = nxt
    if (tramp - a) & MASK64 < length or (a - tramp) & MASK64 < len(code):
        return NoBlock(f"the trampoline at {tramp:#x} overlaps the patched range [{a:#x}, {end:#x})",
                       "tramp-overlap")
    kinds = ", ".join(f"{p.kind.value} ({p.rule})" for p in plans)
    return BlockPlan(a, length, tramp, tuple(run), tuple(plans), tuple(starts), bytes(code),
                     ((tramp, len(code)),), "block",
                     f"{len(run)} instruction{'s' if len(run) > 1 else ''} in [{a:#x}, {end:#x}) relocated "
                     f"back to back: {kinds}; then on to {end:#x}")
