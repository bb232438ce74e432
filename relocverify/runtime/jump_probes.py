"""Jump-optimized probes (kprobes' optprobes) on the probe runtime, written by the
cross-modifying-code protocol.

A jump probe at A replaces the run of whole instructions [A, A+L) that covers
``plan.block.JUMP_SIZE`` bytes with ``jmp rel32`` to a trampoline of its own
(per probe, not per context, as optprobes have one detour buffer per probe)
in tracer memory (``JUMP_TRAMP_BASE``):

    T      nop             the callback slot: a unicorn code hook on T stops the run, the runtime
                           calls every consumer ``callback(A, context)``, and resumes at T+1
    T+1    the block       ``plan_block``'s linked relocations of [A, A+L), then a jump to A+L

(``JumpTrampolines``: the slots, written once each, and the hook on them.)

``JumpProbes(kernel, verdicts).enable_jump(address, callback)`` writes
anything only if (1) the live bytes (boot patches applied, probes' bytes
left out) from A plan as a block at T+1 (``plan.block.plan_block``), (2)
``proof.block.prove_block`` proves it (``Verdict.PROVED``), (3)
``kernel.patch_range.PatchRanges.refusal`` finds the range safe (no branch
from elsewhere into it, no kernel site in it), (4) no kernel site the
policy rejects overlaps it, and no other probe is enabled inside it.
Otherwise it returns ``JumpRefused`` (a ``probes.Refused`` with a ``key``)
and writes nothing; an int3 probe (``enable``) is still available there.

The protocol (Linux ``text_poke_bp``; the djprobes/LTTng discussion of the
Intel erratum on cross-modifying code), as data: ``Patch.steps`` is a list
of ``PatchStep(kind, writes)`` and ``apply_step`` applies exactly one, so a
test can stop between any two:

    enable   int3  A <- cc                 the probe is live from here (hits run its callbacks)
             sync
             tail  A+1.. <- rel32, then cc up to A+L (the bytes no context may reach are
                   filled with int3, so that a stray entry traps instead of running a remnant)
             sync
             head  A <- e9
    disable  int3  A <- cc
             sync
             tail  A+1.. <- the original bytes
             sync
             head  A <- the original first byte (the probe is gone)

While the int3 is at A (between the first and last step of either
direction), a hit on it is handled as ``text_poke_bp``'s poke_int3_handler
does: it emulates the *new* instruction, a jump to T, whose hook runs the
callbacks once, and the trampoline returns at A+L.  It does not run the
single-instruction plan of A: that plan returns to A+len(A), inside the
range, which a context could reach after the tail is written (the
interleaving test shows that order tearing).  A trampoline is never
written again while the runtime lives (a probe re-enabled at the same
address gets the same bytes at the same slot), so a context still inside
one after ``disable`` finishes there safely.

Sync semantics (the analogue of optprobes' ``synchronize_rcu_tasks``): a
``sync`` step looks at every call in flight on this runtime (``start``ed and
not stopped) and *defers* (returns ``Deferred``, applies nothing) while any of
them is stopped with its rip strictly inside (A, A+L), or in tracer memory
(a trampoline: it may jump back into the range; the check is conservative
and does not decode where).  The caller runs the contexts further and tries
again; the step never runs a context itself.  Return addresses on a
context's stack are not inspected: ``plan_block`` refuses calls in the
range, so none can point into it.  A write step needs no check: after the
sync before it, no context is inside the range, and one entering it meets
the int3 at A.

``Interleaving`` is the harness for the protocol: it runs a call on one
context, stops it before its k-th instruction fetch in the function, applies
one step, resumes, and checks every fetch inside a patched range against
the three things it may be (``Torn`` otherwise): the original instruction
at that address, the int3 at A, or the complete ``jmp rel32`` at A.

``JumpDifferential`` is ``runtime.differential.Differential`` with jump probes
where they are proved and safe and int3 probes elsewhere (``relocverify run
--jump-probes``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
import iced_x86
from unicorn import UC_HOOK_CODE
from unicorn import x86_const as X

from ..concrete.machine import is_rep_string
from ..image.functions import find_functions
from ..kernel.patch_range import PatchRanges
from ..kernel.sites import POLICY_BY_KIND
from ..plan.block import plan_block
from ..proof.verdict import Verdict
from ..x86.decode import decode
from ..x86.registers import MASK64
from .differential import DEFAULT_BUDGET, Differential, Function, live_instructions
from .kernel import DEFAULT_CPU_FEATURES, KernelMachine
from .probes import Callback, Enabled, ProbeRuntime, Refused, Stop, Thread, Probe
from .verdicts import LiveVerdicts

JUMP_TRAMP_BASE = 0xFFFFFFFFC0080000  # module space: within rel32 reach of text, clear of the contexts' pages
JUMP_TRAMP_SIZE = 0x40000
HOOK_SLOT = b"\x90"  # at T: never executed (the hook stops before it, and the run resumes at T+1)
SLOT_ALIGN = 16
INT3 = b"\xcc"
JMP_REL32 = 0xE9
PROOF_TIMEOUT_MS = 10_000


@dataclass(frozen=True)
class PatchStep:
    """One step of the protocol: ``kind`` is 'int3', 'sync', 'tail' or 'head'; ``writes`` (address, bytes)."""

    kind: str
    writes: tuple[tuple[int, bytes], ...] = ()

    def __str__(self) -> str:
        what = ", ".join(f"{a:#x} <- {b.hex()}" for a, b in self.writes)
        return f"{self.kind}({what})" if what else self.kind


@dataclass(frozen=True)
class JumpRefused(Refused):
    """A jump probe refused: ``key`` is the bucket for counting, ``reason`` the sentence."""

    key: str = ""


@dataclass(frozen=True)
class JumpEnabled:
    address: int
    length: int
    tramp: int
    instructions: int
    steps: tuple[PatchStep, ...]


@dataclass(frozen=True)
class Deferred:
    """A sync step that could not complete: the contexts still inside the range or in a trampoline.
    ``patch`` is the protocol in flight: run those contexts on, then ``finish(patch)``."""

    step: int
    contexts: tuple[int, ...]
    reason: str
    patch: "Patch | None" = field(default=None, compare=False, repr=False)


@dataclass
class JumpProbe:
    address: int
    length: int
    original: bytes  # the live bytes of [A, A+L) before the patch
    boundaries: tuple[int, ...]  # the original instruction starts in [A, A+L)
    tramp: int  # the callback slot; the block starts at tramp + 1
    block: object  # plan.block.BlockPlan
    consumers: list[Callback] = field(default_factory=list)
    state: str = "prepared"  # prepared, enabling, enabled, disabling, removed

    @property
    def end(self) -> int:
        return self.address + self.length

    @property
    def jump(self) -> bytes:
        rel = (self.tramp - (self.address + 5)) & 0xFFFFFFFF
        return bytes([JMP_REL32]) + rel.to_bytes(4, "little")

    def original_at(self, address: int) -> bytes:
        """The original instruction at a boundary of the range."""
        i = self.boundaries.index(address)
        nxt = self.boundaries[i + 1] if i + 1 < len(self.boundaries) else self.end
        return self.original[address - self.address:nxt - self.address]

    def enabled(self) -> JumpEnabled:
        """What ``enable_jump`` answers for this probe."""
        return JumpEnabled(self.address, self.length, self.tramp, len(self.boundaries), self.enable_steps())

    def enable_steps(self) -> tuple[PatchStep, ...]:
        a = self.address
        return (PatchStep("int3", ((a, INT3),)), PatchStep("sync"),
                PatchStep("tail", ((a + 1, self.jump[1:] + INT3 * (self.length - 5)),)), PatchStep("sync"),
                PatchStep("head", ((a, self.jump[:1]),)))

    def disable_steps(self) -> tuple[PatchStep, ...]:
        a = self.address
        return (PatchStep("int3", ((a, INT3),)), PatchStep("sync"),
                PatchStep("tail", ((a + 1, self.original[1:]),)), PatchStep("sync"),
                PatchStep("head", ((a, self.original[:1]),)))


@dataclass
class Patch:
    """One run of the protocol in flight: ``steps`` (a test may reorder them), ``next`` to apply."""

    probe: JumpProbe
    direction: str  # 'enable' | 'disable'
    steps: tuple[PatchStep, ...]
    next: int = 0

    @property
    def done(self) -> bool:
        return self.next >= len(self.steps)


def _default_planner():
    return plan_block


def _default_prover():
    from ..proof.block import prove_block
    return prove_block


class JumpTrampolines:
    """The jump probes' trampolines in tracer memory (``JUMP_TRAMP_BASE``): for each (A, original bytes)
    one slot T, the callback slot then the proved block, planned, checked and written the first time
    and never written again; and the code hook on the callback slots, which records the one entered
    (``hit``) and stops the run.

    ``plan_block``, ``prove_block`` and ``patch_ranges`` are ``JumpProbes``'s (None: the defaults)."""

    def __init__(self, kernel: KernelMachine, plan_block=None, prove_block=None, patch_ranges=None,
                 timeout_ms: int = PROOF_TIMEOUT_MS):
        self.kernel = kernel
        self.plan_block = plan_block or _default_planner()
        self.prove_block = prove_block or _default_prover()
        self._patch_ranges = patch_ranges
        self.timeout_ms = timeout_ms
        kernel.uc.mem_map(JUMP_TRAMP_BASE, JUMP_TRAMP_SIZE)
        self._free = JUMP_TRAMP_BASE
        self._slots: dict[tuple[int, bytes], tuple[int, object]] = {}  # (A, original) -> (T, block), proved
        self._entries: set[int] = set()  # every trampoline's callback slot ever written
        self.hit: int | None = None  # the callback slot the run stopped at (the runtime clears it per run)
        kernel.uc.hook_add(UC_HOOK_CODE, self._on_code, begin=JUMP_TRAMP_BASE,
                           end=JUMP_TRAMP_BASE + JUMP_TRAMP_SIZE - 1)

    def patch_ranges(self):
        """The ``PatchRanges`` a block's range is checked against (the image's, made on first use, unless given)."""
        if self._patch_ranges is None:
            self._patch_ranges = PatchRanges(self.kernel.image, find_functions(self.kernel.image),
                                             self.kernel.sites)
        return self._patch_ranges

    def slot(self, address: int, original: bytes, decoded, fn: Function) -> tuple[int, object] | JumpRefused:
        """(T, block) for the live bytes ``original`` at ``address`` (``decoded``, in ``fn``): the same
        slot every time after the first, which plans, checks, proves and writes it."""
        key = (address, original)
        if key not in self._slots:
            made = self._plan_and_prove(address, decoded, fn)
            if isinstance(made, JumpRefused):
                return made
            self._slots[key] = made
        return self._slots[key]

    def _plan_and_prove(self, address: int, decoded, fn: Function) -> tuple[int, object] | JumpRefused:
        tramp = (self._free + SLOT_ALIGN - 1) & ~(SLOT_ALIGN - 1)
        block = self.plan_block(decoded, tramp + len(HOOK_SLOT))
        if not hasattr(block, "trampoline"):
            return JumpRefused(address, Verdict.REJECTED.value, f"block: {block.reason}", f"block:{block.key}")
        refusal = self.patch_ranges().refusal(fn, address, block.length)
        if refusal is not None:
            return JumpRefused(address, Verdict.REJECTED.value, f"patch range: {refusal.reason}",
                               f"range:{refusal.key}")
        proof = self.prove_block(block, self.timeout_ms)
        if proof.verdict is not Verdict.PROVED:
            return JumpRefused(address, proof.verdict.value, f"block proof: {getattr(proof, 'reason', '')}",
                               f"proof:{proof.verdict.value}")
        code = HOOK_SLOT + block.trampoline
        if tramp + len(code) > JUMP_TRAMP_BASE + JUMP_TRAMP_SIZE:
            return JumpRefused(address, Verdict.REJECTED.value, "the jump trampoline area is full", "tramp-full")
        self.kernel.write_code(tramp, code)
        self._free = tramp + len(code)
        self._entries.add(tramp)
        return tramp, block

    def _on_code(self, uc, address: int, _size, _data) -> None:
        if address in self._entries:
            self.hit = address
            uc.emu_stop()


class JumpProbes(ProbeRuntime):
    """``ProbeRuntime`` with jump probes beside the int3 ones (see the module doc).

    ``plan_block``, ``prove_block`` and ``patch_ranges`` default to ``plan.block``,
    ``proof.block`` and ``kernel.patch_range.PatchRanges`` over the image; its ``trampolines``
    (``JumpTrampolines``) hold them."""

    def __init__(self, kernel: KernelMachine, verdicts, plan_block=None, prove_block=None, patch_ranges=None,
                 timeout_ms: int = PROOF_TIMEOUT_MS):
        super().__init__(kernel, verdicts)
        self.trampolines = JumpTrampolines(kernel, plan_block, prove_block, patch_ranges, timeout_ms)
        self._jumps: dict[int, JumpProbe] = {}
        self._threads: list[Thread] = []
        self.paused = False  # set by a code hook that stopped the run on purpose (``Interleaving``)
        self.running: Thread | None = None  # the call unicorn runs now

    # -- what the base runtime must see ---------------------------------------------
    @property
    def tracer_ranges(self) -> tuple[tuple[int, int], ...]:
        return super().tracer_ranges + ((JUMP_TRAMP_BASE, JUMP_TRAMP_SIZE),)

    def read_live(self, address: int, size: int) -> bytes:
        live = bytearray(super().read_live(address, size))
        for j in self._jumps.values():
            for i, b in enumerate(j.original):
                if address <= j.address + i < address + size:
                    live[j.address + i - address] = b
        return bytes(live)

    def jump_probes(self) -> list[JumpProbe]:
        return list(self._jumps.values())

    def jump_at(self, address: int) -> JumpProbe | None:
        return self._jumps.get(address & MASK64)

    def covering_jump(self, address: int) -> JumpProbe | None:
        """The jump probe whose range [A, A+L) holds ``address``."""
        return next((j for j in self._jumps.values() if j.address <= address < j.end), None)

    # -- int3 probes next to jump probes ------------------------------------------------
    def enable(self, address: int, callback: Callback) -> Enabled | Refused:
        address &= MASK64
        j = self.covering_jump(address)
        if j is not None and address != j.address:
            return Refused(address, Verdict.REJECTED.value,
                           f"{address:#x} is inside the jump probe at {j.address:#x} (its bytes are the jump's)")
        if j is not None and address not in self._probes:
            j.consumers.append(callback)  # prepared or enabled: share its callbacks
            return Enabled(address, len(j.original_at(address)), "jump probe", ())
        return super().enable(address, callback)

    def disable(self, address: int, callback: Callback | None = None) -> bool:
        j = self.jump_at(address)
        if j is None:
            return super().disable(address, callback)
        self.disable_jump(address, callback)
        return True

    # -- jump probes ----------------------------------------------------------------------
    def enable_jump(self, address: int, callback: Callback) -> JumpEnabled | JumpRefused | Deferred:
        """Plan, prove, check and patch with every step; a sync that cannot complete (a call in
        flight inside the range) leaves the patch half done and returns ``Deferred``: finish it
        with ``finish``."""
        patch = self.begin_enable(address, callback)
        if not isinstance(patch, Patch):
            return patch
        done = self.finish(patch)
        if isinstance(done, Deferred):
            return done
        return patch.probe.enabled()

    def disable_jump(self, address: int, callback: Callback | None = None) -> Patch | Deferred | None:
        """Remove ``callback`` (None: all); with the last one, run the disable protocol."""
        j = self.jump_at(address)
        if j is None:
            return None
        if callback is None:
            j.consumers.clear()
        elif callback in j.consumers:
            j.consumers.remove(callback)
        if j.consumers:
            return None
        patch = self.begin_disable(address)
        done = self.finish(patch)
        return done if isinstance(done, Deferred) else patch

    def begin_enable(self, address: int, callback: Callback) -> Patch | JumpEnabled | JumpRefused:
        """The checks and the trampoline (tracer memory only); the text is untouched until ``apply_step``."""
        address &= MASK64
        j = self._jumps.get(address)
        if j is not None:
            j.consumers.append(callback)
            return j.enabled()
        made = self._prepare(address)
        if isinstance(made, JumpRefused):
            return made
        made.consumers.append(callback)
        self._jumps[address] = made
        made.state = "enabling"
        return Patch(made, "enable", made.enable_steps())

    def begin_disable(self, address: int) -> Patch:
        j = self._jumps[address & MASK64]
        j.state = "disabling"
        return Patch(j, "disable", j.disable_steps())

    def finish(self, patch: Patch) -> Patch | Deferred:
        while not patch.done:
            r = self.apply_step(patch)
            if isinstance(r, Deferred):
                return r
        return patch

    def apply_step(self, patch: Patch) -> PatchStep | Deferred:
        """Apply ``patch.steps[patch.next]`` (a sync may defer); the last step settles the probe."""
        step = patch.steps[patch.next]
        if step.kind == "sync":
            inside = self.inside(patch.probe)
            if inside:
                return Deferred(patch.next, tuple(t.context.index for t in inside),
                                f"context(s) {', '.join(str(t.context.index) for t in inside)} inside "
                                f"[{patch.probe.address:#x}, {patch.probe.end:#x}) or in a trampoline", patch)
        for address, data in step.writes:
            self.kernel.write_code(address, data)
        if step.kind == "int3" and patch.probe.address not in self._probes:
            self._install_trap(patch.probe)
        patch.next += 1
        if patch.done:
            self._settle(patch)
        return step

    def inside(self, j: JumpProbe) -> list[Thread]:
        """The calls in flight a sync waits for (see the module doc)."""
        out = []
        for t in self._threads:
            if t.stop is not None:
                continue
            rip = t.regs["rip"]
            if j.address < rip < j.end or any(0 <= rip - s < n for s, n in self.tracer_ranges):
                out.append(t)
        return out

    def _install_trap(self, j: JumpProbe) -> None:
        first = j.original_at(j.address)
        self._probes[j.address] = Probe(j.address, first, [], j.consumers)

    def _settle(self, patch: Patch) -> None:
        j = patch.probe
        if patch.direction == "enable":
            j.state = "enabled"
            return
        j.state = "removed"
        self._probes.pop(j.address, None)
        del self._jumps[j.address]

    def _prepare(self, address: int) -> JumpProbe | JumpRefused:
        def refuse(key: str, reason: str, verdict: str = Verdict.REJECTED.value) -> JumpRefused:
            return JumpRefused(address, verdict, reason, key)

        if not self.kernel.image.is_executable(address):
            return refuse("not-text", f"{address:#x} is not in an executable section")
        problem = self._bounds.boundary_problem(address, self.read_live)
        if problem:
            return refuse("boundary", problem)
        fn = Function("", *self._bounds.span_of(address))
        live = self.read_live(address, min(fn.end - address, 5 * 15))
        decoded = []
        covered = 0
        while covered < 5 and covered < len(live):
            d = decode(live[covered:], address + covered)
            decoded.append(d)
            covered += max(d.length, 1)
        length = sum(d.length for d in decoded)
        original = live[:length]
        for j in self._jumps.values():
            if j.address < address + length and address < j.end:
                return refuse("probe-in-range", f"the jump probe at {j.address:#x} overlaps [{address:#x}, "
                                                f"{address + length:#x})")
        for p in self._probes:
            if address <= p < address + length:
                return refuse("probe-in-range", f"an int3 probe at {p:#x} is inside [{address:#x}, "
                                                f"{address + length:#x}): disable it first")
        for site in self.kernel.sites.sites_at(address, max(length, 1)):
            policy = POLICY_BY_KIND.get(site.kind)
            if policy is not None and policy.consequence == "reject":
                return refuse(f"site:{site.kind}", f"site {site.kind} at {site.address:#x}: {policy.reason}")
        made = self.trampolines.slot(address, original, decoded, fn)
        if isinstance(made, JumpRefused):
            return made
        tramp, block = made
        boundaries = tuple(i.address for i in block.instructions)
        return JumpProbe(address, block.length, bytes(original[:block.length]), boundaries, tramp, block)

    # -- running: the trampolines' callback slot, and traps during the protocol ----------------
    def start(self, context, entry: int, regs: dict[str, int]) -> Thread:
        t = super().start(context, entry, regs)
        self._threads = [x for x in self._threads if x.stop is None and x.context != context] + [t]
        return t

    def forget(self, t: Thread) -> None:
        """Abandon a call in flight: syncs stop waiting for it."""
        self._threads = [x for x in self._threads if x is not t]

    def rollback(self) -> None:
        """The base rollback; calls still in flight are forgotten (the memory they ran on is gone)."""
        super().rollback()
        self._threads.clear()

    def _load(self, t: Thread) -> None:
        self.running = t
        super()._load(t)

    def _segment(self, t: Thread, until: int, count: int) -> None:
        self.trampolines.hit = None
        self.paused = False
        super()._segment(t, until, count)
        stopped_here = t.stop is not None and t.stop.kind == "budget"
        if self.paused and stopped_here:
            t.stop = None
        elif self.trampolines.hit is not None and stopped_here:
            t.stop = None
            t.traps += 1
            tramp = self.trampolines.hit
            owner = next((j for j in self._jumps.values() if j.tramp == tramp), None)
            for callback in list(owner.consumers if owner is not None else ()):
                callback(owner.address, t.context)
            self.uc.reg_write(X.UC_X86_REG_RIP, tramp + len(HOOK_SLOT))

    def _handle(self, t: Thread, address: int) -> None:
        j = self._jumps.get(address)
        if j is None:
            super()._handle(t, address)
            return
        # poke_int3_handler: emulate the new instruction, the jump to T (whose hook runs the callbacks)
        self.uc.reg_write(X.UC_X86_REG_RIP, j.tramp)


# -- the interleaving harness ----------------------------------------------------------------


@dataclass(frozen=True)
class Torn:
    """A fetch inside a patched range that is none of: the original instruction, int3 at A, jmp at A."""

    context: int
    step: str  # the protocol steps applied so far
    address: int
    fetched: bytes
    allowed: tuple[bytes, ...]

    def __str__(self) -> str:
        return (f"context {self.context} fetched {self.fetched.hex()} at {self.address:#x} after [{self.step}]; "
                f"allowed: {' or '.join(b.hex() for b in self.allowed) or 'nothing (not an instruction start)'}")


@dataclass
class Interleaving:
    """One call on ``thread``'s context, stopped at fetch ``k`` of ``fn``'s text, for one patch.

    ``run_until(k)`` runs the call until it has fetched ``k`` instructions of ``fn`` (counted over
    its whole run) and stops before the next; ``advance(patch)`` applies one step, and on a
    deferred sync lets the call fetch one more instruction and tries again.  Every fetch in
    ``[A, A+L)`` of a watched probe is checked (``torn``); ``fetches_at_head`` counts the fetches
    at A by form ('original', 'int3', 'jmp').  With ``in_trampoline`` the fetches of the probe's
    trampoline count too, so that the call can be stopped inside it."""

    runtime: JumpProbes
    fn: Function
    probe: JumpProbe
    thread: Thread
    budget: int = 100_000
    fetched: int = 0
    torn: list[Torn] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    fetches_at_head: Counter = field(default_factory=Counter)
    deferrals: int = 0
    in_trampoline: bool = False
    _pause_at: int | None = None
    _last: int | None = None

    def __post_init__(self):
        uc = self.runtime.uc
        self._hooks = [uc.hook_add(UC_HOOK_CODE, self._on_code, begin=self.fn.start, end=self.fn.end - 1)]
        if self.in_trampoline:
            j = self.probe
            self._hooks.append(uc.hook_add(UC_HOOK_CODE, self._on_code, begin=j.tramp,
                                           end=j.tramp + len(HOOK_SLOT) + len(j.block.trampoline) - 1))

    def close(self) -> None:
        for h in self._hooks:
            self.runtime.uc.hook_del(h)

    def _on_code(self, uc, address: int, size: int, _data) -> None:
        if self.runtime.running is not self.thread:
            return  # another context's fetch: its own Interleaving checks it
        if self._pause_at is not None and self.fetched >= self._pause_at:
            self.runtime.paused = True
            uc.emu_stop()  # stops before this instruction: it is fetched again on resume
            return
        self.fetched += 1
        j = self.probe
        if not j.address <= address < j.end:
            self._last = None
            return
        mem = bytes(uc.mem_read(address, 15))
        allowed = self.allowed(address)
        form = next((f for f, b in allowed if mem.startswith(b)), None)
        if form is None:
            self.torn.append(Torn(self.thread.context.index, ", ".join(self.applied) or "nothing", address,
                                  _instruction_bytes(mem, address), tuple(b for _, b in allowed)))
        if address == j.address:
            if not (self._last == address and is_rep_string(mem)):
                self.fetches_at_head[form or "torn"] += 1
        self._last = address

    def allowed(self, address: int) -> list[tuple[str, bytes]]:
        j = self.probe
        out = []
        if address in j.boundaries:
            out.append(("original", j.original_at(address)))
        if address == j.address:
            out += [("int3", INT3), ("jmp", j.jump)]
        return out

    def run_until(self, k: int | None) -> Stop | None:
        """Run until ``k`` fetches (None: to the end); the call's Stop when it ended."""
        self._pause_at = k
        t = self.thread
        try:
            while t.stop is None:
                self.runtime.step(t, self.budget)
                if self.runtime.paused:
                    break
        finally:
            self._pause_at = None
        return t.stop

    def advance(self, patch: Patch) -> int:
        """Apply the next step of ``patch``; a deferred sync fetches one more instruction and retries.
        Returns the deferrals."""
        n = 0
        while True:
            r = self.runtime.apply_step(patch)
            if not isinstance(r, Deferred):
                self.applied.append(f"{patch.direction} {r.kind}")
                return n
            n += 1
            self.deferrals += 1
            if self.run_until(self.fetched + 1) is not None:
                continue  # ended: the next try finds it gone


def _instruction_bytes(mem: bytes, address: int) -> bytes:
    ins = iced_x86.Decoder(64, mem, ip=address).decode()
    return mem[:ins.len] if not ins.is_invalid and ins.len else mem[:1]


# -- relocverify run --jump-probes -------------------------------------------------------------


class JumpDifferential(Differential):
    """``Differential`` with jump probes where proved and safe, int3 probes elsewhere.

    Instructions inside a jump probe's range (after A) run in its trampoline, not in the text:
    the reference's counts leave them out, and A's count is compared with the jump probe's hits."""

    def __init__(self, image, cpu_features=frozenset(DEFAULT_CPU_FEATURES), sites=None, verdicts=None,
                 budget: int = DEFAULT_BUDGET, **jump_options):
        # Differential.__init__ with a JumpProbes runtime (a second runtime's hooks on one machine would
        # run twice)
        self.image = image
        self.budget = budget
        self.reference = KernelMachine(image, cpu_features, sites=sites)
        self.kernel = KernelMachine(image, cpu_features, sites=self.reference.sites)
        self.ref_runtime = ProbeRuntime(self.reference, None)
        self.runtime = JumpProbes(self.kernel, verdicts or LiveVerdicts(self.kernel.sites), **jump_options)
        self.hits: dict[int, int] = {}
        self.summary: Counter = Counter()

    def probe(self, fn: Function, probe_all: bool) -> tuple[list[Enabled], list[Refused]]:
        enabled, refused = [], []
        insns = live_instructions(self.runtime, fn)
        covered: set[int] = set()
        self.summary = Counter()
        for ins in insns if probe_all else insns[:1]:
            if ins.code == iced_x86.Code.INT3 or ins.ip in covered:
                continue
            got = self.runtime.enable_jump(ins.ip, self._count_hit)
            if isinstance(got, JumpEnabled):
                self.summary["jump"] += 1
                covered.update(range(got.address + 1, got.address + got.length))
                enabled.append(Enabled(got.address, got.length, "jump probe", ()))
                continue
            if isinstance(got, Deferred):  # no call is in flight between trials
                raise RuntimeError(f"placing a jump probe at {ins.ip:#x} with a call in flight: {got.reason}")
            self.summary[f"jump refused: {got.key}"] += 1
            r = self.runtime.enable(ins.ip, self._count_hit)
            if isinstance(r, Enabled):
                self.summary["int3"] += 1
                enabled.append(r)
            else:
                refused.append(r)
        return enabled, refused

    def execute(self, runtime, fn, regs, memory, count_range):
        out = super().execute(runtime, fn, regs, memory, count_range)
        if runtime is self.ref_runtime and count_range is not None:
            for j in self.runtime.jump_probes():
                for a in range(j.address + 1, j.end):
                    out.counts.pop(a, None)
        return out

    def unprobe(self, enabled: list[Enabled]) -> None:
        for e in enabled:
            self.runtime.disable(e.address, self._count_hit)


def jump_summary_lines(summary: Counter) -> list[str]:
    refusals = sorted((k.split(": ", 1)[1], n) for k, n in summary.items() if k.startswith("jump refused"))
    lines = [f"jump probes: {summary.get('jump', 0)} placed; int3 probes: {summary.get('int3', 0)} placed"
             + (" (the instructions after A in a jump probe's range run in its trampoline: not counted)"
                if summary.get("jump") else "")]
    lines += [f"jump refused ({key}): {n}" for key, n in refusals]
    return lines


__all__ = ["JumpProbes", "JumpTrampolines", "JumpEnabled", "JumpRefused", "Deferred", "PatchStep", "Patch",
           "JumpProbe", "Interleaving", "Torn", "JumpDifferential", "jump_summary_lines"]
