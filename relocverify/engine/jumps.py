"""Jump probes in a batch: for every instruction, can a jump-optimized probe sit there, and if not, why.

``relocverify vmlinux --jump-probes`` adds a phase after the rows: each
worker walks its functions again and, for every instruction at A, answers
with one bucket:

1. the patched range [A, A+L), the smallest run of whole instructions
   covering 5 bytes, must be safe to overwrite (``kernel.patch_range``:
   no branch target strictly inside it anywhere in the image, no indirect
   jump or jump table in the function, no exception-table entry, no kernel
   site).  Asked first: it needs only lengths, not a full decode;
2. the run must have a block plan (``plan.block``: no call, nothing only
   emulation can run, nothing the policy rejects);
3. the block must be proved (``proof.block.prove_block``: one obligation
   over the sequence).  A proof made by the fast path is kept under the
   block's position-independent key (``block_key``) for the rest of the
   run; other blocks are proved one by one.

**Blocks of plain copies, composed.**  Most eligible runs are a few
instructions with no address-valued field (``push %rbp``, ``mov
0x18(%rdi),%rax``), each copied and linked to the next by ``jmp rel32`` (the last
one back to A+L), so their blocks are many (a run of five bytes is rarely
seen twice) while their pieces are few.  Such a block is proved by
composition (``proof.block.piece_proved``: every piece passing the fast
path's checks on its own makes ``prove_block`` prove the block by its fast
path, with the same reason), and each piece's answer is kept under
``(token, COPY_LANE)``, the token the instruction's instance key (``engine.keys``:
a displacement from registers and the immediates ``cache_key`` leaves out do
not matter, so pieces are as few as instance keys).  ``copy_piece_key``
gives that key only where the answer
cannot depend on where the piece sits (no address-valued field, so VEX's
IR depends on A_i and T_i only through the PC, which the identity maps; no
absolute memory operand near the trampoline, where atomicity would read it
as tracer memory; the copy followed by a ``jmp rel32`` to where its
successor runs).

The answer does not depend on whether the piece is the last either: a
piece linked to the next (``jmp`` to T_{i+1}) and the last (``jmp`` to A+L)
differ only in that ``jmp``'s offset, and ``piece_proved`` reads the offset
nowhere but through the target.  Atomicity finds no locked access in a
``jmp`` whatever its bytes; admission's walk (``proof.reachable``) follows
neither target, both lying outside the piece, and the ``jmp``'s facts are
those of every ``jmp rel32`` (``proof.forms.facts`` zeroes a branch offset);
in the fast path's IR the target is only the lifted piece's exit
(``next``), which ``canon_block`` passes through the block's resolver: T_{i+1}
to A_{i+1}, A+L to itself, A_i+len both.  So a
copy is proved once, not once as the last piece and once linked.
``tests/test_block.py`` checks it on generated pieces and
``tests/test_jump_probes.py`` on the kernel's.  Then a run of such instructions in a function far
from the trampoline (``_far``: no trampoline can overlap it, every jump
back is a rel32) whose pieces are all known to pass is eligible without
being decoded or planned: exactly the answer the slow path gives it.

Relative branches and RIP-relative operands (a ``jcc`` ending a run) are
rewritten, not copied; their pieces are kept under ``branch_token``: the
instance key, the instruction's place in the run, and its target's role
there (a boundary, A+L, or elsewhere), which together fix its
``proof.block.piece_key``.  Every block that is planned checks that each
token still stands for the piece key it first stood for (``conflicts``
counts the ones that did not; none has).  Other blocks (a save slot, a
piece that fails) take the slow path.

**Copies answered by their int3 proofs.**  A copy piece with no answer yet is answered from the
instruction's own int3 proof when the proof cache or this run holds it (``JumpProver._derived``,
``finding``): an instance key of kind ``b`` or ``d`` with a register displacement, whose finding is
``proved`` by the fast path for a ``copy`` plan.  That proof checked, for the instruction copied to a
trampoline and followed by ``jmp`` back to A+len, the very checks ``piece_proved`` makes of the
piece (atomicity of the copy, no lift gap, admission of the instruction with its relocation, the IR
identity up to the trampoline's address); the piece differs only in where it sits, which an
instruction with no address-valued field (``pc_fields`` empty) sees only through the PC the identity
maps, and in its ``jmp``'s target, which the paragraph above shows is read nowhere else.  The one
check the piece makes that the int3 proof's fast path does not is ``_same_ir``'s refusal of a
computed exit, so an instruction whose IR ends in one is not derived.  Asked once per token; a true
answer is recorded as the piece's.  ``tests/test_jump_walk.py`` checks every derived piece with
``piece_proved`` on generated runs and on the kernel's, and that a prover deriving answers exactly
as one proving every piece: a whole kernel proves about 3,700 pieces instead of 23,000.

**Calls, refused from their keys.**  A run holding a call is refused ``call-in-range`` by
``plan_block`` when every instruction of the run decodes and the call comes before any instruction
with a target; those facts are the instance key's, learned from the decodes the worker makes
anyway (``JumpProver._call_first``), so most such runs are answered without decoding them.

**What is learned is kept** (``JumpMemory``): for the rest of the session, shared with the other
workers while the phase runs (each task carries what the others learned since its worker's last
one), and in the proof cache under ``jump_tag`` for later runs.  Range rules are asked a function
at a time (``PatchRanges.refusals``).

**The walk in C.**  ``JumpProver.packed`` gives a function to ``jump_walk.c`` where it is built: it
finds each run, asks the range rules from ``PatchRanges.function_facts`` as ``refusals`` does, takes
the two shortcuts above (reading the same ``pieces`` and facts, calling back for a branch's target
and a derivation) and calls ``JumpProver._slow`` for every other run; it writes the packed row's
bytes, with a slot per answer, and each reason is made only for a bucket's first example.  The
Python path (``function``) answers the same, and ``tests/test_jump_walk.py`` holds the two to each
other on generated functions and the kernel's.

``eligible`` is the bucket of a proved jump probe; every other bucket is a
refusal, keyed as ``range:<key>``, ``block:<key>`` or ``proof:<verdict>``,
with the first reason seen kept as its example.  The int3 probe's verdict
(the instruction's own row) is unaffected by any of this.

The same phase runs for kernel modules (``module``, ``package``: a module
laid out in module space has its own site tables, exception table and
relocated pointers, and ``PatchRanges`` reads them as a vmlinux's) and for
user-space ELF files (``elf``), whose ranges are checked by
``UserPatchRanges`` (:func:`patch_ranges` picks by policy): the rules that
need kernel tables (sites, ``__ex_table``, ``__jump_table``) are skipped,
each summary saying so in ``unchecked``, and C++ exception handling takes
the exception table's place: a range inside a frame whose ``.eh_frame``
entry has an LSDA is refused as ``exception-table`` (the unwinder may land
on any of its landing pads, which no branch names).  :func:`jump_totals`
adds the ``jump_probe`` sections of several images up.
"""

from __future__ import annotations

import bisect
import copy
import hashlib
import struct
from array import array
from collections import Counter

from elftools.dwarf.callframe import FDE
from elftools.elf.elffile import ELFFile
from iced_x86 import Decoder

from ..errors import StoreError
from ..image.functions import Function
from ..image.image import Image
from ..kernel.patch_range import (FunctionRanges, PatchRanges, RangeRefusal, past_end, pointer_refusal, site_refusal,
                                  target_refusal)
from ..kernel.sites import kind_key
from ..plan.block import JUMP_SIZE, BlockPlan, NoBlock, call_reason, is_call, plan_block
from ..plan.plan import PlanKind
from ..processes import refused
from ..proof.block import FAST_PATH_REASON, block_key, composed, piece_key, prove_block
from ..proof.cache_key import pc_fields
from ..proof.canonical import NotApplicable
from ..proof.lift import Gap
from ..proof.lifted import lifted_one
from ..proof.verdict import Verdict
from ..store.jump_rows import MAX_BUCKETS, JumpRow, pack_jump_row
from ..text import one_line
from ..versions import source_digest
from ..x86.decode import decode
from ..x86.instruction import Instruction
from ..x86.registers import MASK64
from .keys import KeyMaker
from .native_rows import JUMP_WALK

ELIGIBLE = "eligible"
CALL_IN_RANGE = "block:call-in-range"
DECODED_LIMIT = 8192  # decodes kept by bytes, per worker (about 1 KB each; 32 k cost 50 MB more RSS and no time)
#: How far (bytes) code and absolute memory operands must lie from the trampoline for ``_far`` and
#: ``copy_piece_key``: much more than a block's trampoline, much less than rel32's reach.
_CLEARANCE = 1 << 20
#: The second half of a copy piece's key (``copy_piece_key``): a copy linked to the next piece and one
#: jumping back to A+L share their answer (the module doc); a branch piece's is whether it is the last.
COPY_LANE = "copy"


class JumpProver:
    """One worker's jump-probe answers, with the block proofs it has made so far."""

    def __init__(self, ranges: PatchRanges, tramp: int, timeout_s: float, rules=None, compose: bool = True,
                 memory: "JumpMemory | None" = None, finding=None):
        self.ranges = ranges
        self.compose = compose  # False: every block by prove_block (the tests compare the two)
        self.tramp = tramp
        self.timeout_ms = int(timeout_s * 1000)
        self.rules = rules
        self.memory = memory if memory is not None else JumpMemory()
        self.proved = self.memory.proved  # block key -> (bucket, reason)
        # _lane_key (a tuple: a copy's token and COPY_LANE, or a branch's token and whether last) or
        # proof.block.piece_key
        # (bytes) -> piece_proved
        self.pieces = self.memory.pieces
        self.proofs = 0
        self.composed = 0  # runs answered from known pieces, without decoding
        self.piece_proofs = 0
        self.keys = KeyMaker(tramp)
        self._stands_for = self.memory.stands_for  # branch_token -> the piece_key it stood for
        self.decodes = MovedDecodes()
        self.conflicts = 0  # tokens or keys found standing for two answers (none has)
        self.calls = 0  # runs refused as call-in-range from their keys' facts, without decoding
        # instance key -> its int3 finding (``store.cache.CachedFinding``) or None, for ``_derived``
        self.finding = finding
        self.derived = 0  # copy pieces answered from their int3 proofs (``_derived``)
        self._underived: set[bytes] = set()
        # instance key -> (decodes, is a call, has no target) as plan_block reads them, or None
        self._facts: dict[bytes, tuple[bool, bool, bool] | None] = {}

    def function(self, fn: Function, data: bytes, spans: list[tuple[int, int]],
                 keys: list[bytes] | None = None) -> list[tuple[int, str, str]]:
        """(offset, bucket, reason) for each instruction (offset, length) of ``fn``; ``keys``, their
        instance keys (``engine.keys``) when the caller has them."""
        out = []
        memo: dict[int, object] = {}  # span index -> decoded: runs overlap, each decodes once
        pieces = tokens = None
        if self.compose and _far(fn, self.tramp):
            pieces = self.pieces
            if keys is None:
                keys = [key for _, _, key in self.keys.keys(data, fn.start)]
            tokens = [lane_token(key, data[o:o + m]) or _aimed(key, data[o:o + m], fn.start + o)
                      for key, (o, m) in zip(keys, spans)]
        runs = []  # (j, length): the run from instruction i is i..j-1, ``length`` bytes
        start = fn.start
        asked = []  # the range a jump at each instruction would cover
        count = len(spans)
        for i, (off, n) in enumerate(spans):
            length, j = 0, i
            while length < JUMP_SIZE and j < count and spans[j][0] == off + length:
                length += spans[j][1]
                j += 1
            runs.append((j, length))
            asked.append((start + off, max(JUMP_SIZE, length)))
        refusals = self.ranges.refusals(fn, asked)
        known = [False] * len(spans)  # copies whose piece is known to pass: pieces are only ever added
        placeless = None if tokens is None else (lambda k: type(tokens[k]) is bytes)  # kinds b and d
        items = [(o, m, None) for o, m in spans] if keys is None else [(o, m, key) for (o, m), key in zip(spans, keys)]
        for i, (off, n) in enumerate(spans):
            address = start + off
            j, length = runs[i]
            refusal = refusals[i]
            if refusal is not None:
                out.append((off, f"range:{refusal.key}", refusal.reason))
                continue
            if pieces is not None and length >= JUMP_SIZE:
                if self._known(tokens, spans, i, j, fn.start, known, data):
                    self.composed += 1
                    out.append((off, ELIGIBLE, FAST_PATH_REASON))
                    continue
                call = self._call_first(keys, i, j)
                if call is not None:
                    self.calls += 1
                    out.append((off, CALL_IN_RANGE, call_reason(start + spans[call][0], address, address + length)))
                    continue
            out.append((off,) + self._slow(fn, data, items, placeless, memo, i, j))
        return out

    def _slow(self, fn: Function, data: bytes, items: list[tuple[int, int, bytes | None]], placeless,
              memo: dict, i: int, j: int) -> tuple[str, str]:
        """(bucket, reason) of the run i..j-1 the shortcuts did not answer, ``items`` being the function's
        (offset, length, instance key or None): its instructions decoded (each once per function, in
        ``memo``; by ``MovedDecodes`` where ``placeless(k)``: no address-valued field), planned and
        proved; the facts ``_call_first`` reads learned on the way."""
        decoded = []
        for k in range(i, j):
            d = memo.get(k)
            if d is None:
                o, m, key = items[k]
                d = memo[k] = (self.decodes.decode if placeless is not None and placeless(k) else decode)(
                    data[o:o + m], fn.start + o)
                if key is not None:
                    self._learn_facts(key, d)
            decoded.append(d)
        block = plan_block(decoded, self.tramp, self.rules)
        if isinstance(block, NoBlock):
            return f"block:{block.key}", block.reason
        return self._prove(block)

    def packed(self, fid: int, fn: Function, data: bytes, found: list[tuple[int, int, bytes]], skip,
               examples: dict[str, str]) -> JumpRow:
        """``function``'s answers as the worker keeps them: the packed row of the instructions not in
        ``skip`` (addresses another function owns), and the first reason of each bucket not yet in
        ``examples`` added there.  The native walk (``jump_walk.c``) makes the decisions where it is
        built and the function's ranges are ``PatchRanges``' own; ``function`` otherwise."""
        facts = self.ranges.function_facts(fn)
        if JUMP_WALK is not None and facts is not None and fn.end < 1 << 64 and found:
            walk = _Walk(self, fn, data, found, facts)
            try:
                return walk.row(fid, skip, examples)
            except _TooManySlots:
                pass  # never seen: a function with more than 255 distinct answers and reasons' kinds
        return _pack_answers(fid, fn, self.function(fn, data, [(o, n) for o, n, _ in found],
                                                    [k for _, _, k in found]), skip, examples)

    def _known(self, tokens: list, spans: list[tuple[int, int]], i: int, j: int, start: int,
               known: list[bool], data: bytes) -> bool:
        """Whether the run of instructions i..j-1 is made of pieces known to pass (``tokens`` from
        ``lane_token``, or (key, target) for a branch, whose token depends on the run); ``known[k]``, a copy
        found to pass by an earlier run of the function (each instruction is in up to five).  A copy
        whose piece has no answer yet may have one from its int3 proof (``_derived``)."""
        pieces = self.pieces
        bounds = None
        for k in range(i, j):
            if known[k]:
                continue
            token = tokens[k]
            if token is None:
                return False
            if type(token) is tuple:
                if bounds is None:
                    bounds = tuple(start + spans[m][0] for m in range(i, j))
                token = branch_token(token[0], token[1], k - i, bounds,
                                     (start + spans[j - 1][0] + spans[j - 1][1]) & MASK64, self.tramp)
                if token is None or not pieces.get((token, k == j - 1)):
                    return False
            else:
                ok = pieces.get((token, COPY_LANE))
                if ok is None:
                    o, m = spans[k]
                    ok = self._derived(token, data[o:o + m], start + o)
                if not ok:
                    return False
                known[k] = True
        return True

    def _derived(self, token: bytes, raw: bytes, address: int) -> bool:
        """Whether the copy piece under ``token`` passes, read from the int3 proof of the instruction
        (``finding``, by its instance key), without proving the piece: true when that proof stands for the key
        (not one instance's alone) and is ``proved`` by the fast path for a ``copy`` plan, the instruction has no address-valued field,
        and its IR does not end in a computed exit.  Recorded as the piece's answer when true; asked
        once per token.  The argument is the module doc's ("Copies answered by their int3 proofs")."""
        if self.finding is None or token in self._underived:
            return False
        ok = token[:1] == b"b" or (token[:1] == b"d" and token[2] == 0xFF)  # the instance key itself
        c = self.finding(token) if ok else None
        ok = c is not None and not c.per_instance and c.verdict == "proved" and c.method == "fast-path" \
            and c.plan_kind == "copy" and pc_fields(raw, address) == []
        if ok:
            try:
                ok = lifted_one(raw, address).canonical()[-1][0] != "next"
            except (NotApplicable, Gap):
                ok = False
        if not ok:
            self._underived.add(token)
            return False
        self.derived += 1
        self.pieces[(token, COPY_LANE)] = True
        self.memory.learn(("p", (token, COPY_LANE)), True)
        return True

    def _learn_facts(self, key: bytes, d) -> None:
        """Remember what ``plan_block`` reads of an instruction before it refuses a call (``_call_first``)
        under its instance key: whether it decodes, is a call, and has a branch or RIP-relative target.
        The key determines them (its bytes with only a displacement, an immediate or a branch offset
        zeroed); a key met again with other facts is never used for a shortcut (``conflicts``)."""
        facts = (True, is_call(d), d.branch_target is None and d.rip_target is None) \
            if isinstance(d, Instruction) else (False, False, False)
        kept = self._facts.setdefault(key, facts)
        if kept != facts and kept is not None:
            self.conflicts += 1
            self._facts[key] = None

    def _call_first(self, keys: list[bytes], i: int, j: int) -> int | None:
        """The call for which ``plan_block`` refuses the run i..j-1 as ``call-in-range``, from the facts of
        its instructions' keys (``_learn_facts``): every one decodes (else ``patched_run`` refuses it as
        undecodable first), and a call comes before any instruction with a target (one that
        ``_refusal`` could refuse as ``branch-into-range`` first).  None when a fact is unknown."""
        facts = self._facts
        for k in range(i, j):
            f = facts.get(keys[k])
            if f is None or not f[0]:
                return None
            if f[1]:
                return k if all((facts.get(keys[m]) or (False,))[0] for m in range(k + 1, j)) else None
            if not f[2]:
                return None
        return None

    def _prove(self, block: BlockPlan) -> tuple[str, str]:
        if self.compose and self._composed(block):
            return ELIGIBLE, FAST_PATH_REASON
        key = block_key(block)
        if key is not None and key in self.proved:
            return self.proved[key]
        self.proofs += 1
        try:
            result = prove_block(block, self.timeout_ms)
        except Exception as exc:  # a bug in a library must not stop the run: this point is refused
            if refused(exc) is not None:  # the system's limit is no answer: the run stops
                raise
            return "proof:error", f"internal error: {type(exc).__name__}: {one_line(exc)}"
        if result.verdict is Verdict.PROVED:
            answer = (ELIGIBLE, result.reason)
            if key is not None and result.method == "fast-path":
                self.proved[key] = answer
                self.memory.learn(("b", key), answer)
            return answer
        return f"proof:{result.verdict.value}", result.reason

    def _composed(self, block: BlockPlan) -> bool:
        """Whether the block is proved by composing its pieces (``proof.block.composed``), each piece's
        answer kept under its ``_lane_key`` or else its ``piece_key``; False (the slow path decides)
        for a block with a piece that has neither, or fails."""
        return composed(block, self.pieces, [self._lane_key(block, i) or piece_key(block, i, _CLEARANCE)
                                             for i in range(len(block.instructions))], self._learn_piece)

    def _learn_piece(self, key, ok: bool) -> None:
        self.piece_proofs += 1
        self.pieces[key] = ok
        self.memory.learn(("p", key), ok)

    def _lane_key(self, block: BlockPlan, i: int) -> tuple[bytes, str | bool] | None:
        """``(token, COPY_LANE)`` or ``(token, last)`` under which piece i's answer is kept and looked up
        by the lane, or None: ``copy_piece_key`` for a copy; for a relative branch or a RIP-relative
        operand (instance key ``j`` or ``r``), ``branch_token`` of its key and its target's role in the run, when its
        ``piece_key`` exists.  Each token remembers the first ``piece_key`` it stood for; a token
        found standing for another (the argument of ``branch_token`` failing) is never used again,
        and counted in ``conflicts``."""
        copy = copy_piece_key(block, i, self.tramp, self.keys)
        if copy is not None:
            return copy
        insn = block.instructions[i]
        key = self.keys.key(insn.raw, insn.address)
        target = insn.branch_target if key[:1] == b"j" else insn.rip_target if key[:1] == b"r" else None
        if target is None:
            return None
        boundaries = block.boundaries
        token = branch_token(key, target, i, boundaries, block.end, self.tramp)
        if token is None:
            return None
        whole = piece_key(block, i, _CLEARANCE)
        if whole is None:
            return None
        kept = self._stands_for.setdefault(token, whole)
        if kept is whole:
            self.memory.learn(("s", token), whole)
        elif kept != whole:
            self.conflicts += 1
            self.memory.forget(token)
            return None
        return token, i == len(boundaries) - 1


class JumpMemory:
    """What a worker's jump probes have learned, kept across the images of a session and, through the
    proof cache (``store.cache``'s ``jump_segments``, under ``jump_tag``), across runs: ``pieces``
    (``JumpProver._lane_key`` or ``piece_key`` -> ``piece_proved``), ``stands_for`` (a
    ``branch_token`` -> the ``piece_key`` it first stood for: the tripwire) and ``proved``
    (``block_key`` -> the answer of a fast-path proof).  ``new`` holds the same, as cache entries
    (``store.cache.merge_jump_entries``), learned since the last ``take_new``.

    Why kept answers may be reused in another run: each is filed under a key that stands for it
    wherever the piece or block sits (the arguments of ``piece_key``, ``block_key``,
    ``copy_piece_key`` and ``branch_token``), under the tools' versions, the policy table, the
    CPU-validated forms and relocverify's own source (``jump_tag``): a run with any of those changed
    starts afresh.  Only answers that need no solver are kept (pieces by the fast path's checks,
    blocks proved by the fast path), so no time limit enters them."""

    __slots__ = ("pieces", "stands_for", "proved", "new", "outgoing")

    def __init__(self, entries: dict[tuple, object] | None = None):
        self.pieces: dict[tuple[bytes, bool] | bytes, bool] = {}
        self.stands_for: dict[bytes, bytes] = {}
        self.proved: dict[bytes, tuple[str, str]] = {}
        self.new: dict[tuple, object] = {}  # for the persistent cache (the harvest)
        self.outgoing: dict[tuple, object] = {}  # for the other workers of this phase
        self.absorb(entries or {})

    def learn(self, entry: tuple, value) -> None:
        """One answer this worker made (also recorded for the cache and the other workers)."""
        self.new[entry] = self.outgoing[entry] = value

    def absorb(self, entries: dict[tuple, object]) -> int:
        """Answers made elsewhere (the cache, or another worker during the phase: it records its own
        for the cache), merged as ``store.cache.merge_jump_entries`` merges them: a piece's False wins,
        and a token met standing for another piece key than the one kept fails for good (``forget``);
        returns how many tokens did."""
        conflicts = 0
        for (kind, key), value in entries.items():
            if kind == "p":
                value = self.pieces.get(key, True) and value
                self.pieces[key] = value
            elif kind == "s":
                kept = self.stands_for.setdefault(key, value)
                if kept != value:
                    conflicts += 1
                    self.forget(key)
            elif kind == "b":
                self.proved[key] = tuple(value)
        return conflicts

    def forget(self, token: bytes) -> None:
        """A branch token found standing for a second piece key: its pieces fail from now on (the slow
        path answers its blocks), here and in every later run."""
        for last in (True, False):
            self.pieces[(token, last)] = False
            self.learn(("p", (token, last)), False)

    def take_new(self) -> dict[tuple, object]:
        new, self.new = self.new, {}
        return new

    def take_outgoing(self) -> dict[tuple, object]:
        out, self.outgoing = self.outgoing, {}
        return out


class MovedDecodes:
    """``decode`` for instructions without an address-valued field (``lane_token``'s kinds ``b`` and
    ``d``), remembered by their bytes: such a decode depends on the address only through its
    ``address`` field (no branch target, no RIP-relative operand: checked before one is kept), so an
    earlier decode of the same bytes is moved to the new address."""

    def __init__(self, limit: int = DECODED_LIMIT):
        self.limit = limit
        self._seen: dict[bytes, Instruction] = {}

    def decode(self, raw: bytes, address: int):
        seen = self._seen.get(raw)
        if seen is None:
            seen = decode(raw, address)
            if (isinstance(seen, Instruction) and seen.branch_target is None and not seen.rip_relative
                    and len(self._seen) < self.limit):
                self._seen[raw] = seen
            return seen
        moved = copy.copy(seen)
        object.__setattr__(moved, "address", address & MASK64)
        return moved


def _pack_answers(fid: int, fn: Function, answers, skip, examples: dict[str, str]) -> JumpRow:
    """``function``'s answers as a packed row, without those in ``skip``; each bucket's first reason
    added to ``examples`` when it has none."""
    kept = []
    for off, bucket, reason in answers:
        if fn.start + off in skip:
            continue
        kept.append((off, bucket))
        examples.setdefault(bucket, reason)
    return pack_jump_row(fid, kept)


class _TooManySlots(Exception):
    """A function whose answers would need more than 255 slots: ``function`` answers it instead."""


class _Walk:
    """One function answered by the native walk (``jump_walk.c``) for ``JumpProver.packed``: what each slot
    stands for (a bucket, and how to say why), the callbacks the walk makes, and the packed row.

    A slot is (bucket, kind, payload): ``past``, ``site`` (payload: the kind), ``const`` (payload: the
    function's one ``RangeRefusal``), ``pointer`` and ``target`` (the walk's ``aux`` indexes the
    function's pointers and targets), ``eligible`` and ``call`` (the walk's shortcuts), ``slow`` (a
    bucket the slow path gave; every reason it gives is kept)."""

    def __init__(self, prover: JumpProver, fn: Function, data: bytes, found: list[tuple[int, int, bytes]],
                 facts: FunctionRanges):
        self.prover, self.fn, self.data, self.found, self.facts = prover, fn, data, found, facts
        self.info: list[tuple[str | None, str | None, object]] = [(None, None, None)]  # slot 0: no refusal
        self.by_name: dict[str, int] = {}
        self.reasons: dict[int, str] = {}  # instruction -> the slow path's reason
        self.memo: dict[int, object] = {}
        self.far = prover.compose and _far(fn, prover.tramp)

    def _slot(self, name: str, kind: str, payload=None) -> int:
        if len(self.info) == 256:
            raise _TooManySlots(name)
        self.info.append((name, kind, payload))
        return len(self.info) - 1

    def _ranges(self) -> tuple:
        facts, slot = self.facts, self._slot
        kinds = sorted({kind for *_, kind in facts.points} | ({facts.cover[1]} if facts.cover else set()),
                       key=kind_key)
        rank = {kind: r for r, kind in enumerate(kinds)}
        site = {kind: slot(f"range:site:{kind}", "site", kind) for kind in kinds}
        table = indirect = 0
        if facts.jump is not None:
            jump = slot(f"range:{facts.jump.key}", "const", facts.jump)
            table, indirect = (jump, 0) if facts.indirect.kind == "jump-table" else (0, jump)
        extable = 0 if facts.extable is None else slot(f"range:{facts.extable.key}", "const", facts.extable)
        points = facts.points
        return (facts.sites, rank[facts.cover[1]] if facts.cover else -1, site[facts.cover[1]] if facts.cover else 0,
                array("Q", [p[0] for p in points]), array("Q", [p[1] for p in points]),
                array("I", [rank[p[3]] for p in points]), bytes(site[p[3]] for p in points), extable, table,
                array("Q", [v for v, _ in facts.pointers]), slot("range:jump-table", "pointer"), indirect,
                array("Q", facts.targets), slot("range:branch-target-inside", "target"),
                slot("range:past-function-end", "past"))

    def _aim(self, k: int) -> int | None:
        o, m, key = self.found[k]
        aimed = _aimed(key, self.data[o:o + m], self.fn.start + o)
        return None if aimed is None else aimed[1]

    def _derive(self, k: int) -> bool:
        o, m, key = self.found[k]
        return self.prover._derived(key, self.data[o:o + m], self.fn.start + o)

    def _placeless(self, k: int) -> bool:
        o, m, key = self.found[k]
        return lane_token(key, self.data[o:o + m]) is not None

    def _slow(self, i: int, j: int, length: int) -> int:
        bucket, reason = self.prover._slow(self.fn, self.data, self.found, self._placeless if self.far else None,
                                           self.memo, i, j)
        self.reasons[i] = reason
        slot = self.by_name.get(bucket)
        if slot is None:
            slot = self.by_name[bucket] = self._slot(bucket, "slow")
        return slot

    def run(self) -> tuple[bytes, array, bytes]:
        """(slot of each instruction, aux of each, offsets as little-endian u32s)."""
        p = self.prover
        ranges = self._ranges()
        eligible = self.by_name[ELIGIBLE] = self._slot(ELIGIBLE, "eligible")
        call = self.by_name[CALL_IN_RANGE] = self._slot(CALL_IN_RANGE, "call")
        compose = (self.data, self._aim, self._derive, p.pieces, p._facts, COPY_LANE, p.tramp,
                   _CLEARANCE) if self.far else None
        slots, aux, offsets, composed, calls = JUMP_WALK.walk(self.found, self.fn.start, self.fn.end, ranges, compose,
                                                              eligible, call, JUMP_SIZE, self._slow)
        p.composed += composed
        p.calls += calls
        return slots, array("I", aux), offsets

    def reason(self, i: int, slot: int, aux: int) -> str:
        """Why instruction i has the answer of ``slot``, as ``function`` says it."""
        if i in self.reasons:
            return self.reasons[i]
        _, kind, payload = self.info[slot]
        off = self.found[i][0]
        length, j = 0, i
        while length < JUMP_SIZE and j < len(self.found):
            length += self.found[j][1]
            j += 1
        address = self.fn.start + off
        end = address + max(JUMP_SIZE, length)
        if kind == "eligible":
            return FAST_PATH_REASON
        if kind == "call":
            return call_reason(self.fn.start + self.found[i + aux][0], address, address + length)
        if kind == "const":
            return payload.reason
        if kind == "site":
            return site_refusal(payload).reason
        if kind == "pointer":
            return pointer_refusal(*self.facts.pointers[aux]).reason
        if kind == "target":
            return target_refusal(self.facts.targets[aux], address, end).reason
        if kind == "past":
            return past_end(self.fn, address, end).reason
        raise AssertionError(f"slot {slot} ({kind}) of instruction {i} has no reason")

    def answers(self) -> list[tuple[int, str, str]]:
        """(offset, bucket, reason) of every instruction, as ``function`` gives them (the tests compare)."""
        slots, aux, _ = self.run()
        return [(self.found[i][0], self.info[s][0], self.reason(i, s, aux[i])) for i, s in enumerate(slots)]

    def row(self, fid: int, skip, examples: dict[str, str]) -> JumpRow:
        """The packed row ``_pack_answers`` makes of ``function``'s answers (the same bytes), and the
        same examples added."""
        slots, aux, offsets = self.run()
        index = None  # kept position -> instruction, when some are skipped
        if skip:
            start = self.fn.start
            index = [i for i, (o, _, _) in enumerate(self.found) if start + o not in skip]
            if len(index) < len(slots):
                slots = bytes(slots[i] for i in index)
                offsets = b"".join(offsets[4 * i:4 * i + 4] for i in index)
            else:
                index = None
        table = bytearray(256)
        names: dict[str, int] = {}
        for s in dict.fromkeys(slots):  # slots by first appearance
            name = self.info[s][0]
            k = names.get(name)
            if k is None:
                if len(names) == MAX_BUCKETS:
                    raise StoreError(f"function {fid}: more than {MAX_BUCKETS} jump-probe buckets")
                k = names[name] = len(names)
                if name not in examples:
                    i = slots.index(s)
                    i = i if index is None else index[i]
                    examples[name] = self.reason(i, s, aux[i])
            table[s] = k
        return JumpRow(fid, tuple(names), offsets, slots.translate(table))


def jump_tag(tag: bytes) -> bytes:
    """The tag the jump answers are kept under in the proof cache: the proof tag (tools, policy table,
    CPU-validated forms) and ``source_digest``: the answers come from the planner, the decoders'
    adapters and the fast path's checks, and a change to any of them must not be answered by what an
    older version learned."""
    return b"jump|" + hashlib.sha256(tag + source_digest()).digest()[:16]


def copy_piece_key(block: BlockPlan, i: int, tramp: int, keys: KeyMaker) -> tuple[bytes, str] | None:
    """``(token, COPY_LANE)`` for piece i of a block whose answer from ``piece_proved`` cannot depend on
    where the instruction or its piece sits, nor on whether it is the last (module doc), else None: a
    copy of an instruction with no address-valued field and no absolute memory operand within
    ``_CLEARANCE`` of the trampoline, followed by a ``jmp rel32`` to where its successor runs (the next
    piece, T_{i+1}, or for the last one A+L), with no save slot; ``token`` is ``lane_token`` of its
    instance key."""
    insn, plan = block.instructions[i], block.plans[i]
    if plan.kind is not PlanKind.COPY or plan.save_slot is not None:
        return None
    piece, raw = block.piece(i), insn.raw
    if piece[:len(raw)] != raw or len(piece) != len(raw) + 5 or piece[len(raw)] != 0xE9:
        return None
    last = i == len(block.instructions) - 1
    successor = block.end if last else block.starts[i + 1]
    if (block.starts[i] + len(piece) + int.from_bytes(piece[-4:], "little", signed=True)) & MASK64 != successor:
        return None
    if pc_fields(raw, insn.address) != []:
        return None
    memory = insn.memory
    if memory is not None and memory.base is None and memory.index is None and \
            (memory.displacement - tramp + _CLEARANCE) & MASK64 < 2 * _CLEARANCE:
        return None
    token = lane_token(keys.key(raw, insn.address), raw)
    return None if token is None else (token, COPY_LANE)


def lane_token(key: bytes, raw: bytes) -> bytes | None:
    """What a copy piece's answer is kept under, from the instruction's instance key (``engine.keys``)
    and bytes, or None: the key of kinds ``b`` (the bytes) and ``d`` (the bytes with a register-based
    displacement and the immediates ``cache_key`` leaves out zeroed: the instance key determines the
    plan, and ``cache_key``'s argument the proof, of which ``piece_proved`` checks the fast path's
    half), with the bytes added back when the displacement is an absolute address (atomicity reads it
    against tracer memory); only when the jump back is near (``n``), as every one of a ``_far``
    function is."""
    if key[1:2] != b"n":
        return None
    if key[:1] == b"b":
        return key
    if key[:1] == b"d":
        return key if key[2] == 0xFF else key + b"|" + raw
    return None


def branch_token(key: bytes, target: int, i: int, boundaries, end: int, tramp: int) -> bytes | None:
    """The lane's token for instruction i of a run (at ``boundaries``, ending at ``end``) with instance
    key ``key`` of kind ``j`` (a relative branch) or ``r`` (a RIP-relative operand) aimed at
    ``target``, or None.

    The key holds the bytes with the address field zeroed (``pc_fields`` zeroes the same field), the
    plan's rule, the data alignment of an ``r`` target, and where the target lies from T: only
    ``n`` (near) is taken, where every reach decision from any T_i (within a trampoline's length of
    T) is the same as from T.  Added: i, the run's length, and the target's role (a boundary's index,
    the run's length for A+L, 254 for elsewhere; none when it is strictly inside the range, which the
    planner refuses, or within ``_CLEARANCE`` of T).  These are what ``piece_key`` holds, so equal
    tokens mean equal piece keys; ``JumpProver._lane_key`` checks that on every piece it plans."""
    if key[:1] not in (b"j", b"r") or key[1:3] != b"nn":
        return None
    if (target - tramp + _CLEARANCE) & MASK64 < 2 * _CLEARANCE:
        return None
    if target == end:
        role = len(boundaries)
    elif target in boundaries:
        role = boundaries.index(target)
    elif boundaries[0] < target < end:
        return None
    else:
        role = 254
    return key + bytes((i, len(boundaries), role))


def _aimed(key: bytes, raw: bytes, address: int) -> tuple[bytes, int] | None:
    """(key, target) of a relative branch or RIP-relative operand whose jump back and target are near
    (``branch_token`` finishes the token in its run), else None."""
    if key[:1] not in (b"j", b"r") or key[1:3] != b"nn":
        return None
    ins = Decoder(64, raw, ip=address & MASK64).decode()
    target = ins.near_branch_target if key[:1] == b"j" else ins.ip_rel_memory_address
    return key, target & MASK64


def _far(fn: Function, tramp: int) -> bool:
    """Whether every trampoline of a block in ``fn`` lies clear of the function (no overlap refusal,
    in a block or in an instruction's plan) and within rel32 reach of its every jump back."""
    ends = [_signed(fn.start - tramp), _signed(fn.start + fn.size - tramp)]
    return (ends[0] > 0) == (ends[1] > 0) and all(_CLEARANCE <= abs(d) < (1 << 31) - _CLEARANCE for d in ends)


def _signed(x: int) -> int:
    x &= MASK64
    return x - (1 << 64) if x >> 63 else x


#: Why a user-space image's ranges are not checked against kernel tables.
USER_SKIPPED = ("user space: kernel sites, __ex_table and __jump_table exist only in a kernel image; those range "
                "rules are skipped (landing pads from .eh_frame and symbol entry points are checked instead)")


def patch_ranges(image: Image, functions: list[Function], sites, policy: str) -> PatchRanges:
    """The range facts of ``image`` for the jump-probe phase: ``PatchRanges`` for a kernel image or
    module, ``UserPatchRanges`` for a user-space ELF (``policy`` "user")."""
    if policy == "user":
        return UserPatchRanges(image, functions)
    return PatchRanges(image, functions, sites)


class UserPatchRanges(PatchRanges):
    """``PatchRanges`` for a user-space ELF: no kernel tables (``unchecked`` says so), and two
    rules in their place:

    * every frame with C++ landing pads (an FDE with an LSDA) is refused whole
      (``exception-table``), as Linux refuses a function with an ``__ex_table`` entry;
    * a symbol's address or the ELF entry point strictly inside the range is a branch target
      (``branch-target-inside``): other objects call a library's functions through the PLT, which
      no branch of this file shows, and a stripped file's code is swept as one function, so its
      ``.dynsym`` entry points fall inside it.

    Other code pointers of a position-independent file are in its dynamic relocations, not its
    data: those into a function's middle come with an indirect jump there (a jump table or a
    computed goto), which refuses the function already."""

    def __init__(self, image: Image, functions):
        super().__init__(image, functions, None)
        self.unchecked = (USER_SKIPPED,)
        self._frames = _merged(landing_pad_frames(image))
        self._frame_starts = [lo for lo, _, _ in self._frames]
        entries = {s.address: s.name for s in image.symbols if image.is_executable(s.address)}
        start = _entry_point(image.path)
        if start is not None and image.is_executable(start):
            entries.setdefault(start, "the ELF entry point")
        self._entries = sorted(entries.items())

    def refusal(self, function: Function, address: int, length: int) -> RangeRefusal | None:
        refusal = super().refusal(function, address, length)
        if refusal is not None and refusal.key == "past-function-end":
            return refusal
        end = address + length
        i = bisect.bisect_right(self._frame_starts, end - 1) - 1
        if i >= 0 and self._frames[i][1] > address:  # frames are merged: only the last one can overlap
            lo, hi, why = self._frames[i]
            return RangeRefusal("exception-table", f"{function.name}: {why}: the unwinder may land on any "
                                f"of its landing pads in [{lo:#x}, {hi:#x})")
        if refusal is not None:
            return refusal
        k = bisect.bisect_right(self._entries, (address, "\uffff"))
        if k < len(self._entries) and self._entries[k][0] < end:
            at, name = self._entries[k]
            return RangeRefusal("branch-target-inside", f"{at:#x}, strictly inside [{address:#x}, {end:#x}), is "
                                f"where {name} starts: a call from another object would land in the probe's jump")
        return None


def _entry_point(path: str) -> int | None:
    """``e_entry`` of an ELF64 file, or None."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(0x20)
    except OSError:
        return None
    return struct.unpack_from("<Q", head, 0x18)[0] if len(head) == 0x20 and head[:4] == b"\x7fELF" else None


def landing_pad_frames(image: Image) -> list[tuple[int, int, str]]:
    """(start, end, why) of every ``.eh_frame`` FDE with an LSDA (C++ landing pads), sorted.  An
    ``.eh_frame`` that pyelftools cannot read, in a file with a ``.gcc_except_table``, is one frame
    over everything: nothing in it can be shown free of landing pads."""
    if image.get_section(".gcc_except_table") is None:
        return []

    try:
        with open(image.path, "rb") as handle:
            dwarf = ELFFile(handle).get_dwarf_info()
            entries = list(dwarf.EH_CFI_entries()) if dwarf.has_EH_CFI() else []
    except Exception as exc:  # pyelftools asserts on encodings it does not know: one place, refused whole
        return [(0, 1 << 64, f"its .eh_frame cannot be read ({type(exc).__name__}) and it has a .gcc_except_table")]
    out = []
    for entry in entries:
        if isinstance(entry, FDE) and entry.lsda_pointer:
            lo = entry.header["initial_location"]
            out.append((lo, lo + entry.header["address_range"], f"its frame has an LSDA at {entry.lsda_pointer:#x}"))
    return sorted(out)


def _merged(frames: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Sorted frames with the overlapping ones made one (keeping the first one's reason)."""
    out: list[tuple[int, int, str]] = []
    for lo, hi, why in sorted(frames):
        if out and lo < out[-1][1]:
            out[-1] = (out[-1][0], max(hi, out[-1][1]), out[-1][2])
        else:
            out.append((lo, hi, why))
    return out


def jump_totals(sections) -> dict:
    """The ``jump_probe`` sections of several images added up: eligible, refusals by bucket,
    instructions, and whether every one and the sum add up."""
    sections = list(sections)
    refused: Counter = Counter()
    for j in sections:
        refused.update(j["refused"])
    eligible = sum(j["eligible"] for j in sections)
    instructions = sum(j["instructions"] for j in sections)
    unchecked = sorted({u for j in sections for u in j.get("unchecked", ())})
    return {"eligible": eligible, "refused": dict(refused.most_common()), "instructions": instructions,
            "totals_add_up": all(j["totals_add_up"] for j in sections)
            and eligible + sum(refused.values()) == instructions,
            "share": round(eligible / instructions, 4) if instructions else 0.0,
            "block_proofs": sum(j.get("block_proofs", 0) for j in sections), "images": len(sections),
            **({"unchecked": unchecked} if unchecked else {})}


def empty_jump_section() -> dict:
    """The ``jump_probe`` section of an image with no function: nothing to answer, totals that add up."""
    return {"eligible": 0, "refused": {}, "instructions": 0, "totals_add_up": True, "share": 0.0, "examples": {}}


def render_jump_totals(totals: dict, escape=str, top: int = 8) -> str:
    """Lines for the totals of :func:`jump_totals`."""
    lines = [f"jump probes: {totals['eligible']:,} of {totals['instructions']:,} instructions eligible "
             f"({100 * totals['share']:.1f}%), {sum(totals['refused'].values()):,} refused; "
             f"totals add up: {totals['totals_add_up']}"]
    lines += [f"  {v:>9,}  {escape(k)}" for k, v in list(totals["refused"].items())[:top]]
    lines += [f"  not checked: {escape(u)}" for u in totals.get("unchecked", ())]
    return "\n".join(lines) + "\n"
