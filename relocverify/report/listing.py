"""Text for the instruction view: a function's disassembly, and each instruction's plan recomputed
from its stored bytes and the run's trampoline address (``plan.make_plan`` on ``x86.decode``)."""

from __future__ import annotations

import capstone

from ..plan.plan import PlanKind, make_plan
from ..x86.decode import decode
from ..x86.encoding import iter_code

_CS = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_CS.syntax = capstone.CS_OPT_SYNTAX_ATT


def _text(mnemonic: str, op_str: str) -> str:
    return f"{mnemonic} {op_str}" if op_str else mnemonic


def disassemble(code: bytes, at: int, spans: list[tuple[int, int]]) -> list[str]:
    """AT&T text of each (offset, length) span of ``code`` placed at ``at``: one capstone pass over the
    function, then one instruction at a time where a stored boundary is not one of the pass's."""
    seen = {off - at: _text(m, o) for off, _, m, o in _CS.disasm_lite(code, at)}
    out = []
    for off, length in spans:
        text = seen.get(off)
        if text is None:
            one = next(_CS.disasm_lite(code[off:off + length], at + off, 1), None)
            text = "(bad)" if one is None or one[1] != length else _text(one[2], one[3])
        out.append(text)
    return out


def trampoline_lines(code: bytes, at: int) -> list[str]:
    """The trampoline as listing lines, through the one trampoline walker (an absolute jump's qword as data)."""
    out = []
    for piece in iter_code(code, at):
        addr = at + piece.offset
        chunk = code[piece.offset:piece.offset + piece.length]
        if piece.kind == "qword":
            out.append(f"{addr:#018x}  .quad {int.from_bytes(chunk, 'little'):#x}")
            continue
        ins = next(_CS.disasm_lite(chunk, addr, 1), None) if piece.kind == "insn" else None
        if ins is None:
            out.append(f"{addr:#018x}  .byte {', '.join(f'{b:#04x}' for b in chunk)}")
        else:
            out.append(f"{addr:#018x}  {chunk.hex():<24} {_text(ins[2], ins[3])}")
    return out


def plan_text(raw: bytes, address: int, tramp: int) -> tuple[str, str]:
    """The plan for ``raw`` at ``address`` relocated to ``tramp``: its kind, rule and reason (a line shared
    by many instructions), then the trampoline disassembled (copy, rewrite) or the emulation effects (emulate)."""
    plan = make_plan(decode(raw, address), tramp)
    head = f"{plan.kind.value} ({plan.rule}): {plan.reason}"
    lines = []
    if plan.kind in (PlanKind.COPY, PlanKind.REWRITE):
        lines.append(f"trampoline at {plan.tramp:#x}:")
        lines += ["  " + t for t in trampoline_lines(plan.trampoline, plan.tramp)]
    elif plan.kind is PlanKind.EMULATE:
        lines.append("emulation effects:")
        lines += ["  " + e.describe() for e in plan.effects]
    if plan.tracer_memory:
        lines.append("tracer memory: " + ", ".join(f"{a:#x}+{n}" for a, n in plan.tracer_memory))
    return head, "\n".join(lines)
