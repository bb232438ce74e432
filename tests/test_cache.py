"""The proof cache: its key must capture everything a verdict depends on.

proof.cache_key reuses a verdict across instances on two grounds, both
tested here: (1) the VEX lifter's output for the same bytes depends on the
address only through PC constants (A, A+len, A+len+field) and, for an
instruction that is not blind to it, a data address's alignment; (2)
instances with equal keys get equal verdicts when proved afresh.
"""

from __future__ import annotations

from contextlib import contextmanager

import struct

import iced_x86
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relocverify.proof import semantics as S
from relocverify.x86.decode import decode
from relocverify.plan.plan import make_plan
from relocverify.proof.cache_key import alignment_blind, cache_key, pc_fields
from relocverify.proof.canonical import canon_block
from relocverify.proof.prove import prove_plan, prove_relocation
from relocverify.proof.verdict import Verdict

MASK64 = (1 << 64) - 1
SAMPLES = [
    "48 8b 05 10 00 00 00", "48 81 3d 10 00 00 00 78 56 34 12", "f0 ff 05 10 00 00 00", "ff 35 10 00 00 00",
    "48 8d 05 f0 ff ff ff", "c5 f9 6f 05 20 00 00 00", "66 89 3d 10 00 00 00", "0f b6 05 01 00 00 00",
    "7e 10", "7f f0", "0f 85 00 01 00 00", "eb 10", "e9 00 01 00 00", "e2 10", "e3 f0", "c7 f8 00 01 00 00",
    "e8 00 01 00 00", "ff 15 10 00 00 00", "f3 a4", "f3 48 ab", "48 01 d8", "0f 1f 44 00 00", "c3",
    "0f 28 05 20 00 00 00", "66 0f 6f 05 20 00 00 00",
]
kernel_text = st.integers(0xFFFFFFFF81000000, 0xFFFFFFFF9FFFFFFF)


def _roles(node, values: dict):
    """The canonical IR with every PC-derived constant replaced by its role."""
    if isinstance(node, tuple):
        if len(node) == 3 and node[0] == "c" and node[2] in values:
            return ("c", node[1], values[node[2]])
        return tuple(_roles(n, values) for n in node)
    if isinstance(node, int) and node in values:
        return values[node]
    return node


def _role_ir(raw: bytes, at: int):
    """(the roles of the PC-derived values, the canonical IR with each replaced by its role)."""
    values = {at: "A", (at + len(raw)) & MASK64: "A+len"}
    for k, f in enumerate(pc_fields(raw, at)):
        values.setdefault(f.value, f"field{k}@{f.value & 63}" if f.data else f"field{k}")
    return tuple(sorted(values.values())), _roles(canon_block(S.lift(raw, at, max_inst=1), lambda v: v), values)


def _moved(raw: bytes, at: int, k: int, j: int) -> int:
    """``at`` moved by 64*k bytes, and by ``j`` more when no data address of the instruction there keeps its
    alignment in its role (``cache_key.alignment_blind``): an address with the same roles."""
    fields = pc_fields(raw, at) or []
    return (at + 64 * k + (0 if any(f.data for f in fields) else j)) & MASK64


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(SAMPLES), kernel_text, st.integers(-(1 << 20), 1 << 20), st.integers(1, 63))
def test_lifter_depends_on_the_address_only_through_pc_constants(hexes, a1, k, j):
    """Same roles (data addresses with the same alignment mod 64, unless the instruction is blind to it) =>
    same IR."""
    raw = bytes.fromhex(hexes)
    a2 = _moved(raw, a1, k, j)
    roles1, ir1 = _role_ir(raw, a1)
    roles2, ir2 = _role_ir(raw, a2)
    assert roles1 == roles2 and ir1 == ir2


def test_vex_checks_alignment_at_lift_time():
    """Why a data address's alignment is part of its role: vmovdqa from a
    misaligned constant address lifts to an unconditional SIGSEGV exit."""
    raw = bytes.fromhex("c5 f9 6f 05 20 00 00 00")
    aligned, misaligned = 0xFFFFFFFF81000000 - 8, 0xFFFFFFFF81000000
    assert _role_ir(raw, aligned)[1] != _role_ir(raw, misaligned)[1]


@pytest.mark.parametrize("hexes, blind", [
    ("48 8b 05 10 00 00 00", True), ("0f b6 05 01 00 00 00", True), ("48 81 3d 10 00 00 00 78 56 34 12", True),
    ("66 89 3d 10 00 00 00", True), ("48 8d 05 f0 ff ff ff", True), ("48 0f ab 05 10 00 00 00", True),
    ("f0 ff 05 10 00 00 00", False),  # LOCK: a split lock is another event than an aligned one
    ("48 87 15 10 00 00 00", False),  # xchg with memory: locked without the prefix
    ("c5 f9 6f 05 20 00 00 00", False), ("66 0f 6f 05 20 00 00 00", False), ("0f 28 05 20 00 00 00", False),
    ("48 0f c7 0d 10 00 00 00", False),  # cmpxchg16b: #GP when misaligned
    ("0f ae 05 10 00 00 00", False),  # fxsave
    ("ff 15 10 00 00 00", False), ("ff 35 10 00 00 00", False),  # an indirect call, a push: not in the list
    ("8c 05 10 00 00 00", False),  # mov from a segment register
    ("66 0f 7e 05 10 00 00 00", False),  # movd from an xmm register
])
def test_which_instructions_are_blind_to_their_operand_alignment(hexes, blind):
    raw = bytes.fromhex(hexes)
    ins = iced_x86.Decoder(64, raw, ip=0xFFFFFFFF81000000).decode()
    assert alignment_blind(ins) is blind
    assert [f.data for f in pc_fields(raw, 0xFFFFFFFF81000000)] == [not blind]  # the operand's role keeps its alignment


BLIND_CHECKED = list(dict.fromkeys(SAMPLES + ["48 0f c7 0d 10 00 00 00", "0f ae 05 10 00 00 00",
                                               "48 0f ab 05 10 00 00 00", "f0 48 0f b1 0d 10 00 00 00"]))


@pytest.mark.parametrize("hexes", BLIND_CHECKED)
def test_an_instruction_keyed_without_alignment_lifts_alike_at_every_alignment(hexes):
    """Every instruction of the samples whose data address keeps no alignment in its role lifts to the same IR
    (roles substituted) at each of 64 consecutive addresses; and some that keep it do not (movdqa,
    cmpxchg16b), which is why they keep it."""
    raw = bytes.fromhex(hexes)
    base = 0xFFFFFFFF81000000
    irs = {repr(_role_ir(raw, base + j)[1]) for j in range(64)} if all(
        not f.data for f in pc_fields(raw, base)) else None
    assert irs is None or len(irs) == 1, hexes
    if hexes in ("66 0f 6f 05 20 00 00 00", "48 0f c7 0d 10 00 00 00"):
        assert irs is None and len({repr(_role_ir(raw, base + j)[1]) for j in range(0, 64, 4)}) > 1



@settings(max_examples=60, deadline=None)
@given(st.sampled_from(SAMPLES), kernel_text, kernel_text, st.integers(0xFFFFFFFFC0000000, 0xFFFFFFFFC7FFFFFF))
def test_equal_keys_mean_equal_verdicts(hexes, a1, a2, t):
    raw = bytes.fromhex(hexes)
    d1, d2 = decode(raw, a1), decode(raw, a2)
    p1, p2 = make_plan(d1, t), make_plan(d2, t)
    k1, k2 = cache_key(d1, p1), cache_key(d2, p2)
    if k1 is not None and k1 == k2:
        r1, r2 = prove_plan(d1, p1), prove_plan(d2, p2)
        assert (r1.verdict, r1.method) == (r2.verdict, r2.method)


def test_roles_are_part_of_the_key():
    """A jcc trampoline whose taken and fall-through exits are swapped has the
    same bytes-with-fields-zeroed shape but other roles: another key, and refuted."""
    a, t = 0xFFFFFFFF81234560, 0xFFFFFFFFC0001000
    d = decode(bytes.fromhex("7e 10"), a)
    plan = make_plan(d, t)
    good = plan.trampoline  # jle rel32 -> target; jmp rel32 -> A+2
    target, back = d.branch_target, d.end
    swapped = (good[:2] + struct.pack("<i", back - (t + 6)) + b"\xe9" + struct.pack("<i", target - (t + 11)))
    good_key = cache_key(d, plan)
    from dataclasses import replace

    bad_key = cache_key(d, replace(plan, trampoline=swapped))
    assert good_key is not None and bad_key is not None and good_key != bad_key
    assert prove_relocation(d, swapped, t).verdict is Verdict.REFUTED


def test_ambiguous_roles_get_no_key():
    """jmp +0 targets A+len itself: its roles are ambiguous, so it is never cached."""
    a, t = 0xFFFFFFFF81234560, 0xFFFFFFFFC0001000
    d = decode(bytes.fromhex("eb 00"), a)
    assert cache_key(d, make_plan(d, t)) is None


@pytest.mark.parametrize("hexes", ["48 01 d8", "f3 a4", "0f a2"])
def test_copies_are_keyed_by_bytes_and_jump_form(hexes):
    raw = bytes.fromhex(hexes)
    near, far = 0xFFFFFFFFC0001000, 0x00007F0000001000
    d1, d2 = decode(raw, 0xFFFFFFFF81000000), decode(raw, 0xFFFFFFFF82345678)
    assert cache_key(d1, make_plan(d1, near)) == cache_key(d2, make_plan(d2, near))
    assert cache_key(d1, make_plan(d1, near)) != cache_key(d1, make_plan(d1, far))


@pytest.mark.slow
def test_lifter_invariance_on_real_kernel_instructions():
    """The invariance the shape cache relies on, over address-dependent
    instructions of the real Debian kernel, each also lifted 64*k bytes away, and a few bytes more when no
    data address of it keeps its alignment (``cache_key.alignment_blind``)."""
    import random

    from relocverify.image.fetch import fetch
    from relocverify.image.functions import find_functions, iter_instruction_spans
    from relocverify.image.loader import load_image

    image = load_image(fetch("debian-6.1-cloud").vmlinux)
    rng = random.Random(7)
    functions = rng.sample(find_functions(image), 3000)
    checked = 0
    for f in functions:
        for at, raw in iter_instruction_spans(image, f):
            fields = pc_fields(raw, at)
            if not fields or any(struct.pack("<I", v & 0xFFFFFFFF) in raw for v in
                                 [f.value for f in fields] + [at, at + len(raw)]):
                continue  # an immediate equal to a PC value: the test's substitution by value would conflate them
            try:
                roles1, ir1 = _role_ir(raw, at)
                roles2, ir2 = _role_ir(raw, _moved(raw, at, rng.randint(-4096, 4096), rng.randint(1, 63)))
            except S.Gap:
                continue
            assert roles1 == roles2 and ir1 == ir2, (hex(at), raw.hex())
            checked += 1
    assert checked > 10_000


# --- instance keys (engine.keys) determine the full key -----------------------------

IMMEDIATE_SAMPLES = ["48 83 c4 08", "48 81 ec 00 01 00 00", "c7 47 08 01 00 00 00", "b8 44 33 22 11",
                     "48 b8 88 77 66 55 44 33 22 11", "48 c1 e0 05", "d1 e0", "c0 e8 07", "48 0f ba e0 05",
                     "f6 c1 01", "48 f7 c7 00 10 00 00", "6a 10", "68 00 10 00 00", "48 6b c0 0c",
                     "66 83 f8 02", "80 3d 10 00 00 00 01", "83 05 10 00 00 00 01", "41 80 78 05 00",
                     "65 48 8b 04 25 28 00 00 00", "65 8b 04 25 00 00 00 00", "48 8b 04 25 00 10 00 00"]



def _full(raw: bytes, at: int, t: int):
    d = decode(raw, at)
    plan = make_plan(d, t)
    return (plan.kind.value, plan.rule, getattr(d, "opname", type(d).__name__), cache_key(d, plan))


def _check_instance_keys(instances, t: int) -> int:
    """Group (bytes, address) instances by instance key; every group must share its full key,
    plan kind, rule and class.  Returns how many groups had more than one member."""
    from relocverify.engine.keys import KeyMaker, per_instance

    maker = KeyMaker(t)
    groups: dict[bytes, tuple] = {}
    shared = 0
    for raw, at in instances:
        key = maker.key(raw, at)
        full = _full(raw, at, t)
        if per_instance(key):
            assert full[3] is None or full[0] == "reject", (raw.hex(), hex(at))
            continue
        if key in groups:
            assert groups[key][0] == full, (raw.hex(), hex(at), groups[key][1])
            shared += 1
        else:
            groups[key] = (full, (raw.hex(), hex(at)))
    return shared


def _with_fields(raw: bytes, rng, at: int) -> bytes:
    """``raw`` with its displacement and immediate bytes drawn at random (the decode's own offsets)."""
    d = decode(raw, at)
    if not hasattr(d, "disp_size"):
        return raw
    b = bytearray(raw)
    for off, size in ((d.disp_offset, d.disp_size), (d.imm_offset, d.imm_size)):
        for k in range(off, off + size):
            b[k] = rng.randrange(256)
    return bytes(b)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(SAMPLES + IMMEDIATE_SAMPLES), st.randoms(use_true_random=False),
       st.sampled_from([0xFFFFFFFFC0001000, 0xFFFFFFFF81234000, 0x00007F0000001000, 0xFFFFFFFFC0000010]))
def test_an_instance_key_determines_the_full_key(hexes, rng, t):
    """The engine looks a finding up by instance key (engine.keys) instead of decoding, planning
    and computing the full key: instances with the same instance key must have the same full key,
    plan kind, rule and class.  Addresses near T, near rel32's edge and far away, with random
    displacements and immediates."""
    raw = bytes.fromhex(hexes)
    instances = []
    for _ in range(12):
        choice = rng.random()
        if choice < 0.3:
            at = (t + rng.randrange(-300, 300)) & MASK64
        elif choice < 0.5:
            at = (t + rng.choice([-1, 1]) * ((1 << 31) + rng.randrange(-300, 300))) & MASK64
        else:
            at = rng.randrange(0xFFFFFFFF81000000, 0xFFFFFFFF9FFFFFFF)
        instances.append((_with_fields(raw, rng, at), at))
    from relocverify.engine.keys import KeyMaker, per_instance

    maker = KeyMaker(t)
    # one pair that must share a key: an instance whose key is not per instance, twice (when one exists)
    instances += [next((i for i in instances if not per_instance(maker.key(*i))), instances[0])]
    shared = _check_instance_keys(instances, t)
    assert shared >= 1 or all(per_instance(maker.key(r, a)) for r, a in instances), "nothing was compared"


@pytest.mark.parametrize("hexes", IMMEDIATE_SAMPLES)
def test_operand_immediates_do_not_change_the_verdict(hexes):
    """Why cache_key.IMMEDIATE_OPERANDS may leave their immediate out of a copy's key: the same
    instruction with many immediate values (0, 1, the shift-count and sign edges, random) gets
    the same verdict, by the same method."""
    import random

    from relocverify.proof.cache_key import copy_shape, operand_immediate

    rng = random.Random(hexes)
    a, t = 0xFFFFFFFF81234560, 0xFFFFFFFFC0001000
    d = decode(bytes.fromhex(hexes), a)
    if not operand_immediate(d):
        return
    o, n = d.imm_offset, d.imm_size
    values = [0, 1, 2, 7, 8, 31, 32, 63, 64, 0x7F, 0x80, 0xFF, (1 << 8 * n) - 1] + [rng.getrandbits(8 * n)
                                                                                     for _ in range(8)]
    seen = set()
    for v in values:
        raw = d.raw[:o] + (v & ((1 << 8 * n) - 1)).to_bytes(n, "little") + d.raw[o + n:]
        dv = decode(raw, a)
        assert copy_shape(dv) == copy_shape(d)
        r = prove_plan(dv, make_plan(dv, t))
        seen.add((r.verdict, r.method))
    assert len(seen) == 1, seen


@pytest.mark.slow
def test_instance_keys_determine_full_keys_on_real_kernel_instructions():
    """The same claim over every instance of 2,000 random functions of the Debian 6.1 kernel
    (each distinct full key computed once per instance key group member)."""
    import random

    from relocverify.image.fetch import fetch
    from relocverify.image.functions import find_functions, iter_instruction_spans
    from relocverify.image.loader import load_image

    image = load_image(fetch("debian-6.1-cloud").vmlinux)
    rng = random.Random(11)
    instances = [(raw, at) for f in rng.sample(find_functions(image), 2000)
                 for at, raw in iter_instruction_spans(image, f)]
    shared = _check_instance_keys(instances, 0xFFFFFFFFC0001000)
    assert len(instances) > 80_000 and shared > 50_000


def _reference_keys(t: int, data: bytes, start: int) -> list[tuple[int, int, bytes]]:
    """What ``KeyMaker.keys`` must give: each instruction's key made by the general case analysis
    (``KeyMaker._key``) from a fresh decode of its own bytes, nothing remembered."""
    from iced_x86 import Decoder, Instruction

    from relocverify.engine.keys import KeyMaker

    maker, out, pos = KeyMaker(t), [], 0
    walk = Decoder(64, data, ip=start & MASK64)
    for ins in walk:
        raw = data[pos:pos + ins.len]
        dec = Decoder(64, raw, ip=(start + pos) & MASK64)
        one = Instruction()
        dec.decode_out(one)
        out.append((pos, ins.len, maker._key(dec, one, raw, start + pos, None)))
        pos += ins.len
    return out


_BRANCHY = ["7e 10", "7f f0", "0f 85 00 01 00 00", "eb 00", "eb fe", "e9 00 01 00 00", "e8 fb ff ff ff", "e2 10",
            "e3 f0", "c7 f8 00 01 00 00", "66 e9 10 00", "48 e9 00 00 00 00", "f2 e9 00 01 00 00", "c3", "0f 0b"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(SAMPLES + IMMEDIATE_SAMPLES + _BRANCHY).map(bytes.fromhex),
                          st.binary(min_size=1, max_size=6)), min_size=1, max_size=24),
       st.sampled_from([0xFFFFFFFFC0001000, 0xFFFFFFFF81234000]),
       st.sampled_from(["kernel", "near T", "rel32 edge", "far"]), st.integers(0, 1 << 20))
def test_the_walk_gives_each_instruction_the_key_of_its_case_analysis(parts, t, where, jitter):
    """``KeyMaker.keys`` takes the commonest cases without a call (keys remembered by bytes, new
    keys of kind b, near relative branches); every key it gives is the one ``KeyMaker._key`` makes
    for the instruction alone.  Functions in kernel text, within a few hundred bytes of T, at the
    edge of rel32 reach from T and beyond it (where no jump back is near and nothing is taken
    early), each walked twice (the second time from remembered keys), by ``key_walk`` (C) and by
    the walk's Python loop."""
    data = b"".join(parts)
    start = {"kernel": 0xFFFFFFFF81000000 + jitter, "near T": t - 128 + jitter % 256,
             "rel32 edge": t + (1 << 31) - 300 + jitter % 512, "far": t - (1 << 40) + jitter}[where] & MASK64
    _walks_as_expected(t, data, start, _reference_keys(t, data, start))


#: Instructions with a displacement and an immediate: some immediates the keys leave out (``IMMEDIATE_OPERANDS``:
#: add, mov, imul, test, shl, bt), some they keep (shld, palignr, pshufw select another operation).
_FIELDS = ["4883443d{d}{i}", "48c7443d{d}{i}{i}{i}{i}", "486b443d{d}{i}", "f6443d{d}{i}", "c1643d{d}{i}",
           "480fba643d{d}{i}", "0fa4443d{d}{i}", "660f3a0f443d{d}{i}", "0f70443d{d}{i}", "c6443d{d}{i}",
           "8b05{d}{d}{d}{d}", "48c705{d}{d}{d}{d}{i}{i}{i}{i}", "833d{d}{d}{d}{d}{i}", "0f1805{d}{d}{d}{d}"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_FIELDS), st.sampled_from([0, 1, 0x40, 0xF8]), st.sampled_from([0, 1, 7, 0x80])),
                min_size=2, max_size=12), st.integers(0, 1 << 20))
def test_key_walk_keys_the_fields_of_a_shape_as_the_case_analysis(instances, jitter):
    """Instances of one shape with other displacements and immediates (zero among them): the C walk keys each
    from the shape it met, the immediates the keys keep kept, and RIP-relative operands with their own
    alignment; as the case analysis does, walked twice."""
    t, start = 0xFFFFFFFFC0001000, (0xFFFFFFFF81000000 + jitter) & MASK64
    data = b"".join(bytes.fromhex(f.format(d=f"{d:02x}", i=f"{i:02x}")) for f, d, i in instances)
    _walks_as_expected(t, data, start, _reference_keys(t, data, start))


def _walks_as_expected(t: int, data: bytes, start: int, expected: list) -> None:
    """``KeyMaker.keys`` gives ``expected`` by ``key_walk`` (C) and by the walk's Python loop, each walking twice
    (the second time from remembered keys)."""
    from relocverify.engine.keys import KeyMaker

    for native in (True, False):
        with _key_walk(native):
            maker = KeyMaker(t)
            assert maker.keys(data, start) == expected
            assert maker.keys(data, start) == expected


@contextmanager
def _key_walk(native: bool):
    """``KeyMaker.walk`` with ``key_walk`` (C) or with its Python loop alone."""
    from relocverify.engine import keys

    kept = keys.KEY_WALK
    if native:
        assert kept is not None, "key_walk is not built"
    else:
        keys.KEY_WALK = None
    try:
        yield
    finally:
        keys.KEY_WALK = kept


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(SAMPLES + IMMEDIATE_SAMPLES + _BRANCHY).map(bytes.fromhex),
                          st.binary(min_size=1, max_size=6)), min_size=1, max_size=16),
       st.lists(st.binary(min_size=1, max_size=20), max_size=6), st.integers(0, 1 << 20))
def test_key_walk_takes_only_whole_instructions_iced_decoded(parts, asked, jitter):
    """``key_walk`` takes bytes it finds remembered as a whole instruction.  Remembered: whatever ``key`` was
    asked of first (bytes longer or shorter than an instruction, invalid bytes) and functions cut short
    (their last instruction truncated); walked after them, every key is still the case analysis' one."""
    from relocverify.engine.keys import KeyMaker

    t, start = 0xFFFFFFFFC0001000, (0xFFFFFFFF81000000 + jitter) & MASK64
    data = b"".join(parts)
    maker = KeyMaker(t)
    for raw in asked:
        maker.key(raw, start)
    for cut in range(1, min(len(data), 12)):
        maker.keys(data[:cut], start)
        maker.keys(data[-cut:], start)
    assert maker.keys(data, start) == _reference_keys(t, data, start)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(SAMPLES + IMMEDIATE_SAMPLES).map(bytes.fromhex), max_size=6),
       st.sampled_from(["e9", "0f 84", "e8", "eb", "74", "e2"]),
       st.sampled_from(["T", "near T", "rel32 edge", "A", "A+len", "kernel"]), st.integers(-300, 300))
def test_the_walk_keys_branches_aimed_where_the_keys_tell_distances_apart(parts, opcode, aim, delta):
    """Relative branches of a kernel function aimed where ``_where`` is exact (within 256 bytes of
    T, at the edge of rel32 reach) and at their own A and A+len: the walk's near-branch case must
    leave them to the case analysis."""
    t, start = 0xFFFFFFFFC0001000, 0xFFFFFFFF81000000 + 0x40000
    op = bytes.fromhex(opcode)
    width = 1 if opcode in ("eb", "74", "e2") else 4
    # first the same branch aimed a little ahead in kernel text: its near key makes its head known to key_walk,
    # which then meets the branch under test with the head known
    prefix = op + (16).to_bytes(width, "little") + b"".join(parts)
    a = start + len(prefix)
    n = len(op) + width
    target = {"T": t + delta, "near T": t + 256 + delta, "rel32 edge": a + n + (1 << 31) - 1 - abs(delta),
              "A": a, "A+len": a + n, "kernel": a + 4096 + delta}[aim]
    rel = target - (a + n)
    if not -(1 << (8 * width - 1)) <= rel < 1 << (8 * width - 1):
        return
    data = prefix + op + rel.to_bytes(width, "little", signed=True) + bytes.fromhex("c3")
    _walks_as_expected(t, data, start, _reference_keys(t, data, start))


@pytest.mark.slow
def test_the_walk_gives_the_case_analysis_keys_on_real_kernel_functions():
    """The same over 1,500 random functions of the Debian 6.1 kernel, with the trampoline where a
    run puts it and in the middle of kernel text."""
    import random

    from relocverify.engine.keys import KeyMaker
    from relocverify.image.fetch import fetch
    from relocverify.image.functions import find_functions
    from relocverify.image.loader import load_image

    image = load_image(fetch("debian-6.1-cloud").vmlinux)
    functions = random.Random(5).sample(find_functions(image), 1500)
    for t in (0xFFFFFFFFC0001000, 0xFFFFFFFF81800000):
        for native in (True, False):
            with _key_walk(native):
                maker, kinds = KeyMaker(t), set()
                for f in functions:
                    section = image.get_section(f.section)
                    data = section.data[f.start - section.address:f.start - section.address + f.size]
                    got = maker.keys(data, f.start)
                    assert got == _reference_keys(t, data, f.start), f.name
                    kinds.update(key[:2] for _, _, key in got)
                assert {b"bn", b"dn", b"jn", b"rn"} <= kinds, kinds


def test_key_walk_is_built_from_this_source():
    """The C key walk serves (a build without a compiler would leave the Python loop to, correctly but slowly), built
    from the key_walk.c beside it."""
    from relocverify.engine import native_rows
    from relocverify.extensions import build_digest

    assert native_rows.KEY_WALK is not None, native_rows.KEY_STATUS
    assert build_digest(native_rows.__file__.replace("native_rows.py", "key_walk.c")) == \
        native_rows.KEY_WALK.SOURCE_SHA256


@pytest.mark.slow
def test_key_walk_guesses_nearly_every_kernel_length():
    """The key walk's length guess is only a guess (a wrong one finds nothing remembered, and iced-x86 answers), but
    it must be right for nearly every instruction of a kernel, or the walk gains nothing: over 1,500 functions,
    at least 99.5% of the lengths, and every relative branch's head where the guess gives one."""
    import random

    from iced_x86 import Decoder

    from relocverify.engine.native_rows import KEY_WALK
    from relocverify.image.fetch import fetch
    from relocverify.image.functions import find_functions
    from relocverify.image.loader import load_image

    image = load_image(fetch("debian-6.1-cloud").vmlinux)
    right = total = 0
    for f in random.Random(6).sample(find_functions(image), 1500):
        section = image.get_section(f.section)
        data = section.data[f.start - section.address:f.start - section.address + f.size]
        pos = 0
        for ins in Decoder(64, data, ip=f.start):
            raw = data[pos:pos + ins.len]
            n, head, *_ = KEY_WALK.guess(raw)
            total += 1
            right += n == ins.len
            if head:
                co = Decoder(64, raw, ip=f.start + pos)
                one = co.decode()
                offsets = co.get_constant_offsets(one)
                assert offsets.has_immediate and offsets.immediate_offset == head, raw.hex()
            pos += ins.len
    assert right >= 0.995 * total, (right, total)
