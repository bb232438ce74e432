"""AT&T text with immediates as objdump prints them.

capstone writes an immediate in decimal when it is small or does not fit its signed reading, and a
negative one with a minus sign (``addq $-9, %rax``, ``addq $-0x80, %rax``, ``movq $18446744073709551607,
%rax``, ``retq $8``); objdump always writes unsigned hex,
a negative value as the unsigned number of the operation's width (``add $0xfffffffffffffff7,%rax``,
``add $0xfff7,%ax``, ``ret $0x8``).  Readers compare ``show`` and ``check`` with ``objdump -d``, so
those print what objdump prints.  ``tests/test_att.py`` holds this to objdump itself."""

from __future__ import annotations

import re

_IMMEDIATE = re.compile(r"\$(-?(?:0x[0-9a-f]+|\d+))(?![\dx])")
_WIDTHS = {"q": 64, "l": 32, "w": 16, "b": 8}


def _width(mnemonic: str) -> int:
    """The operation's width from the AT&T size suffix; 64 where there is none (a push, a branch)."""
    if mnemonic.startswith("movabs"):
        return 64
    return _WIDTHS.get(mnemonic[-1:], 64) if mnemonic[-1:] in _WIDTHS and len(mnemonic) > 3 else 64


def objdump_immediates(text: str) -> str:
    """``text`` (capstone's AT&T: mnemonic, then operands) with every decimal immediate in hex, a
    negative one as the unsigned value of the operation's width."""
    mnemonic, _, operands = text.partition(" ")
    if "$" not in operands:
        return text
    bits = _width(mnemonic.split()[-1] if mnemonic else "")

    def hexed(m: re.Match) -> str:
        value = int(m.group(1), 0)
        if value < 0:
            value &= (1 << bits) - 1
        return f"${value:#x}"

    return f"{mnemonic} {_IMMEDIATE.sub(hexed, operands)}"
