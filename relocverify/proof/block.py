"""Prove a jump probe's trampoline equivalent to the run of instructions it replaces, or refute it.

The obligation generalises ``prove.py``'s from one instruction to the
patched range [A, A+L) of a ``plan.block.BlockPlan``: instructions
A_0 = A < A_1 < ... < A_{k-1}, relocated at T_0 = T < T_1 < ... < T_{k-1}.

  From one arbitrary machine state (registers, flags, all of memory, as in
  ``semantics.py``) run

  * the ORIGINAL run from A_s: each instruction lifted on its own at A_i; a
    concrete transfer to a later boundary A_j (j > i) is followed (fall
    through, a jcc over the next instruction); a transfer to A_j with j <= i
    (a rep string iteration, a loop back to A) is a final exit reported as
    A_j; every other transfer (A+L, a branch target outside) is final;
  * the RELOCATED trampoline from T_s: followed through its own bytes; a
    concrete transfer to T_j is followed when j is later than the piece it
    comes from, and otherwise is final and reported as A_j (the
    correspondence T_j <-> A_j generalises A <-> T); other targets inside the
    trampoline are followed; everything else is final.

  The two must end as in ``prove._check``: the same registers (RFLAGS as
  flags), the same bytes outside tracer memory, the same reads and the same
  writes in program order, the same fences, the same next RIP; and the
  relocation must never leave to an address strictly inside (A, A+L), whose
  bytes the probe's jump has overwritten (``patched-range exit``).

  s = 0 is the probe's own entry.  Every A_j (j > 0) that either side
  reports as a final exit is a point where the run starts over inside the
  range (a rep at A_j), so the obligation is proved from s = j too, until
  no new start appears: by induction over the exits, every way through
  the trampoline then matches a way through the original.

Kept from the single-instruction checker, per instruction i against its own
relocation (the trampoline from T_i to T_{i+1}): atomicity
(``check_atomicity``), the lift gaps (``opaque_lift_reason``: the block is
``unknown``), the lifter's known looseness (an instruction VEX models
loosely is trusted only if its relocation re-executes it, and a flag VEX
writes where the decoders say the instruction does not is found by
``smt.clobbered_flags``), and a SAT answer is ``refuted`` only when unicorn,
running the whole original range and the whole trampoline
(``replay_block``), sees a difference too; otherwise ``unknown``.  A
difference in ``patched-range exit`` alone is refuted without a replay, like
atomicity: the replay runs without the patch, where the jump's bytes are not.

Not modelled, as for single instructions: faults, other CPUs, and reads of
the range's own bytes by other code (every probe changes them; a RIP-relative
operand aimed into the range is refused by the planner).  Whether other code
jumps into (A, A+L) is ``kernel.patch_range``'s question, not this one.
"""

from __future__ import annotations

import bisect
import time
from types import SimpleNamespace

import claripy
import pyvex

from ..concrete.machine import MAX_STEPS, RELOCATION_MARGIN, execute, Machine, page_image, in_ranges, is_rep_string
from ..concrete.outcome import Difference, MachineState, with_code
from ..concrete.replay import Replay, compare
from ..plan.block import BlockPlan
from ..processes import refused
from ..x86.registers import MASK64
from ..text import one_line
from . import lift as L
from . import semantics as S
from . import smt
from .atomicity import atomic, check_atomicity
from .cache_key import role_of, shape_of, cache_tag, pc_fields
from .canonical import NotApplicable
from .fast_path import pure_jump_target
from .lifted import lifted, lifted_one
from .lift_gaps import opaque_lift_reason
from .admission import admit, reexecutes
from .machine_model import Context, check_machine, one_step
from .lifter_checks import flag_names, unaffected_flags
from .verdict import Counterexample, ProofResult, Verdict

DEFAULT_TIMEOUT_MS = 10_000
MAX_BLOCKS = 64
ESCAPE = "patched-range exit"


# ---------------------------------------------------------------------------
# The shape of a block
# ---------------------------------------------------------------------------


def _validate(block: BlockPlan) -> None:
    """A caller mistake (not a verdict) when the block's fields do not describe one range."""
    insns, starts = block.instructions, block.starts
    if not insns or len(insns) != len(starts):
        raise ValueError("a block needs one start T_i per instruction")
    if starts[0] != block.tramp or any(b <= a for a, b in zip(starts, starts[1:])):
        raise ValueError("block starts must begin at the trampoline and increase")
    if starts[-1] >= block.tramp + len(block.trampoline):
        raise ValueError("every block start must lie inside the trampoline")
    at = block.address
    for insn in insns:
        if insn.address != at:
            raise ValueError(f"instruction at {insn.address:#x} where {at:#x} was expected")
        at += insn.length
    if at - block.address != block.length:
        raise ValueError("the instructions do not cover the block's length")


def _run_bytes(block: BlockPlan) -> bytes:
    return b"".join(insn.raw for insn in block.instructions)


def _code(block: BlockPlan, i: int) -> bytes:
    """Instruction i's relocation: the plan's own bytes when the trampoline holds them there,
    else the whole piece up to T_{i+1} (a hand-made or mutated block)."""
    piece = block.piece(i)
    own = block.plans[i].trampoline if i < len(block.plans) else b""
    return own if own and piece.startswith(own) else piece


def _slots(block: BlockPlan) -> list[tuple[int, int]]:
    return [(p.save_slot, 8) for p in block.plans if p.save_slot is not None]


def _tracer_bytes(block: BlockPlan) -> dict[int, int]:
    slots = _slots(block)
    return {block.tramp + k: b for k, b in enumerate(block.trampoline)
            if not in_ranges(block.tramp + k, slots)}


# ---------------------------------------------------------------------------
# Running one side
# ---------------------------------------------------------------------------


def _run_side(world: S.World, code: bytes, base: int, starts: tuple[int, ...], reports: tuple[int, ...],
              first: int, one_insn: bool, forbidden: tuple[int, int] | None = None):
    """Run ``code`` (at ``base``) from ``starts[first]``; see the module doc for what is followed.

    Returns (final outcomes, escape guards, restarts): the guards under which a final target
    lies strictly inside ``forbidden`` = (lo, hi), and the indices j > 0 reported as final."""
    end = base + len(code)
    index = {t: j for j, t in enumerate(starts)}
    interp = S.Interpreter(world, starts[first], code, base)
    work = [(starts[first], S.IRPath(claripy.true()), first)]
    finals, escapes, restarts = [], [], set()
    blocks = 0
    while work:
        pc, path, piece = work.pop()
        blocks += 1
        if blocks > MAX_BLOCKS:
            raise L.Gap(f"the run went through more than {MAX_BLOCKS} blocks without leaving")
        if one_insn:
            n = (starts[piece + 1] if piece + 1 < len(starts) else end) - pc
            irsb = L.lift(code[pc - base:pc - base + n], pc, max_inst=1)
            if irsb.size != n:
                raise L.Gap(f"VEX decoded {irsb.size} bytes at {pc:#x} where the decoders decoded {n}")
        else:
            irsb = L.lift(code[pc - base:], pc)
        for p, tgt, jk in interp.run_block(irsb, path):
            if claripy.is_false(p.guard):
                continue
            normal = jk in L.NORMAL_JUMPKINDS
            if tgt.op == "BVV":
                v = tgt.args[0]
                j = index.get(v)
                if j is not None:
                    if j > piece and normal:
                        p.temps = {}
                        work.append((v, p, j))
                    else:
                        finals.append(S.way_out(p, claripy.BVV(reports[j], 64), jk))
                        if j:
                            restarts.add(j)
                    continue
                if not one_insn and base < v < end and normal:
                    p.temps = {}
                    work.append((v, p, bisect.bisect_right(starts, v) - 1))
                    continue
            finals.append(S.way_out(p, tgt, jk))
            if forbidden is not None:
                lo, hi = forbidden
                inside = claripy.And(claripy.UGT(tgt, lo), claripy.ULT(tgt, hi))
                if not claripy.is_false(inside):
                    escapes.append(claripy.And(p.guard, inside))
    return finals, escapes, restarts


# ---------------------------------------------------------------------------
# The concrete replay of a block
# ---------------------------------------------------------------------------


def replay_block(block: BlockPlan, state: MachineState, first: int = 0) -> Replay:
    """Run the original range from A_first and the trampoline from T_first on unicorn, on ``state``.

    Each side stops when control leaves its code, or comes to a boundary that is not later than
    the instruction it comes from (reported as that A_j; a rep string instruction iterating on
    itself keeps running, as in ``concrete.machine``)."""
    _validate(block)
    a, t = block.address, block.tramp
    bounds, starts = block.boundaries, block.starts
    run = _run_bytes(block)
    reps = [is_rep_string(insn.raw) for insn in block.instructions]
    a_index = {x: j for j, x in enumerate(bounds)}
    t_index = {x: j for j, x in enumerate(starts)}

    def piece_of(address: int, points) -> int:
        return bisect.bisect_right(points, address) - 1

    def leave_original(address: int, previous: int | None) -> int | None:
        j = a_index.get(address)
        if j is None:
            return None if in_ranges(address, ((a, block.length),)) else address
        if previous is not None and (j > piece_of(previous, bounds) or (reps[j] and previous == address)):
            return None
        return address

    def leave_relocated(address: int, previous: int | None) -> int | None:
        j = t_index.get(address)
        if j is None:
            return None if in_ranges(address, ((t, len(block.trampoline)),)) else address
        if previous is not None and (j > piece_of(previous, starts) or (reps[j] and previous == address)):
            return None
        return bounds[j]

    image = with_code(state, a, run)
    both = with_code(image, t, block.trampoline)
    start_a, start_t = bounds[first], starts[first]
    original = execute(Machine(page_image(image.memory), (start_a, a + block.length - start_a),
                                 leave_original, MAX_STEPS), image, ())
    relocated = execute(Machine(page_image(both.memory), (start_t, t + len(block.trampoline) - start_t),
                                  leave_relocated, MAX_STEPS + RELOCATION_MARGIN * len(starts)),
                         both, block.tracer_memory)
    return Replay(original, relocated, tuple(compare(original, relocated, block.tracer_memory)))


# ---------------------------------------------------------------------------
# The fast path
# ---------------------------------------------------------------------------


def block_fast_path(block: BlockPlan) -> bool:
    """Prove the block by IR identity, instruction by instruction, or return False (no conclusion).

    Argument.  For each i, instruction i lifted alone at A_i and the
    trampoline lifted at T_i up to T_{i+1} (piece i: a relocation that falls
    through into the next one, as optprobes' copies do, exits to T_{i+1})
    must have the same canonical IR
    (``canonical.canon_block``: temps renamed, rip never read, writes of
    rip dropped), with the relocation's exit targets mapped: T_j to A_j, a
    target inside the trampoline through the blocks there that only jump,
    one hop at a time (``pure_jump_target`` over the bytes up to the next
    piece), until it reaches some T_j or leaves the trampoline (a chain that
    ends elsewhere inside it proves nothing), and a target strictly inside
    (A, A+L) to no value at all (the identity fails); an exit the
    relocation computes (not a constant) is not taken here, since it might
    land inside (A, A+L).  Then by induction on
    the number of instructions executed, the original at A_i and the
    relocation at T_i, from equal states, run the same statements (the same
    reads, writes, fences and exit guards in the same order) and reach equal
    states at corresponding points: the same A_j / T_j pair, or the same
    address outside both codes.  This covers every start s and every
    forward or backward transfer of the module doc's obligation at once.
    """
    resolve = _resolver(block)
    return all(_same_ir(block, i, resolve) for i in range(len(block.instructions)))


def _resolver(block: BlockPlan):
    """The map of the fast path's exit targets (see ``block_fast_path``): T_j to A_j, a jump-only
    chain inside the trampoline followed, ``NotApplicable`` for what proves nothing."""
    t, end = block.tramp, block.tramp + len(block.trampoline)
    a, a_end = block.address, block.address + block.length
    to_a = dict(zip(block.starts, block.boundaries))
    bounds = sorted(set(block.starts) | {end})

    def hop(v: int) -> int:
        """Where the trampoline block at ``v``, which must only jump, goes: one hop, its code
        being the bytes up to the next piece (a jump's qword sits there)."""
        stop = bounds[bisect.bisect_right(bounds, v)]
        return pure_jump_target(block.trampoline[v - t:stop - t], v, v)

    def resolve(v: int):
        for _ in range(8):
            if v in to_a:
                return to_a[v]
            if not t < v < end:
                break
            v = hop(v)  # a link between pieces (``jmp T_j``), or a jump out
        else:
            raise NotApplicable("jump chain too long")
        if t <= v < end:
            raise NotApplicable("a trampoline-internal target that is not a piece's start")
        if a < v < a_end:
            raise NotApplicable("the relocation leaves into the patched range")
        return v

    return resolve


def _same_ir(block: BlockPlan, i: int, resolve) -> bool:
    """Piece i's half of the fast path: instruction i at A_i and piece i at T_i have the same
    canonical IR, exits mapped by ``resolve``."""
    insn = block.instructions[i]
    try:
        orig = lifted_one(insn.raw, insn.address)
        if orig.size != insn.length:
            return False
        reloc = lifted(block.piece(i), block.starts[i]).canonical(resolve)
        # a computed exit may land inside (A, A+L): left to the SMT obligation
        return reloc[-1][0] != "next" and orig.canonical() == reloc
    except NotApplicable:
        return False


#: The reason of a block proved by the fast path.
FAST_PATH_REASON = "each relocation's IR is its original's up to A_i <-> T_i"


def piece_proved(block: BlockPlan, i: int) -> bool:
    """Whether instruction i and its piece pass, on their own, every check by which ``prove_block``
    proves a block on its fast path: atomicity, no lift gap, admission of the one instruction with
    its piece, and the fast path's IR identity (``_same_ir``).

    Composition: if it holds for every i, ``prove_block(block)`` is PROVED by the fast path with
    ``FAST_PATH_REASON``.  Atomicity, the machine model, the lift gaps and the IR identity are checked per
    instruction there too.  Admission of the whole block is implied by admission of each piece: the block's
    features beyond the original's are the union of the pieces' (``reloc - orig`` of unions lies in
    the union of the differences), its hazard signature is the concatenation of the pieces' (equal
    when each is), and the per-instruction status checks are the same loop.  The converse need not
    hold (a fence moved from one piece to the next), so a block some piece fails is left to
    ``prove_block`` itself."""
    insn = block.instructions[i]
    if check_atomicity(insn, block.piece(i), block.starts[i], block.tracer_memory) is not None:
        return False
    piece = block.piece(i)
    if not one_step(piece, block.starts[i], block.tracer_memory) or \
            check_machine(insn.raw, insn.address, piece, (), block.starts[i], block.tracer_memory).problem:
        return False
    if opaque_lift_reason(insn) is not None:
        return False
    if not admit([insn], [(_code(block, i), block.starts[i])]).trusted:
        return False
    return _same_ir(block, i, _resolver(block))


def composed(block: BlockPlan, known: dict, keys: list | None = None, learn=None,
             clearance: int = 1 << 20) -> bool:
    """Whether ``prove_block(block)`` proves the block by its fast path, found by composing its pieces
    (``piece_proved``, the argument there), each piece's answer kept in ``known`` under its key:
    ``keys[i]``, which the caller vouches stands for piece i's answer wherever it sits, else its
    ``piece_key``.  A piece proved now is recorded by ``learn(key, answer)`` (by default into
    ``known``).  False (let ``prove_block`` decide) for a block ``prove_block`` would not take
    (``_validate``), whose tracer memory is more than its trampoline (``piece_key`` holds only that),
    with a piece that has no key, or with a piece that fails."""
    insns = block.instructions
    try:
        _validate(block)
    except ValueError:
        return False
    if len(block.plans) != len(insns) or block.tracer_memory != ((block.tramp, len(block.trampoline)),):
        return False
    if keys is None:
        keys = [piece_key(block, i, clearance) for i in range(len(insns))]
    if None in keys:
        return False
    learn = learn or known.__setitem__
    for i, key in enumerate(keys):
        ok = known.get(key)
        if ok is None:
            try:
                ok = piece_proved(block, i)
            except Exception as exc:  # a library's error: prove_block gives the block its verdict
                if refused(exc) is not None:  # the system's limit: the run stops
                    raise
                return False
            learn(key, ok)
        if not ok:
            return False
    return True


def block_key(block: BlockPlan) -> bytes | None:
    """A position-independent key for a block's fast-path proof, or None.

    The block's *shape* in the sense of ``cache_key.cache_key`` case 2: the
    run's bytes and the trampoline's bytes with every address-valued field
    zeroed (``pc_fields``), the role of each field's value (the boundary
    A_i, the end A+L, one of the original's own targets f_k, a trampoline
    offset; data addresses with their alignment mod 64), the offsets
    T_i - T, the save slots' offsets, and the tool versions.  Roles must be
    unambiguous, else no key.  Why reuse is sound: the lifter invariance
    argument of ``cache_key`` (VEX's IR depends on the address only through
    PC constants, each of which has the same role in both instances), so
    the per-instruction IR identity of ``block_fast_path`` holds for one
    instance exactly when it holds for the other; atomicity and the lifter
    checks read only bytes.  Store only fast-path proofs under it
    (``cache_key.reusable``'s rule for shape keys): an SMT answer may
    depend on the particular addresses."""
    a, t = block.address, block.tramp
    run = _run_bytes(block)
    ofields = pc_fields(run, a)
    tfields = pc_fields(block.trampoline, t)
    if ofields is None or tfields is None:
        return None
    roles = {(a + block.length) & MASK64: "end"}
    for i, x in enumerate(block.boundaries):
        roles[x] = f"a{i}"
    for k, f in enumerate(ofields):
        if f.value in roles:
            return None
        roles[f.value] = role_of(f.value, f.data, f"f{k}")
    sig = []
    for f in tfields:
        internal = (f.value - t) & MASK64 < len(block.trampoline) + 16
        if internal and f.value in roles:
            return None
        role = role_of(f.value, f.data, f"t+{(f.value - t) & MASK64}") if internal else roles.get(f.value)
        if role is None:
            return None
        sig.append(role)
    layout = ",".join(str(x - t) for x in block.starts) + "|" + ",".join(str(x - t) for x, _ in _slots(block))
    return (b"block|" + cache_tag() + (b"k" if Context.of(block.tramp) is Context.KERNEL else b"u")
            + shape_of(run, ofields) + b"|" + shape_of(block.trampoline, tfields) + b"|"
            + ",".join(sig).encode() + b"|" + layout.encode())


def piece_key(block: BlockPlan, i: int, clearance: int = 1 << 20) -> bytes | None:
    """A position-independent key for ``piece_proved(block, i)``, or None.

    ``block_key``'s argument restricted to one piece: instruction i's bytes
    and piece i's bytes with their address-valued fields zeroed, i and the
    number of instructions, and the role of every field's value: a boundary
    A_j or A+L (``a<j>``), a piece start T_j (``t<j>``), an offset inside
    piece i, or one of the original's own targets (``f<k>``, data addresses
    with their alignment mod 64).  What ``piece_proved`` reads of positions
    is exactly these: the PC constants of VEX's IR (lifter invariance, as in
    ``cache_key``), ``_resolver``'s map (T_j to A_j, hops inside the piece,
    refusal inside (A, A+L)), and atomicity's tracer memory.  So no key when
    a value lies inside the trampoline but is neither a piece start nor in
    piece i, when a target lies strictly inside (A, A+L) off the
    boundaries, when an absolute memory operand or a target lies within
    ``clearance`` of the trampoline (tracer memory is the whole trampoline,
    whose length the key does not hold), or when the piece has a save
    slot."""
    insn, plan = block.instructions[i], block.plans[i]
    if plan.save_slot is not None or plan.scratch is not None:
        return None
    t, t_end = block.tramp, block.tramp + len(block.trampoline)
    a, a_end = block.address, block.address + block.length
    memory = insn.memory
    if memory is not None and memory.base is None and memory.index is None and \
            (memory.displacement - t + clearance) & MASK64 < 2 * clearance + len(block.trampoline):
        return None
    piece, t_i = block.piece(i), block.starts[i]
    ofields, tfields = pc_fields(insn.raw, insn.address), pc_fields(piece, t_i)
    if ofields is None or tfields is None:
        return None
    boundaries = {x: f"a{j}" for j, x in enumerate(block.boundaries + (a_end & MASK64,))}
    starts = {x: f"t{j}" for j, x in enumerate(block.starts)}
    roles: dict[int, str] = {}
    osig = []
    for k, f in enumerate(ofields):
        v = f.value
        if v in roles:  # two fields with one value: the same role, so equal values show in the key
            role = role_of(v, f.data, roles[v])
        elif v in boundaries:
            role = role_of(v, f.data, boundaries[v])
        elif a < v < a_end or (v - t + clearance) & MASK64 < 2 * clearance + len(block.trampoline):
            return None
        else:
            role = role_of(v, f.data, f"f{k}")
        roles.setdefault(v, role.split("@")[0])
        osig.append(role)
    tsig = []
    piece_end = t_i + len(piece)
    for f in tfields:
        v = f.value
        if v in starts:
            role = role_of(v, f.data, starts[v])
        elif t_i <= v < piece_end:
            role = role_of(v, f.data, f"p+{v - t_i}")
        elif t <= v < t_end:
            return None
        elif v in boundaries:
            role = role_of(v, f.data, boundaries[v])
        elif v in roles:
            role = role_of(v, f.data, roles[v])
        else:
            return None
        tsig.append(role)
    context = b"k" if Context.of(block.tramp) is Context.KERNEL else b"u"  # the machine model's rows differ
    return (f"piece|{i}/{len(block.instructions)}|".encode() + context + shape_of(insn.raw, ofields) + b"|"
            + shape_of(piece, tfields) + b"|" + ",".join(osig).encode() + b"|" + ",".join(tsig).encode())


# ---------------------------------------------------------------------------
# The obligation
# ---------------------------------------------------------------------------


def _elapsed(t0: float) -> float:
    return time.perf_counter() - t0


def _machine(block: BlockPlan, t0: float) -> ProofResult | None:
    """The machine model (``proof.machine_model``), piece by piece: each piece against its instruction, as
    ``prove.py`` checks one relocation; and every piece one step (``one_step``), so that every boundary in the
    trampoline is the image of one in the original (rows interrupt-frame and signal-frame hold piece by
    piece, as they do for the original's own boundaries).  A refutation if any piece has one, else the first
    reason for ``unknown``, else None."""
    unknown = None
    for i, insn in enumerate(block.instructions):
        piece, start = block.piece(i), block.starts[i]
        check = check_machine(insn.raw, insn.address, piece, (), start, block.tracer_memory)
        where = f"instruction {i} ({insn.text})"
        if check.refutes:
            cex = Counterexample((), (), (Difference(check.what, check.original, check.relocated),),
                                 _run_bytes(block).hex(), block.address, block.tramp, block.trampoline.hex(),
                                 replayed=None, replay_note="the machine model's difference is not observable in a "
                                                            "sequential replay")
            return ProofResult(Verdict.REFUTED, f"{where}: {check.problem}", "machine-model", cex, _elapsed(t0))
        if unknown is None and check.problem is not None:
            unknown = f"{where}: {check.problem}"
        if unknown is None and not one_step(piece, start, block.tracer_memory):
            unknown = (f"not proved: {where}'s relocation has more than one instruction that moves rsp or touches "
                       f"memory, and a block's boundaries are checked against the machine model (interrupt frames "
                       f"below rsp) only one such step a piece")
    if unknown is None:
        return None
    return ProofResult(Verdict.UNKNOWN, unknown, "machine-model", seconds=_elapsed(t0))


def _lock_result(block: BlockPlan, i: int, reason: str, t0: float) -> ProofResult:
    insn = block.instructions[i]
    cex = Counterexample((), (), (Difference("lock", "locked" if atomic(insn) else "unlocked",
                                             "unlocked" if atomic(insn) else "locked"),),
                         _run_bytes(block).hex(), block.address, block.tramp, block.trampoline.hex(),
                         replayed=None, replay_note="atomicity is not observable in a sequential replay")
    return ProofResult(Verdict.REFUTED, f"instruction {i} ({insn.text}): {reason}", "atomicity", cex, _elapsed(t0))


def _suffix(block: BlockPlan, s: int, timeout_ms: int):
    """The obligation from A_s / T_s: (world, orig outcomes, solver or None, items, conditions, restarts)."""
    run = _run_bytes(block)
    a_s = block.boundaries[s]
    world = S.World(_tracer_bytes(block), block.tracer_memory)
    orig, _, r1 = _run_side(world, run[a_s - block.address:], a_s, block.boundaries[s:],
                            block.boundaries[s:], 0, one_insn=True)
    r1 = {j + s for j in r1}
    starts = block.starts
    reloc, escapes, r2 = _run_side(world, block.trampoline, block.tramp, starts, block.boundaries, s,
                                   one_insn=False, forbidden=(block.address, block.address + block.length))
    x = claripy.BVS("x", 64, explicit_name=True)
    items = smt.items(world, orig, reloc, a_s, starts[s], x)
    if escapes:
        items.append(smt.Item(ESCAPE, claripy.BVV(0, 1),
                               claripy.If(claripy.Or(*escapes), claripy.BVV(1, 1), claripy.BVV(0, 1))))
    conds = smt.event_conditions(world, orig, reloc)
    self_writes = smt.code_writes(world, reloc, smt.code_spans(block.trampoline, block.tramp))
    if self_writes:
        items.append(smt.flag_item("writes its own code", self_writes))
    solver = smt.solve(world, items, conds, x, timeout_ms, precondition=smt.private_tracer_memory(world, orig))
    return world, orig, solver, items, conds, x, (r1 | r2)


def _refutation(block: BlockPlan, s: int, world, orig, solver, items, conds, x, timeout_ms: int,
                t0: float) -> ProofResult:
    a_s, t_s = block.boundaries[s], block.starts[s]
    run = _run_bytes(block)[a_s - block.address:]
    who = SimpleNamespace(raw=run, address=a_s)
    cex = smt.counterexample(world, solver, items, conds, x, who, t_s, block.trampoline.hex(), ())
    if [d.what for d in cex.differences] == [ESCAPE]:
        cex = Counterexample(cex.registers, cex.memory, cex.differences, cex.orig_hex, cex.at, cex.tramp,
                             cex.reloc_hex, "", None, "a jump into the patched range is not observable in a "
                             "replay without the patch")
        return ProofResult(Verdict.REFUTED, "the relocation leaves into the patched range, whose bytes are "
                           "the probe's jump", "smt", cex, _elapsed(t0))
    rep = replay_block(block, cex.state(), s)
    if not rep.replayable and "rcx" in world.reg_syms:
        try:
            small = smt.solve(world, items, conds, x, timeout_ms, (claripy.ULE(world.reg_syms["rcx"], 8),),
                              precondition=smt.private_tracer_memory(world, orig))
        except claripy.errors.ClaripyError:  # a timeout looking for a smaller one: keep the first
            small = None
        if small is not None:
            cex = smt.counterexample(world, small, items, conds, x, who, t_s, block.trampoline.hex(), ())
            rep = replay_block(block, cex.state(), s)
    note = (f"not replayable: {rep.limit}" if not rep.replayable else
            ", ".join(f"{d.what}: {d.original} vs {d.relocated}" for d in rep.differences[:4])
            or "unicorn saw no difference")
    note = f"block replay (proof.block.replay_block, from instruction {s}): {note}"
    cex = Counterexample(cex.registers, cex.memory, cex.differences, cex.orig_hex, cex.at, cex.tramp,
                         cex.reloc_hex, "", rep.differ, note)
    if not rep.differ:
        why = "depends on an uninterpreted helper and " if world.uf_results else ""
        return ProofResult(Verdict.UNKNOWN, f"z3 found a counterexample that {why}unicorn did not confirm "
                           f"({note})", "smt", cex, _elapsed(t0))
    what = ", ".join(d.what for d in cex.differences) or "reads"
    return ProofResult(Verdict.REFUTED, f"differs in {what} (from instruction {s})", "smt", cex, _elapsed(t0))


def _clobbered(block: BlockPlan, i: int, timeout_ms: int) -> str | None:
    insn = block.instructions[i]
    world = S.World()
    outs = S.execute_original(world, insn.raw, insn.address)
    bits = smt.clobbered_flags(world, outs, insn.address, unaffected_flags(insn), timeout_ms)
    return (f"is lifted writing {flag_names(bits)}, which the decoders say it leaves alone") if bits else None


def prove_block(block: BlockPlan, timeout_ms: int = DEFAULT_TIMEOUT_MS, use_fast_path: bool = True) -> ProofResult:
    """The verdict for a block plan (ours, or a hand-made one); see the module doc.

    ``use_fast_path=False`` goes straight to the SMT obligation (the tests use it to check both)."""
    _validate(block)
    t0 = time.perf_counter()
    timeout_ms = int(timeout_ms)
    insns = block.instructions
    codes = [_code(block, i) for i in range(len(insns))]
    for i, insn in enumerate(insns):
        lock = check_atomicity(insn, block.piece(i), block.starts[i], block.tracer_memory)
        if lock is not None:
            return _lock_result(block, i, lock, t0)
    machine = _machine(block, t0)
    if machine is not None and machine.verdict is Verdict.REFUTED:
        return machine
    for i, insn in enumerate(insns):
        gap = opaque_lift_reason(insn)
        if gap is not None:
            return ProofResult(Verdict.UNKNOWN, f"not proved: instruction {i} ({insn.text}): {gap}", "smt",
                               seconds=_elapsed(t0))
    admission = admit(insns, [(codes[i], block.starts[i]) for i in range(len(insns))])
    if admission.refutation is not None:
        cex = Counterexample((), (), (Difference("memory ordering", "the original's", "the relocation's"),),
                             _run_bytes(block).hex(), block.address, block.tramp, block.trampoline.hex(),
                             replayed=None, replay_note="memory ordering is not observable in a sequential replay")
        return ProofResult(Verdict.REFUTED, admission.refutation, "memory-model", cex, _elapsed(t0))
    untrusted = [] if admission.trusted else [(None, admission.reason)]
    try:
        if use_fast_path and not untrusted and machine is None and block_fast_path(block):
            return ProofResult(Verdict.PROVED, FAST_PATH_REASON, "fast-path", seconds=_elapsed(t0))
        todo, done = [0], set()
        while todo:
            s = todo.pop()
            if s in done:
                continue
            done.add(s)
            world, orig, solver, items, conds, x, restarts = _suffix(block, s, timeout_ms)
            if solver is not None:
                return _refutation(block, s, world, orig, solver, items, conds, x, timeout_ms, t0)
            todo.extend(sorted(restarts - done))
        if not untrusted:
            for i, insn in enumerate(insns):
                if reexecutes(insn, codes[i], block.starts[i]):
                    continue
                clobbered = _clobbered(block, i, timeout_ms)
                if clobbered:
                    untrusted.append((i, clobbered))
                    break
    except L.Gap as gap:
        return ProofResult(Verdict.UNKNOWN, gap.reason, "smt", seconds=_elapsed(t0))
    except (claripy.errors.ClaripyError, pyvex.PyVEXError) as exc:
        return ProofResult(Verdict.UNKNOWN, f"solver: {type(exc).__name__}: {one_line(exc)}", "smt",
                           seconds=_elapsed(t0))
    if untrusted:
        i, why = untrusted[0]
        if i is not None:
            why = (f"not proved: instruction {i} ({insns[i].text}) {why}, and its relocation does not re-execute it, "
                   f"so VEX's values for it are not the CPU's")
        return ProofResult(Verdict.UNKNOWN, why, "smt", seconds=_elapsed(t0))
    if machine is not None:  # what the machine model cannot decide turns a proof into unknown
        return machine
    starts = f" (and from instructions {', '.join(map(str, sorted(done - {0})))})" if len(done) > 1 else ""
    return ProofResult(Verdict.PROVED, f"z3: the negated obligation is unsatisfiable{starts}", "smt",
                       seconds=_elapsed(t0))
