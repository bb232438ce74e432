"""optprobes (jump-optimized kprobes) on x86-64, as written in arch/x86/kernel/kprobes/opt.c.

A kprobe without a post handler is optimized when it can be: the ``int3`` at A becomes a
``jmp rel32`` to a slot that saves the registers, calls the handler, restores them, runs a copy
of the instructions the jump overwrote and jumps back.  One model for both versions
(``OptprobesSource`` holds what differs); ``MODEL_6_1`` and ``MODEL_6_12`` are instances.

What the model does with a probe at A in a function (``Optprobes.answer_in``), in the order
the kernel decides:

1. the probe must first be a kprobe: the kprobes model of the same version must not refuse
   (``register_kprobe`` -> ``prepare_kprobe``), and optimizing only ever replaces its ``int3``;
2. ``can_optimize``: refused in the entry text (a kprobes blacklist already), with fewer than 5
   bytes to the symbol's end, and when ``insn_decode_kernel``'s walk over the whole symbol
   meets, in walk order, an ``__ex_table`` entry, a decode failure, an indirect jump (6.1:
   ``ff /4``, ``ff /5``, ``ea``, and a direct jump into ``__indirect_thunk_start..end``; 6.12
   skips the check on kernels built with retpolines or IBT, as Debian's are), or a direct
   jump (``insn_jump_into_range``: loop/jcxz, jmp, jcc) whose target is in [A+1, A+5];
3. ``copy_optimized_instructions``: from A, every instruction through the fifth byte is
   copied by ``__copy_instruction`` at its place in the slot (its refusals and its
   displacement fixup are kprobes' own, ``Kprobes.copied``) and must pass ``can_boost``
   (exception table, the opcode tables); then ``ftrace_text_reserved``,
   ``jump_label_text_reserved`` and ``static_call_text_reserved`` over the copied range;
4. ``arch_prepare_optimized_kprobe``: the slot must be within rel32 reach of A (-ERANGE);
   what runs after the template is the copies back to back and ``synthesize_reljump`` to
   A+len, a ``RelocateBlock`` whose obligation is ``proof.block.prove_block``'s.

The template (``optprobe_template_entry`` .. ``_end``) pushes a ``pt_regs`` frame below the
stack pointer, calls ``optimized_callback`` and pops every register and the flags again: it
is the handler, as the int3 handler is for kprobes, and is not in the obligation (kernel code
has no red zone, so a write below rsp is not observable to the probed code).

What the checks do not see is reported with the answer (``RelocateBlock.entries``): a transfer
into (A, A+5) from code outside the symbol (``foo.cold`` jumping back into ``foo``, another
function's tail jump, an exception fixup or static key in another function), which after
``arch_optimize_kprobes`` lands inside the jump's displacement.  Those are found in
``kernel.patch_range.PatchRanges``' image-wide branch targets.

Which bytes: the kernel walks its live text.  ``optprobes@6.1`` judges the return thunk sites as the
file has them, ``jmp __x86_return_thunk``, which 6.1.187's ``insn_is_indirect_jump`` counts as a
jump into ``__indirect_thunk_start..end``, so every function with one is refused; that is the live
text only where ``X86_FEATURE_RETHUNK`` is set.  ``optprobes@6.1+ret`` judges them as
``apply_returns`` leaves them on a CPU that needs no return thunk (``ret; int3 x4``,
``live_bytes``), as the confirm guest (QEMU's ``max`` CPU) runs them.  Other boot patches (retpolines,
alternatives) are judged as the file has them.

Not modelled: ``alternatives_text_reserved`` (SMP lock prefixes, kept only on a uniprocessor
boot), KGDB breakpoints, and the run-time conditions of ``optimize_kprobe`` (a post handler,
the sysctl, a kprobe on ftrace): they decide whether a given kprobe is optimized, not what an
optimized one executes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from ..kernel.variants import return_site_bytes
from ..plan.block import BlockPlan
from ..plan.plan import Plan, PlanKind
from ..x86.decode import decode
from ..x86.instruction import Instruction
from ..x86.registers import MASK64, fits_s32
from . import linux_facts as lf
from .kprobes import Kprobes
from .kprobes_6_1 import MODEL as KPROBES_6_1
from .kprobes_6_12 import MODEL as KPROBES_6_12
from .model import NO_CONTEXT, Answer, Cite, Context, Entry, Refuse, RelocateBlock, Unmodelled

OPT = "arch/x86/kernel/kprobes/opt.c"
#: What a model takes a return thunk site (``.return_sites``, ``jmp __x86_return_thunk``) to hold
#: after boot, by whether X86_FEATURE_RETHUNK is set (``kernel.variants.return_site_bytes``).
RETURN_SITES = {
    True: "return thunk sites as on disk (jmp __x86_return_thunk: the live bytes where X86_FEATURE_RETHUNK "
          "is set, a return-thunk mitigation chosen for the CPU and command line)",
    False: "return thunk sites as apply_returns leaves them without X86_FEATURE_RETHUNK (ret; int3 x4: "
           "arch/x86/kernel/alternative.c patch_return), as on a CPU that needs no return thunk",
}
JMP32_INSN_SIZE = 5
#: insn_jump_into_range's opcodes: loopne/loope/loop/jcxz, near and short jmp (and jcc below).
_JUMP_OPCODES = frozenset({0xE0, 0xE1, 0xE2, 0xE3, 0xE9, 0xEB})
#: the site kinds copy_optimized_instructions refuses a copied range over (-EBUSY).
RESERVED = (("fentry", "ftrace_text_reserved"), ("jump_label", "jump_label_text_reserved"),
            ("static_call", "static_call_text_reserved"))


@dataclass(frozen=True)
class OptprobesSource:
    """What differs between optprobes versions, each with where it comes from."""

    version: str
    kprobes: Kprobes  # the kprobe an optprobe starts as (and its __copy_instruction, can_boost)
    indirect_check: bool  # can_optimize refuses a function with an indirect jump
    indirect_cite: str
    thunk_check: bool  # ... and a direct jump into __indirect_thunk_start..end counts as one
    thunk_cite: str


@dataclass(frozen=True)
class FunctionWalk:
    """``can_optimize``'s walk over one symbol, reduced to what its decisions read.

    ``decoded``: walk offset -> the kernel decoder's facts (the walk's order is by offset).
    ``first_bad``: the first walk offset at which the whole function is refused, and why.
    ``jumps``: target address -> the first walk offset of a direct jump (as
    ``insn_jump_into_range`` reads them) aiming there."""

    start: int
    size: int
    decoded: dict
    first_bad: tuple[int, str] | None
    jumps: dict
    ours: dict = field(default_factory=dict)  # offset -> our decode there, filled as probes ask

    def ours_at(self, data: bytes, pos: int):
        """Our (cross-checked) decode of the instruction at ``pos``, once per function."""
        d = self.ours.get(pos)
        if d is None:
            d = self.ours[pos] = decode(data[pos:pos + lf.MAX_INSN], (self.start + pos) & MASK64)
        return d


class Optprobes:
    """The optprobes model for one ``OptprobesSource``; see the module doc."""

    needs_boundary = True  # it is a kprobe first: can_probe's walk
    per_function = True  # answers need the function around A (``answer_in``)

    def __init__(self, src: OptprobesSource, rethunk: bool = True):
        self.src = src
        self.kprobes = src.kprobes
        self.rethunk = rethunk
        self.name = f"optprobes@{src.version}" + ("" if rethunk else "+ret")
        self.decoder = self.kprobes.decoder
        self.spec = self.kprobes.src.decoder
        self.source = (f"linux-source-{src.version} {OPT} (can_optimize, copy_optimized_instructions, "
                       f"arch_prepare_optimized_kprobe), with kprobes@{src.version}; " + RETURN_SITES[rethunk])

    def live_bytes(self, data: bytes, kinds_at: dict) -> bytes:
        """The symbol's bytes as ``can_optimize`` and ``copy_optimized_instructions`` read them, in the
        kernel text after boot, as far as this model's boot variant says (``RETURN_SITES``):
        ``kinds_at``, offset -> the kernel site kinds there."""
        if self.rethunk:
            return data
        out = bytearray(data)
        for off, kinds in kinds_at.items():
            if "return_thunk" in kinds and data[off:off + 1] == b"\xe9":
                out[off:off + JMP32_INSN_SIZE] = return_site_bytes(data[off:off + JMP32_INSN_SIZE], False)
        return bytes(out)

    def site_refusal(self, context: Context) -> Refuse | None:
        site = self.kprobes.site_refusal(context)
        return None if site is None else _not_a_kprobe(site)

    def answer(self, insn: Instruction, tramp: int, context: Context = NO_CONTEXT) -> Answer:
        """One instruction alone: optprobes decide per function, so only the kprobe's refusals apply."""
        first = self.kprobes.answer(insn, tramp, context)
        if isinstance(first, Refuse):
            return _not_a_kprobe(first)
        return Unmodelled("optprobes decide over the whole function (can_optimize): audit an image",
                          Cite(OPT, "can_optimize"))

    # -- the function ----------------------------------------------------------------------
    def function_walk(self, data: bytes, start: int, offsets: list[int], extable: frozenset[int],
                      thunks: tuple[int, int] | None) -> FunctionWalk:
        """``can_optimize``'s walk over ``data`` (the symbol's bytes at ``start``); ``extable``:
        the offsets with an ``__ex_table`` entry; ``thunks``: ``__indirect_thunk_start..end``."""
        decoded, jumps, bad = {}, {}, None
        for pos, d in lf.walk(self.spec, data, offsets):
            decoded[pos] = d
            if bad is not None:
                continue
            if pos in extable:
                bad = (pos, "search_exception_tables: an __ex_table entry (its fixup may jump back into "
                            "the function)")
                continue
            if not d.ok or not d.length:
                bad = (pos, f"insn_decode_kernel fails ({d.ret})")
                continue
            target = jump_target(d, start + pos)
            if self.src.indirect_check:
                why = indirect_jump(d)
                if why is None and self.src.thunk_check and target is not None and thunks is not None \
                        and thunks[0] <= target <= thunks[1]:
                    why = "a jump into __indirect_thunk_start..end (a retpoline: an indirect jump)"
                if why is not None:
                    bad = (pos, f"insn_is_indirect_jump: {why}")
                    continue
            if target is not None:
                jumps.setdefault(target, pos)
        return FunctionWalk(start, len(data), decoded, bad, jumps)

    # -- one probe ---------------------------------------------------------------------------
    def answer_in(self, walk: FunctionWalk, data: bytes, off: int, tramp: int, context: Context,
                  extable: frozenset[int], sites_at, entries=None) -> Answer:
        """The answer for a probe at ``walk.start + off`` (``data`` the symbol's bytes).

        ``sites_at(offset)`` gives the kernel site kinds at an offset; ``entries(address, length)``
        the image's transfers strictly inside a range (``PatchRanges.entries_inside`` as
        ``Entry`` values), or None when not known."""
        a = (walk.start + off) & MASK64
        insn = walk.ours_at(data, off)
        if not isinstance(insn, Instruction):
            return Unmodelled(f"our decoders do not agree on the probed instruction ({insn.reason})",
                              Cite(OPT, "can_optimize"))
        first = self.kprobes.answer(insn, tramp, Context(context.boundary, context.sites, context.function,
                                                         data[off:off + lf.MAX_INSN]))
        if isinstance(first, Refuse):
            return _not_a_kprobe(first)
        if walk.size - off < JMP32_INSN_SIZE:
            return _refuse("can_optimize: fewer than 5 bytes to the symbol's end (size - offset < JMP32_INSN_SIZE)",
                           "can_optimize")
        bad = walk.first_bad
        into = min((walk.jumps[t] for t in range(a + 1, a + JMP32_INSN_SIZE + 1) if t in walk.jumps), default=None)
        if into is not None and (bad is None or into < bad[0]):
            return _refuse(f"can_optimize: the jump at +{into:#x} aims into [A+1, A+5] "
                           f"(insn_jump_into_range)", "can_optimize")
        if bad is not None:
            return _refuse(f"can_optimize: +{bad[0]:#x}: {bad[1]}", "can_optimize")
        copies, positions, length = [], [], 0
        while length < JMP32_INSN_SIZE:
            pos = off + length
            d = walk.decoded.get(pos)
            if d is None:
                return Unmodelled("the copied run reaches past the symbol's bytes", Cite(OPT, "copy_optimized_instructions"))
            stream = data[pos:pos + lf.MAX_INSN]
            raw = self.kprobes.copied(d, stream, (a + length) & MASK64, (tramp + length) & MASK64)
            if isinstance(raw, Refuse):
                return _refuse(f"copy_optimized_instructions: +{pos:#x}: __copy_instruction: {raw.reason}",
                               "copy_optimized_instructions")
            if pos in extable:
                return _refuse(f"copy_optimized_instructions: +{pos:#x}: can_boost: an __ex_table entry",
                               "copy_optimized_instructions")
            if not self.kprobes.can_boost(d, stream):
                return _refuse(f"copy_optimized_instructions: can_boost refuses {_opcode(d)}",
                               "copy_optimized_instructions")
            copies.append(raw)
            positions.append(pos)
            length += d.length
        for pos in positions:
            kinds = sites_at(pos)
            for kind, check in RESERVED:
                if kind in kinds:
                    return _refuse(f"-EBUSY: copy_optimized_instructions: {check} (a {kind} site in the "
                                   f"copied range)", "copy_optimized_instructions")
        if not fits_s32(tramp - a - JMP32_INSN_SIZE):
            return _refuse("-ERANGE: the slot is not in rel32 reach of A", "arch_prepare_optimized_kprobe")
        insns = []
        for pos in positions:
            ours = walk.ours_at(data, pos)
            if not isinstance(ours, Instruction) or ours.length != walk.decoded[pos].length:
                return Unmodelled(f"our decoders and insn_decode_kernel do not agree on +{pos:#x}",
                                  Cite(OPT, "copy_optimized_instructions"))
            insns.append(ours)
        block = self.block(insns, copies, tramp)
        found = () if entries is None else tuple(entries(a, JMP32_INSN_SIZE))
        return RelocateBlock(block, block.trampoline, "the template restores every register and the flags, then the "
                             "copies run and synthesize_reljump returns to A+len",
                             Cite(OPT, "arch_prepare_optimized_kprobe",
                                  "copy_optimized_instructions, synthesize_reljump"), found)

    @staticmethod
    def block(insns: list[Instruction], copies: list[bytes], tramp: int) -> BlockPlan:
        """The copies back to back from T, then ``jmp rel32`` to A+len (``synthesize_reljump``)."""
        starts, at = [], tramp
        for c in copies:
            starts.append(at & MASK64)
            at += len(c)
        a, length = insns[0].address, sum(i.length for i in insns)
        back = b"\xe9" + struct.pack("<i", (a + length - (at + JMP32_INSN_SIZE) + (1 << 63)) % (1 << 64) - (1 << 63))
        trampoline = b"".join(copies) + back
        plans = tuple(Plan(PlanKind.COPY if c == i.raw else PlanKind.REWRITE, "tracer", "", i.address, i.length, t,
                           c + (back if k == len(copies) - 1 else b""))
                      for k, (i, c, t) in enumerate(zip(insns, copies, starts)))
        return BlockPlan(a, length, tramp, tuple(insns), plans, tuple(starts), trampoline,
                         ((tramp, len(trampoline)),), "optprobes")


def entries_of(ranges):
    """``RelocateBlock.entries`` from a ``PatchRanges``: the transfers into a range, as ``Entry`` values."""

    def entries(address: int, length: int) -> list[Entry]:
        out = []
        for target, source, how in ranges.entries_inside(address, length):
            fn = ranges.function_at(source)
            out.append(Entry(target, source, how, fn.name if fn is not None else "?"))
        return out

    return entries


def _not_a_kprobe(refusal: Refuse) -> Refuse:
    return Refuse(f"not a kprobe: {refusal.reason}", refusal.cite)


def _refuse(reason: str, function: str) -> Refuse:
    return Refuse(f"not optimized (stays an int3 kprobe): {reason}", Cite(OPT, function))


def _opcode(d) -> str:
    reg = f" /{(d.modrm >> 3) & 7}" if d.modrm is not None and d.opcode[:1] in (b"\xc0", b"\xc1", b"\xd0", b"\xd1",
                                                                               b"\xd2", b"\xd3", b"\xf6", b"\xf7",
                                                                               b"\xfe", b"\xff") else ""
    return f"opcode {d.opcode.hex()}{reg}"


def jump_target(d, address: int) -> int | None:
    """``insn_jump_into_range``'s target: next_byte + immediate for its opcodes, else None."""
    if not d.ok or not d.opcode:
        return None
    op0 = d.opcode[0]
    if op0 in _JUMP_OPCODES or (op0 & 0xF0) == 0x70 or (op0 == 0x0F and len(d.opcode) > 1 and d.opcode[1] & 0xF0 == 0x80):
        return (address + d.length + d.imm_value) & MASK64
    return None


def indirect_jump(d) -> str | None:
    """``__insn_is_indirect_jump``: ``ff`` with ModRM reg 4 or 5, or ``ea``."""
    if not d.ok or not d.opcode:
        return None
    if d.opcode[0] == 0xFF and d.modrm is not None and ((d.modrm >> 3) & 6) == 4:
        return "jmp through a register or memory (ff /4, /5)"
    if d.opcode[0] == 0xEA:
        return "a segment-based jump (ea)"
    return None


SOURCE_6_1 = OptprobesSource(
    "6.1", KPROBES_6_1, indirect_check=True,
    indirect_cite=f"{OPT} can_optimize: if (insn_is_indirect_jump(&insn) || insn_jump_into_range(...)) return 0",
    thunk_check=True,
    thunk_cite=f"{OPT} insn_is_indirect_jump: #ifdef CONFIG_RETPOLINE, a jump into __indirect_thunk_start..end",
)
SOURCE_6_12 = OptprobesSource(
    "6.12", KPROBES_6_12, indirect_check=False,
    indirect_cite=f"{OPT} can_optimize: if (!IS_ENABLED(CONFIG_MITIGATION_RETPOLINE) && "
                  f"!IS_ENABLED(CONFIG_X86_KERNEL_IBT) && insn_is_indirect_jump(&insn)) return 0; Debian's "
                  f"6.12 config has both",
    thunk_check=False, thunk_cite=f"{OPT}: the thunk range check was removed with the check above",
)
MODEL_6_1 = Optprobes(SOURCE_6_1)
MODEL_6_1_RET = Optprobes(SOURCE_6_1, rethunk=False)
MODEL_6_12 = Optprobes(SOURCE_6_12)
