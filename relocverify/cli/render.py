"""Text rendering shared by the commands: disassembly of trampolines, and names made safe for a terminal."""

from __future__ import annotations

import shutil
import textwrap

import capstone

from ..text import printable
from ..x86.encoding import iter_code

_CS = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_CS.syntax = capstone.CS_OPT_SYNTAX_ATT


def disasm(code: bytes, at: int) -> list[str]:
    """Trampoline code as text lines, through the one trampoline walker (the qword of an absolute jump as data)."""
    out = []
    for piece in iter_code(code, at):
        addr = at + piece.offset
        chunk = code[piece.offset:piece.offset + piece.length]
        if piece.kind == "qword":
            out.append(f"  {addr:#018x}  .quad {int.from_bytes(chunk, 'little'):#x}")
            continue
        ins = next(_CS.disasm(chunk, addr, 1), None) if piece.kind == "insn" else None
        if ins is None:
            out.append(f"  {addr:#018x}  .byte {', '.join(f'{b:#04x}' for b in chunk)}")
        else:
            out.append(f"  {addr:#018x}  {chunk.hex():<24} {ins.mnemonic} {ins.op_str}")
    return out


def escape(text: str) -> str:
    """A name taken from the input, safe to print: control characters (escape
    sequences, newlines, carriage returns, ...) shown as \\xNN."""
    return printable(text)


def verdict_counts(by_verdict) -> str:
    """Counts by verdict (or by anything) as one line's part: ``proved 12, rejected 1``."""
    return ", ".join(f"{k} {v:,}" for k, v in by_verdict.items())


def wrap(text: str, indent: str = "    ") -> str:
    """``text`` wrapped at word boundaries to the terminal's width (80 when not a terminal), the continuation
    lines indented: a reason is never cut, only folded."""
    width = max(shutil.get_terminal_size((100, 24)).columns, 40)
    if len(text) <= width:
        return text
    return textwrap.fill(text, width=width, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False)
