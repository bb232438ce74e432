"""Jump-probe blocks: plan_block's layout and refusals, prove_block's proofs and refutations.

Every mutant below must never be proved; those with an observable difference
must be refuted with a counterexample unicorn replayed (the lock mutant is
refuted by the atomicity obligation, which a replay cannot see)."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relocverify.concrete.outcome import MachineState
from relocverify.plan.block import JUMP_SIZE, BlockPlan, NoBlock, plan_block
from relocverify.plan.plan import PlanKind
from relocverify.proof.block import prove_block, replay_block
from relocverify.proof.verdict import Verdict
from relocverify.x86.decode import decode
from relocverify.x86.encoding import jump

A = 0xFFFFFFFF81000000
T = 0xFFFFFFFFA0000000


def decode_run(hexes: str, at: int = A) -> list:
    raw, out, off = bytes.fromhex(hexes.replace(" ", "")), [], 0
    while off < len(raw):
        d = decode(raw[off:], at + off)
        out.append(d)
        off += d.length
    return out


def block(hexes: str, tramp: int = T) -> BlockPlan:
    b = plan_block(decode_run(hexes), tramp)
    assert isinstance(b, BlockPlan), b
    return b


def relink(b: BlockPlan, pieces: list[bytes]) -> BlockPlan:
    """A hand-made block over the same instructions: ``pieces`` back to back from T, each
    piece given as a function of (its start, the next start) -> bytes."""
    starts, code, t = [], b"", b.tramp
    sizes = [len(p(0, 0)) for p in pieces]
    for i, p in enumerate(pieces):
        starts.append(t)
        nxt = t + sizes[i]
        code += p(t, nxt)
        t = nxt
    return dataclasses.replace(b, starts=tuple(starts), trampoline=code, tracer_memory=((b.tramp, len(code)),))


def copy_of(raw: bytes, last_to: int | None = None):
    return lambda t, nxt: raw + jump(t + len(raw), nxt if last_to is None else last_to)


# --- plan_block ----------------------------------------------------------------------------------

def test_a_block_covers_the_jump_with_whole_instructions_and_links_them():
    b = block("55 4889e5 53 4883ec08")  # push %rbp; mov %rsp,%rbp; push %rbx; (not needed)
    assert b.length == 5 and len(b.instructions) == 3 and b.length >= JUMP_SIZE
    assert b.starts[0] == T and list(b.starts) == sorted(b.starts)
    for i, plan in enumerate(b.plans):
        assert plan.kind is PlanKind.COPY and plan.tramp == b.starts[i]
        assert b.piece(i).startswith(plan.trampoline)
        resume = b.starts[i + 1] if i + 1 < len(b.plans) else A + 5
        assert plan.trampoline[-5:] == jump(b.starts[i] + len(plan.trampoline) - 5, resume)
    assert b.tracer_memory == ((T, len(b.trampoline)),)
    assert b.as_json()["starts"][0] == hex(T)


def test_refusals_are_values_with_stable_keys():
    cases = {
        "e8 00000000": "call-in-range",
        "53 ff d0 90 90": "call-in-range",        # push; call *%rax
        "53 c3 90 90 90": "emulated",             # push; ret
        "53 ff e0 90 90": "emulated",             # push; jmp *%rax
        "53 0f0b 90 90": "rejected",              # push; ud2
        "53 cc 90 90 90": "rejected",             # push; int3
        "53 f4 90 90 90": "rejected",             # push; hlt
        "53 0f05 90 90": "rejected",              # push; syscall
        "55 4889e5": "past-function-end",
        "55 0f": "undecodable",
        "74 01 90 90 90 90": "branch-into-range",  # je to A+3, inside [A, A+5)
    }
    for hexes, key in cases.items():
        out = plan_block(decode_run(hexes), T)
        assert isinstance(out, NoBlock) and out.key == key, (hexes, out)
        assert out.reason
    assert "return into the trampoline" in plan_block(decode_run("e8 00000000"), T).reason


def test_a_trampoline_on_the_range_is_refused():
    out = plan_block(decode_run("55 4889e5 53"), A + 2)
    assert isinstance(out, NoBlock)


# --- proofs ------------------------------------------------------------------------------------------

PROVABLE = [
    "55 4889e5 53",                      # push %rbp; mov %rsp,%rbp; push %rbx
    "488b0510000000 4801c3",             # mov 0x10(%rip),%rax; add %rax,%rbx
    "75 10 4889e5",                      # jne (out of the range); mov %rsp,%rbp
    "4889e5 f3a4",                       # mov; rep movsb
    "31c9 ffc1 f3a4",                    # xor %ecx,%ecx; inc %ecx; rep movsb (iterates at A_2)
    "f0ff00 4889e5",                     # lock incl (%rax); mov
    "488703 4889e5",                     # xchg %rax,(%rbx): implicitly locked
    "4883c001 4883d800",                 # add; sbb: flags flow from one into the next
    "8b05f0ffffff 01c8",                 # mov -0x10(%rip),%eax; add %ecx,%eax
]


@pytest.mark.parametrize("hexes", PROVABLE)
def test_blocks_of_real_instructions_are_proved_fast_and_by_smt(hexes):
    b = block(hexes)
    for fast in (True, False):
        result = prove_block(b, use_fast_path=fast)
        assert result.verdict is Verdict.PROVED, (hexes, fast, result.reason)
        if not fast:
            assert result.method == "smt"


def test_a_rep_inside_the_block_is_proved_from_where_it_restarts():
    result = prove_block(block("31c9 ffc1 f3a4"), use_fast_path=False)
    assert result.verdict is Verdict.PROVED and "from instructions 2" in result.reason


def test_a_far_trampoline_uses_absolute_exits_and_still_proves_in_user_space():
    b = plan_block(decode_run("488b0510000000 4801c3", 0x401000), 0x7FFF00000000)  # out of reach: scratch
    assert isinstance(b, BlockPlan) and b.plans[0].rule == "rip-scratch" and b.plans[0].save_slot is not None
    assert prove_block(b, use_fast_path=False).verdict is Verdict.PROVED


def test_a_far_trampoline_of_a_kernel_block_is_not_proved_under_ibt():
    """Its absolute exits are indirect jumps the original does not make: on an IBT kernel their targets
    must be endbr64 (``proof.machine_model``, row ibt-kernel)."""
    b = block("488b0510000000 4801c3", tramp=0xFFFFC90000001000)  # vmalloc space: out of rel32 reach
    result = prove_block(b, use_fast_path=False)
    assert result.verdict is Verdict.UNKNOWN and "IBT" in result.reason


# --- mutants -------------------------------------------------------------------------------------------

def assert_refuted_with_replay(result):
    assert result.verdict is Verdict.REFUTED, result.reason
    assert result.counterexample is not None and result.counterexample.replayed is True, result.render()


def test_a_dropped_instruction_is_refuted():
    b = block("55 4889e5 53")
    raws = [i.raw for i in b.instructions]
    mutant = relink(b, [copy_of(raws[0]), lambda t, nxt: jump(t, nxt), copy_of(raws[2], A + 5)])
    assert_refuted_with_replay(prove_block(mutant))


def test_swapped_instructions_that_do_not_commute_are_refuted():
    b = block("55 4889e5 53")
    raws = [i.raw for i in b.instructions]
    mutant = relink(b, [copy_of(raws[1]), copy_of(raws[0]), copy_of(raws[2], A + 5)])
    assert_refuted_with_replay(prove_block(mutant))


def test_an_exit_one_byte_short_is_refuted():
    b = block("55 4889e5 53")
    raws = [i.raw for i in b.instructions]
    mutant = relink(b, [copy_of(raws[0]), copy_of(raws[1]), copy_of(raws[2], A + 4)])
    result = prove_block(mutant)
    assert_refuted_with_replay(result)
    assert any(d.what == "rip" for d in result.counterexample.differences)


def test_a_truncated_displacement_is_refuted():
    b = block("488b0510000000 4801c3")
    piece = bytearray(b.piece(0))
    disp = struct.unpack_from("<i", piece, 3)[0]
    struct.pack_into("<i", piece, 3, disp & 0xFFFF)  # the high half of the re-targeted disp lost
    code = bytes(piece) + b.trampoline[len(piece):]
    mutant = dataclasses.replace(b, trampoline=code)
    assert_refuted_with_replay(prove_block(mutant))


def test_a_dropped_lock_is_refuted_by_atomicity():
    b = block("f0ff00 4889e5")
    raws = [i.raw for i in b.instructions]
    mutant = relink(b, [copy_of(raws[0][1:]), copy_of(raws[1], A + 5)])
    result = prove_block(mutant)
    assert result.verdict is Verdict.REFUTED and result.method == "atomicity"
    assert "LOCK dropped" in result.reason


_LOCKY = ["f0ff00", "f0480fb10b", "488703", "4887c3", "86 03", "90", "4801d8", "488b80f0000000", "8b8786000000",
          "c7808700000000000000", "66f0ff00", "f066ff00", "eb01", "eb02", "7401", "e800000000", "f3a4", "3e ff00"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["4801d8", "ff00", "488b80f0000000", "90", "f0ff00", "488703"]),
       st.lists(st.one_of(st.sampled_from(_LOCKY).map(lambda h: bytes.fromhex(h.replace(" ", ""))),
                          st.binary(min_size=1, max_size=4)), min_size=0, max_size=6),
       st.integers(-(1 << 31), (1 << 31) - 1))
def test_the_atomicity_shortcut_answers_as_decoding_every_instruction(orig, parts, rel):
    """``check_atomicity`` skips decoding the relocation's instructions with both decoders when none of them
    can be locked (``_none_locked``); over relocations with LOCK prefixes, xchg, jumps into prefixes and
    0xf0/0x86/0x87 bytes in displacements and offsets, it answers exactly as the full decoding does."""
    from relocverify.proof import atomicity

    code = b"".join(parts) + b"\xe9" + struct.pack("<i", rel)
    original = decode(bytes.fromhex(orig), A)
    fast = atomicity.check_atomicity(original, code, T, ())
    real = atomicity._none_locked
    try:
        atomicity._none_locked = lambda code, tramp: False
        slow = atomicity.check_atomicity(original, code, T, ())
    finally:
        atomicity._none_locked = real
    assert fast == slow


def test_the_atomicity_shortcut_takes_a_displacement_that_looks_like_a_lock():
    from relocverify.proof import atomicity

    code = bytes.fromhex("488b80f0000000") + b"\xe9" + struct.pack("<i", 0x87F0)
    assert atomicity._none_locked(code, T)
    assert not atomicity._none_locked(bytes.fromhex("f0ff00") + code, T)
    assert not atomicity._none_locked(bytes.fromhex("488703") + code, T)
    assert not atomicity._none_locked(bytes.fromhex("7401" "f0ff00") + code, T)  # either way: both run
    assert atomicity._none_locked(bytes.fromhex("eb01" "f0ff00") + code, T)  # always over the prefix: it never runs


def test_a_jump_back_into_the_patched_range_is_refuted():
    b = block("31c9 ffc1 f3a4")  # xor %ecx,%ecx; inc %ecx; rep movsb: the rep iterates at A_2
    raws = [i.raw for i in b.instructions]
    a2 = b.instructions[2].address

    def rep_by_hand(t, nxt):
        # jrcxz out; movsb; lea -1(%rcx),%rcx; jmp A_2 (raw: the jump's bytes once patched); out: jmp A+L
        body = bytes.fromhex("e30a a4 488d49ff")
        return body + jump(t + 7, a2) + jump(t + 12, A + b.length)

    mutant = relink(b, [copy_of(raws[0]), copy_of(raws[1]), rep_by_hand])
    result = prove_block(mutant)
    assert result.verdict is Verdict.REFUTED and "patched range" in result.reason, result.render()


def test_the_block_replay_runs_both_sides_to_the_same_exit():
    b = block("55 4889e5 53")
    rep = replay_block(b, MachineState({"rsp": 0x10000, "rbp": 0x1234}, {}))
    assert rep.replayable and not rep.differences
    assert rep.original.next_rip == A + 5 == rep.relocated.next_rip
    assert rep.original.registers["rsp"] == 0x10000 - 16


# --- hypothesis: any run of simple instructions is proved; its one-byte-short exit never is ---------

SIMPLE = ["55", "53", "4889e5", "4883ec08", "31c0", "4801d8", "4885c0", "480fafc1", "f7d0", "4c89e7",
          "488b4708", "48894310", "0f1f00", "90", "4883c001", "4819c8"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(SIMPLE), min_size=1, max_size=4))
def test_any_run_of_simple_instructions_is_proved(parts):
    hexes = "".join(parts) + "90" * 5
    b = block(hexes)
    assert prove_block(b).verdict is Verdict.PROVED
    raws = [i.raw for i in b.instructions]
    pieces = [copy_of(r) for r in raws[:-1]] + [copy_of(raws[-1], A + b.length - 1)]
    assert prove_block(relink(b, pieces)).verdict is not Verdict.PROVED


# --- block_key ----------------------------------------------------------------------------------------

def test_block_key_is_position_independent_and_tells_shapes_apart():
    from relocverify.proof.block import block_key

    hexes = "488b0510000000 4801c3"
    here, there = block(hexes), plan_block(decode_run(hexes, A + 0x1000), T + 0x2040)
    assert block_key(here) is not None and block_key(here) == block_key(there)
    other = block("488b0550000000 4801c3")  # another displacement, the same alignment mod 64: the same key
    assert block_key(other) == block_key(here)
    assert block_key(block("55 4889e5 53")) != block_key(block("55 4889e5 51"))
    b = block("55 4889e5 53")
    raws = [i.raw for i in b.instructions]
    short = relink(b, [copy_of(raws[0]), copy_of(raws[1]), copy_of(raws[2], A + 4)])
    assert block_key(short) not in (None, block_key(b))  # an exit to A_2 instead of A+L
    mid = relink(b, [copy_of(raws[0]), copy_of(raws[1]), copy_of(raws[2], A + 3)])
    assert block_key(mid) is None  # an exit to A+3, a role nothing in the original has
    # another alignment mod 64: the same key for a mov, blind to it (``cache_key.alignment_blind``); another for a
    # locked add, which is not
    assert block_key(block("488b0560000000 4801c3")) == block_key(here)
    locked = block("f048010510000000 4801c3")
    assert block_key(locked) is not None and block_key(block("f048010560000000 4801c3")) != block_key(locked)


# --- composition: a block proved piece by piece (engine.jumps keeps each piece's answer) -----------

#: Pieces of every kind the planner makes: copies, rip-relative rewrites, branches out of the range.
PIECES = SIMPLE + ["488b0510000000", "8b05f0ffffff", "48890550000000", "f0ff00", "488703", "75 40", "0f8440000000",
                   "e9 40000000", "f3a4", "0fae38", "0f01f9", "f00fb111"]


def _mutants(b: BlockPlan) -> list[BlockPlan]:
    """Relinked blocks over the same instructions that must not all be proved piece by piece when they
    differ: an exit one byte short, the last piece dropped, two pieces swapped."""
    raws = [i.raw for i in b.instructions]
    out = [relink(b, [copy_of(r) for r in raws[:-1]] + [copy_of(raws[-1], A + b.length - 1)])]
    if len(raws) > 1:
        out.append(relink(b, [copy_of(r) for r in raws[:-1]] + [lambda t, nxt: jump(t, A + b.length)]))
        out.append(relink(b, [copy_of(raws[1]), copy_of(raws[0])] + [copy_of(r) for r in raws[2:-1]]
                          + ([copy_of(raws[-1], A + b.length)] if len(raws) > 2 else [])))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=4))
def test_pieces_proved_one_by_one_make_the_block_proved_by_its_fast_path(parts):
    from hypothesis import assume

    from relocverify.proof.block import FAST_PATH_REASON, piece_proved

    b = plan_block(decode_run("".join(parts).replace(" ", "") + "90" * 5), T)
    assume(isinstance(b, BlockPlan))
    for candidate in [b] + _mutants(b):
        if all(piece_proved(candidate, i) for i in range(len(candidate.instructions))):
            result = prove_block(candidate)
            assert (result.verdict, result.method, result.reason) == (Verdict.PROVED, "fast-path", FAST_PATH_REASON)
    short = _mutants(b)[0]
    assert not all(piece_proved(short, i) for i in range(len(short.instructions)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=4), st.integers(1, 1 << 20), st.integers(0, 1 << 16))
def test_a_piece_key_stands_for_the_pieces_answer_wherever_the_block_sits(parts, da, dt):
    """Two blocks with equal piece keys get the same ``piece_proved`` answer: the same run at another
    address and trampoline, and its mutants there and here (the role of each address-valued field told apart)."""
    from hypothesis import assume

    from relocverify.proof.block import piece_key, piece_proved

    hexes = "".join(parts).replace(" ", "") + "90" * 5
    here, there = plan_block(decode_run(hexes), T), plan_block(decode_run(hexes, A + da), T + dt)
    assume(isinstance(here, BlockPlan) and isinstance(there, BlockPlan))
    blocks = [here, there] + _mutants(here) + _mutants(there)
    for i in range(len(here.instructions)):
        answers: dict[bytes, bool] = {}
        for b in blocks:
            key = piece_key(b, i) if i < len(b.instructions) else None
            if key is not None:
                assert answers.setdefault(key, piece_proved(b, i)) == piece_proved(b, i), (hexes, i)


#: Copies of every sort the lane keys by token: plain, with a register-based displacement, locked,
#: xchg, flushing, fencing, string, timestamp, with an absolute memory operand (near and far from T).
COPIES = SIMPLE + ["f0ff00", "488703", "f3a4", "0fae38", "0f01f9", "f00fb111", "0faee8", "0f31", "ff4018",
                   "48c7470800000000", "8b042500100000", "8b0425000000a0", "0f18400c", "cc", "c3"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(COPIES), st.lists(st.sampled_from(SIMPLE), min_size=1, max_size=3),
       st.integers(1, 1 << 20), st.integers(0, 1 << 16))
def test_a_copy_piece_has_one_answer_linked_or_last(x, fillers, da, dt):
    """``engine.jumps.copy_piece_key`` keys a copy's answer without saying whether it is the last piece
    (``jmp`` back to A+L) or linked (``jmp`` to T_{i+1}): over the same copy first in its run and last in
    another, at other places, with the runs' mutants (an exit one byte short must get no key, or a
    key of its own), equal keys get equal ``piece_proved`` answers.  It fails if the key ignores the
    jump's target."""
    from hypothesis import assume

    from relocverify.engine.jumps import copy_piece_key
    from relocverify.engine.keys import KeyMaker
    from relocverify.proof.block import piece_proved

    fill = "".join(fillers)
    runs = [(x + fill + "90" * 5, A, T), (fill + x + "90" * 5, A + da, T + dt), (x + fill + "90" * 5, A + da, T)]
    blocks = [b for hexes, at, t in runs for b in [plan_block(decode_run(hexes, at), t)] if isinstance(b, BlockPlan)]
    assume(blocks)
    answers: dict[tuple, bool] = {}
    for b in blocks + [m for b in blocks for m in _mutants(b)]:
        keys = KeyMaker(b.tramp)
        for i in range(len(b.instructions)):
            key = copy_piece_key(b, i, b.tramp, keys)
            if key is not None:
                assert answers.setdefault(key, piece_proved(b, i)) == piece_proved(b, i), (x, fill, i)


def test_a_copy_is_keyed_alike_linked_and_last():
    """The property above is not vacuous: a copy first in a run (linked) and last in another share a key."""
    from relocverify.engine.jumps import copy_piece_key
    from relocverify.engine.keys import KeyMaker

    linked, last = block("488b4708 55"), block("55 488b4708")  # mov 0x8(%rdi),%rax; push %rbp
    keys = KeyMaker(T)
    assert copy_piece_key(linked, 0, T, keys) == copy_piece_key(last, 1, T, keys) is not None
    short = _mutants(last)[0]  # the jump back one byte short of A+L
    assert copy_piece_key(short, 1, T, keys) is None


def _bare(b: BlockPlan, back_to: int | None = None) -> BlockPlan:
    """``b``'s instructions as optprobes lays them out: bare copies back to back, falling through into
    each other, and one jump back (to A+L, or ``back_to``)."""
    raws = [i.raw for i in b.instructions]
    return relink(b, [(lambda r: lambda t, nxt: r)(r) for r in raws[:-1]]
                  + [copy_of(raws[-1], A + b.length if back_to is None else back_to)])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=4), st.integers(1, 1 << 20))
def test_a_block_composed_from_kept_pieces_is_what_prove_block_proves(parts, da):
    """``proof.block.composed`` (the tracer audit's composition, answers kept under ``piece_key``)
    says True only for blocks ``prove_block`` proves on its fast path with its reason: over our
    blocks, optprobes' layout (bare copies falling through), their mutants, and the same run
    elsewhere, all sharing one table of piece answers."""
    from hypothesis import assume

    from relocverify.proof.block import FAST_PATH_REASON, composed

    hexes = "".join(parts).replace(" ", "") + "90" * 5
    here, there = plan_block(decode_run(hexes), T), plan_block(decode_run(hexes, A + da), T + 0x40)
    assume(isinstance(here, BlockPlan) and isinstance(there, BlockPlan))
    known: dict[bytes, bool] = {}
    for b in (here, there):
        for candidate in [b, _bare(b), _bare(b, A + b.length - 1)] + _mutants(b):
            if composed(candidate, known):
                result = prove_block(candidate)
                assert (result.verdict, result.method, result.reason) == \
                    (Verdict.PROVED, "fast-path", FAST_PATH_REASON), (hexes, candidate.trampoline.hex())


def test_optprobes_layout_composes_and_a_short_exit_does_not():
    from relocverify.proof.block import composed

    b = block("55 4889e5 53")
    known: dict[bytes, bool] = {}
    assert composed(_bare(b), known) and composed(b, known)
    assert not composed(_bare(b, A + b.length - 1), known)
    assert not composed(dataclasses.replace(b, tracer_memory=b.tracer_memory + ((T + 0x1000, 8),)), known)


def test_piece_keys_tell_roles_apart():
    from relocverify.proof.block import piece_key

    here = block("488b0510000000 4801c3")
    there = plan_block(decode_run("488b0510000000 4801c3", A + 0x1000), T + 0x2040)
    assert piece_key(here, 0) is not None and piece_key(here, 0) == piece_key(there, 0)
    assert piece_key(block("488b0560000000 4801c3"), 0) == piece_key(here, 0)  # another alignment: a mov is blind
    locked = block("f048010510000000 4801c3")  # to it, a locked add is not
    assert piece_key(locked, 0) is not None and piece_key(block("f048010560000000 4801c3"), 0) != piece_key(locked, 0)
    b = block("55 4889e5 53")
    raws = [i.raw for i in b.instructions]
    short = relink(b, [copy_of(raws[0]), copy_of(raws[1]), copy_of(raws[2], A + 4)])
    assert piece_key(short, 2) not in (None, piece_key(b, 2))  # an exit to A_2 instead of A+L
    mid = relink(b, [copy_of(raws[0]), copy_of(raws[1]), copy_of(raws[2], A + 3)])
    assert piece_key(mid, 2) is None  # an exit strictly inside (A, A+L), off the boundaries
    jcc = block("0f8440000000")  # je out of the range: the target is the original's own (f0) at any distance
    assert piece_key(jcc, 0) is not None and piece_key(jcc, 0) == piece_key(block("0f8480000000"), 0)
    near_t = block("8b0425" + struct.pack("<I", (T + 0x100) & 0xFFFFFFFF).hex() + "4889e5")  # mov (T+0x100),%eax
    assert piece_key(near_t, 0) is None  # an absolute operand near the trampoline: tracer memory or not
