"""Instance keys: one cheap key per instruction instance, enough to look its finding up.

Decoding, planning and computing the proof-cache key (``proof.cache_key``)
cost about 100 µs per instruction in Python; a kernel has 2.7 M of them but
only about 100 k distinct instance keys.  ``KeyMaker.keys`` walks a
function's bytes with iced-x86 once and gives every instruction a key from
facts iced gives directly (length, flow control, field offsets, the
RIP-relative or branch target), in a few µs:

  b  bytes        no displacement field, no relative branch and no operand
                  immediate, or anything that is not a plain instruction: the
                  bytes themselves
  d  shape        a non-branching instruction with a (non-RIP-relative)
                  displacement or an operand immediate (``cache_key.
                  IMMEDIATE_OPERANDS``): the bytes with both zeroed, and the
                  displacement's alignment mod 64 when it is an absolute address
  r  rip          a RIP-relative operand: the bytes with the displacement
                  zeroed (kept when the target is out of reach: the scratch
                  plan copies it), where the target lies from T (``_where``),
                  whether it is A or A+len, its alignment mod 64 (0xff for an
                  instruction blind to it: ``cache_key.alignment_blind``), and
                  T mod 64
  j  branch       a relative branch, call, loop or xbegin: the bytes with
                  the offset zeroed, where the target lies from T, and
                  whether it is A or A+len

Every key also says where A+len (the jump back) lies from T.  ``_where``
tells a distance apart only as far as a plan or a cache key can: "near"
(every rel32 from anywhere in a trampoline reaches), "far" (none does), or
the exact distance when it is within ``EXACT`` of T or of the edge of rel32
reach (where a trampoline-internal role or a reach decision depends on it).

The claim the engine rests on: **an instance key determines the
instruction's full proof-cache key, its plan kind, rule and class** (so a
finding stored under one instance stands for every instance with the key).
``tests/test_cache.py`` checks it on samples and on real kernel
instructions; the argument is the case analysis above against
``plan.plan`` (each decision is ``fits_s32(target - (T + k))`` with
0 <= k < 64, or an equality with A, A+len or a trampoline address) and
``proof.cache_key`` (roles are equalities with A, A+len and trampoline
offsets, plus the alignment of data addresses).
"""

from __future__ import annotations

import struct
from itertools import accumulate

from iced_x86 import Code, Decoder, EncodingKind, FlowControl, Instruction, Mnemonic, OpCodeInfo, OpKind

from ..proof.cache_key import IMMEDIATE_OPERANDS, alignment_blind
from ..x86.registers import MASK64
from .native_rows import KEY_WALK

EXACT = 256
_R = 1 << 31
_NEXT = FlowControl.NEXT
_REL_FLOWS = frozenset({FlowControl.UNCONDITIONAL_BRANCH, FlowControl.CONDITIONAL_BRANCH, FlowControl.CALL,
                        FlowControl.XBEGIN_XABORT_XEND})
_NEAR_BRANCH = frozenset({OpKind.NEAR_BRANCH16, OpKind.NEAR_BRANCH32, OpKind.NEAR_BRANCH64})
_NO_REG = 0  # iced Register.NONE
_NEAR, _FAR = b"n", b"f"
_BY_BYTES = frozenset(b"bd")  # the kinds whose key the bytes and the jump back's place determine
BY_BYTES_LIMIT = 250_000  # keys remembered by bytes, per place of the jump back (a kernel has 187 k)
HEADS_LIMIT = 4096  # relative branches' heads remembered (a kernel has a few dozen)


def _operand_immediate_codes() -> frozenset[int]:
    """The iced-x86 codes of ``IMMEDIATE_OPERANDS``: legacy encodings with an immediate,
    the undocumented f6 /1 and f7 /1 test forms left out (as ``cache_key.operand_immediate`` does)."""
    mnemonics = {getattr(Mnemonic, m.upper()) for m in IMMEDIATE_OPERANDS if hasattr(Mnemonic, m.upper())}
    codes = set()
    for name, code in vars(Code).items():
        if not name.isupper() or "_IMM" not in name or name.endswith(("_F6R1", "_F7R1")):
            continue
        info = OpCodeInfo(code)
        if info.encoding == EncodingKind.LEGACY and info.mnemonic in mnemonics:
            codes.add(code)
    return frozenset(codes)


_IMM_CODES = _operand_immediate_codes()


#: ``_where`` is "near" exactly when (d + _NEAR_LOW) mod 2**64 < _NEAR_SPAN and d is not within EXACT of 0.
_NEAR_LOW = _R - EXACT
_NEAR_SPAN = 2 * (_R - EXACT)


def _where(d: int) -> bytes:
    """Where a signed distance from T lies, as finely as plans and cache keys can tell."""
    d &= MASK64
    if d >> 63:
        d -= 1 << 64
    if -EXACT <= d < EXACT:
        return b"x" + struct.pack("<q", d)
    if -_R + EXACT <= d < _R - EXACT:
        return _NEAR
    if d < -_R - EXACT or d >= _R + EXACT:
        return _FAR
    return b"x" + struct.pack("<q", d)


def _eq(target: int, a: int, n: int) -> bytes:
    return b"A" if target == a else b"N" if target == (a + n) & MASK64 else b"-"


class KeyMaker:
    """Instance keys for one trampoline address T."""

    def __init__(self, tramp: int):
        self.tramp = tramp & MASK64
        self._t63 = bytes([self.tramp & 63])
        # Where the jump back lies ("near" or "far") -> bytes -> key, for kinds b and d: their keys depend
        # on the bytes and that place alone (a displacement form recurs: a kernel has 941 k instances
        # of 187 k such strings), so each is made once.
        self._by_bytes: dict[bytes, dict[bytes, bytes]] = {_NEAR: {}, _FAR: {}}
        self._rel_size: dict[tuple[int, int], int] = {}  # (iced code, length) -> its branch offset's size, 0: other
        # A relative branch's bytes before its offset -> the offset's size, for those ``walk`` keys without a
        # call (its target near); read by ``key_walk``, with ``_by_bytes[_NEAR]``.
        self._heads: dict[bytes, int] = {}
        # A key of kind d by its shape (the bytes with the fields ``_key`` zeroed, and their places and sizes), and
        # whether a RIP-relative operand's alignment is blind by its shape (the displacement zeroed): for key_walk.
        self._shapes: dict[bytes, bytes] = {}
        self._rips: dict[bytes, bool] = {}

    def keys(self, data: bytes, start: int) -> list[tuple[int, int, bytes]]:
        """(offset, length, key) of every instruction of a function's bytes, as iced-x86 walks them
        (``walk``)."""
        lengths, keys = self.walk(data, start)
        return list(zip(accumulate(lengths, initial=0), lengths, keys))

    def walk(self, data: bytes, start: int) -> tuple[bytes, list[bytes]]:
        """(the lengths, the keys) of every instruction of a function's bytes, as iced-x86 walks them:
        for each, the key ``key`` gives it (``tests/test_cache.py`` compares them), with the commonest
        cases taken here without a call: a key of kind b or d remembered by its bytes, a new one of
        kind b, and a relative branch whose target is near (the most common key a kernel has).  When every
        jump back of the function is near, ``key_walk`` (C) finds the instructions met before and asks this
        walk's own steps (``_walked``) for the others."""
        t = self.tramp
        near = _where(start - t) == _NEAR and _where(start + len(data) + 16 - t) == _NEAR
        back_all = _NEAR if near else None  # every jump back of the function is near: no need to ask each
        memo = self._by_bytes[_NEAR]
        dec = Decoder(64, data, ip=start & MASK64)
        if back_all is not None and KEY_WALK is not None:
            def at(pos: int) -> tuple[int, bytes]:
                dec.position = pos
                dec.ip = (start + pos) & MASK64
                ins = dec.decode()
                n = ins.len
                return n, self._walked(dec, ins, data[pos:pos + n], start + pos, back_all)

            return KEY_WALK.walk(data, start & MASK64, t, EXACT, memo, self._heads, self._shapes, self._rips, at)
        lengths = bytearray()
        length = lengths.append
        out = []
        append = out.append
        pos = 0
        for ins in dec:  # iterating is about 2.5x faster than decode_out with can_decode per instruction
            n = ins.len
            raw = data[pos:pos + n]
            # with one place for every jump back, a key of kind b or d is the bytes' alone: looked up first
            key = None if back_all is None else memo.get(raw)
            if key is None:
                key = self._walked(dec, ins, raw, start + pos, back_all)
            length(n)
            append(key)
            pos += n
        return bytes(lengths), out

    def _walked(self, dec: Decoder, ins: Instruction, raw: bytes, a: int, back_all: bytes | None) -> bytes:
        """``walk``'s key of the instruction ``ins`` (its bytes ``raw``, at ``a``) when no key remembered by its
        bytes serves: a new one of kind b made here, a relative branch whose target is near made here (its head
        remembered for ``key_walk``), any other from ``_key``; one of kind b or d remembered by its bytes when
        the instruction is valid (``key_walk`` takes the bytes it finds there as a whole instruction)."""
        n = len(raw)
        memo = self._by_bytes[_NEAR]
        fc = ins.flow_control
        if fc == _NEXT:
            if ins.memory_displ_size == 0 and not ins.is_invalid and ins.code not in _IMM_CODES:
                key = b"b" + (back_all or _where(a + n - self.tramp)) + raw
            else:
                key = self._key(dec, ins, raw, a, back_all)
        else:
            t = self.tramp
            size = self._rel_size.get((ins.code, n)) if back_all is not None and fc in _REL_FLOWS \
                and ins.op0_kind in _NEAR_BRANCH else None
            target = ins.near_branch_target if size else 0
            if size and (target - t + _NEAR_LOW) & MASK64 < _NEAR_SPAN and \
                    (target - t + EXACT) & MASK64 >= 2 * EXACT and not ins.is_ip_rel_memory_operand:
                # _key's first case, its target near: the same bytes
                if len(self._heads) < HEADS_LIMIT:
                    self._heads[raw[:n - size]] = size
                return b"jn" + _NEAR + (b"A" if target == a else b"N" if target == (a + n) & MASK64
                                        else b"-") + raw[:n - size] + _ZEROS[size]
            key = self._key(dec, ins, raw, a, back_all)
        if back_all is not None and not ins.is_invalid:
            if key[0] in _BY_BYTES and len(memo) < BY_BYTES_LIMIT:
                memo[raw] = key
            if key[0] in b"dr" and len(self._shapes) + len(self._rips) < BY_BYTES_LIMIT:
                self._remember_shape(dec, ins, raw, key)
        return key

    def _remember_shape(self, dec: Decoder, ins: Instruction, raw: bytes, key: bytes) -> None:
        """For ``key_walk``: a key of kind d whose alignment byte is 0xff (its address has a base or an index, or it
        has none) by its shape; whether a RIP-relative operand's alignment is blind by its shape."""
        co = dec.get_constant_offsets(ins)
        disp = (co.displacement_offset, co.displacement_size) if co.has_displacement else (0, 0)
        if key[0] == 0x64:  # d: the body after b"d", the jump back's place and the alignment byte
            if key[2] != 0xFF:
                return
            imm = ins.code in _IMM_CODES and co.has_immediate and not co.has_immediate2
            self._shapes[key[3:] + bytes([*disp, *((co.immediate_offset, co.immediate_size) if imm else (0, 0))])] = key
        elif ins.is_ip_rel_memory_operand and disp[1] == 4:
            self._rips[_zeroed(raw, *disp) + bytes([*disp, 0, 0])] = alignment_blind(ins)

    def forget(self) -> None:
        """Drop the keys remembered by bytes (the survey is over: the memory serves the proofs better)."""
        for memo in self._by_bytes.values():
            memo.clear()
        self._shapes.clear()
        self._rips.clear()

    def key(self, raw: bytes, address: int) -> bytes:
        """The key of the instruction ``raw`` at ``address`` (remembered by bytes for kinds b and d
        when the jump back is near or far)."""
        back = _where(address + len(raw) - self.tramp)
        memo = self._by_bytes.get(back)
        hit = None if memo is None else memo.get(raw)
        if hit is not None:
            return hit
        dec = Decoder(64, raw, ip=address & MASK64)
        ins = Instruction()
        dec.decode_out(ins)
        key = self._key(dec, ins, raw[:ins.len], address, None)
        if memo is not None and key[0] in _BY_BYTES and len(memo) < BY_BYTES_LIMIT and len(raw) == ins.len \
                and not ins.is_invalid:  # whole, valid instructions only: what ``key_walk`` takes a hit to be
            memo[raw] = key
        return key

    def _key(self, dec: Decoder, ins: Instruction, raw: bytes, a: int, back: bytes | None) -> bytes:
        n = len(raw)
        t = self.tramp
        back = back or _where(a + n - t)
        if ins.is_invalid:
            return b"b" + back + raw
        fc = ins.flow_control
        if fc in _REL_FLOWS and ins.op0_kind in _NEAR_BRANCH and not ins.is_ip_rel_memory_operand:
            size = self._rel_size.get((ins.code, n))
            if size is None:
                co = dec.get_constant_offsets(ins)
                # the offset is the encoding's last field (checked once per form and length)
                size = co.immediate_size if co.has_immediate and co.immediate_offset + co.immediate_size == n else 0
                self._rel_size[(ins.code, n)] = size
            if size:
                target = ins.near_branch_target & MASK64
                return b"j" + back + _where(target - t) + _eq(target, a, n) + raw[:n - size] + _ZEROS[size]
        co = dec.get_constant_offsets(ins)
        if co.has_displacement and ins.is_ip_rel_memory_operand:
            target = ins.ip_rel_memory_address & MASK64
            where = _where(target - t)
            # out of reach, the scratch plan keeps the displacement verbatim (scratch = A+len): part of the key
            body = raw if where == _FAR else _zeroed(raw, co.displacement_offset, co.displacement_size)
            align = 0xFF if alignment_blind(ins) else target & 63  # as ``cache_key.pc_fields`` marks it
            return b"r" + back + where + _eq(target, a, n) + bytes([align]) + self._t63 + body
        if fc in _REL_FLOWS and co.has_immediate and ins.op0_kind in _NEAR_BRANCH:
            target = ins.near_branch_target & MASK64
            return (b"j" + back + _where(target - t) + _eq(target, a, n)
                    + _zeroed(raw, co.immediate_offset, co.immediate_size))
        imm = ins.code in _IMM_CODES and co.has_immediate and not co.has_immediate2
        if fc == _NEXT and (co.has_displacement or imm):
            align = 0xFF
            if co.has_displacement:
                if ins.memory_base == _NO_REG and ins.memory_index == _NO_REG:
                    align = ins.memory_displacement & 63
                raw = _zeroed(raw, co.displacement_offset, co.displacement_size)
            if imm:
                raw = _zeroed(raw, co.immediate_offset, co.immediate_size)
            return b"d" + back + bytes([align]) + raw
        return b"b" + back + raw


_ZEROS = [bytes(k) for k in range(9)]


def _zeroed(raw: bytes, offset: int, size: int) -> bytes:
    return raw[:offset] + bytes(size) + raw[offset + size:]


def per_instance(key: bytes) -> bool:
    """A key whose target is A or A+len: its roles are ambiguous, so no cache key
    exists and each instance is proved on its own."""
    if key[:1] not in (b"r", b"j"):
        return False
    i = 1 + (1 if key[1:2] in (_NEAR, _FAR) else 9)
    i += 1 if key[i:i + 1] in (_NEAR, _FAR) else 9
    return key[i:i + 1] in (b"A", b"N")
