"""The decoder-neutral instruction record and the other decode outcomes.

``relocverify.x86.decode.decode(raw, address)`` returns exactly one of:

* ``Instruction``: every decoder agreed (or a disagreement matched a row of
  ``x86.decoders.known_bugs.KNOWN_DECODER_BUGS`` and was resolved by that row's reason);
* ``Disagreement``: the decoders gave different structural facts, and no
  known-bug row explains it.  It carries every answer;
* ``Undecodable``: no decoder could decode the bytes.

All three are frozen values; none of them is an exception.  Offsets are
counted from the first byte of the instruction.  Displacement and immediate
positions are carried explicitly: nothing downstream may assume that the
displacement is the last four bytes (``cmpl $imm, disp(%rip)`` puts the
immediate after it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .registers import MASK64, SEGMENT_PREFIXES


@dataclass(frozen=True)
class DecoderAnswer:
    """What one decoder said about the bytes: enough to cross-check."""

    decoder: str
    length: int | None  # None: this decoder could not decode the bytes
    disp_offset: int = 0
    disp_size: int = 0
    imm_offset: int = 0
    imm_size: int = 0
    text: str = ""

    def as_json(self) -> dict:
        return {
            "length": self.length,
            "disp": [self.disp_offset, self.disp_size],
            "imm": [self.imm_offset, self.imm_size],
            "text": self.text,
        }


@dataclass(frozen=True)
class MemoryOperand:
    """The (first) explicit memory operand, as the hardware computes it."""

    base: str | None  # 'rip' for RIP-relative
    index: str | None
    scale: int
    displacement: int  # signed, as encoded (for RIP-relative: relative to the next instruction)
    segment: str | None  # an explicit fs/gs override, else None
    size: int  # bytes read or written through it; 0 if not known
    address_size: int  # 64, or 32 under a 0x67 prefix


@dataclass(frozen=True)
class Instruction:
    address: int
    raw: bytes
    mnemonic: str  # capstone's AT&T mnemonic, as printed ('lock incl', 'callq')
    op_str: str
    opname: str  # the decoder-neutral operation name (iced Mnemonic, lower case: 'call', 'jle', 'popfq')
    condition: str | None  # condition code of jcc/setcc/cmovcc ('le', 'ne', ...), else None
    far: bool  # a far call/jmp/ret (loads CS)
    prefixes: bytes  # the legacy prefix bytes, in order
    rex: int | None
    vex: bytes  # the VEX/EVEX/XOP prefix bytes; b'' for legacy encodings
    encoding: str  # 'legacy' | 'vex' | 'evex' | 'xop' | '3dnow'
    opcode_offset: int
    opcode: bytes
    modrm_offset: int | None
    sib_offset: int | None
    disp_offset: int
    disp_size: int
    imm_offset: int
    imm_size: int
    imm2_offset: int
    imm2_size: int
    rip_relative: bool
    flow: str  # iced FlowControl name, lower case: 'next', 'uncond_branch', 'cond_branch', 'call', 'return', ...
    branch_target: int | None  # masked to 64 bits
    memory: MemoryOperand | None
    regs_read: tuple[str, ...]  # GPRs as 64-bit family names, others as named by the decoder; implicit included
    regs_written: tuple[str, ...]
    privileged: bool
    answers: tuple[DecoderAnswer, ...] = field(default=(), compare=False)
    notes: tuple[str, ...] = ()  # known decoder bugs that were resolved for this decode

    # -- derived facts -------------------------------------------------
    @property
    def length(self) -> int:
        return len(self.raw)

    @property
    def end(self) -> int:
        return (self.address + len(self.raw)) & MASK64

    @property
    def lock(self) -> bool:
        return 0xF0 in self.prefixes

    @property
    def rep(self) -> bool:
        return 0xF3 in self.prefixes

    @property
    def repne(self) -> bool:
        return 0xF2 in self.prefixes

    @property
    def opsize(self) -> bool:
        return 0x66 in self.prefixes

    @property
    def addrsize(self) -> bool:
        return 0x67 in self.prefixes

    @property
    def segment(self) -> str | None:
        seg = None
        for p in self.prefixes:
            seg = SEGMENT_PREFIXES.get(p, seg)
        return seg

    @property
    def modrm(self) -> int | None:
        return None if self.modrm_offset is None else self.raw[self.modrm_offset]

    @property
    def sib(self) -> int | None:
        return None if self.sib_offset is None else self.raw[self.sib_offset]

    @property
    def displacement(self) -> int:
        """The encoded displacement, sign-extended."""
        if not self.disp_size:
            return 0
        return int.from_bytes(self.raw[self.disp_offset:self.disp_offset + self.disp_size], "little", signed=True)

    @property
    def rip_target(self) -> int | None:
        """The address a RIP-relative operand refers to: end + disp (mod 2^64, or 2^32 under 0x67)."""
        if not self.rip_relative:
            return None
        mask = 0xFFFFFFFF if self.addrsize else 0xFFFFFFFFFFFFFFFF
        return (self.end + self.displacement) & mask

    @property
    def text(self) -> str:
        return f"{self.mnemonic} {self.op_str}".strip()

    def uses(self, reg: str) -> bool:
        return reg in self.regs_read or reg in self.regs_written

    def as_json(self) -> dict:
        return {
            "address": hex(self.address),
            "bytes": self.raw.hex(),
            "length": self.length,
            "mnemonic": self.mnemonic,
            "opname": self.opname,
            "op_str": self.op_str,
            "prefixes": self.prefixes.hex(),
            "rex": None if self.rex is None else hex(self.rex),
            "encoding": self.encoding,
            "opcode": self.opcode.hex(),
            "modrm_offset": self.modrm_offset,
            "sib_offset": self.sib_offset,
            "disp": [self.disp_offset, self.disp_size],
            "imm": [self.imm_offset, self.imm_size],
            "imm2": [self.imm2_offset, self.imm2_size],
            "rip_relative": self.rip_relative,
            "rip_target": None if self.rip_target is None else hex(self.rip_target),
            "flow": self.flow,
            "branch_target": None if self.branch_target is None else hex(self.branch_target),
            "regs_read": list(self.regs_read),
            "regs_written": list(self.regs_written),
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class Undecodable:
    """No decoder could decode these bytes at this address."""

    address: int
    raw: bytes
    reason: str
    answers: tuple[DecoderAnswer, ...] = ()

    @property
    def length(self) -> int:
        return len(self.raw)


@dataclass(frozen=True)
class Disagreement:
    """The decoders disagree on structural facts, and no known decoder bug explains it."""

    address: int
    raw: bytes
    reason: str
    answers: tuple[DecoderAnswer, ...]

    @property
    def length(self) -> int:
        return len(self.raw)


Decoded = Instruction | Undecodable | Disagreement
