"""Text taken from an input (symbol and module names, section names, decoder output), made safe
for where it is written: a terminal, XML, HTML.

A hostile or broken ELF can name a symbol with an escape sequence that repaints a terminal, a NUL
that XML 1.0 cannot hold at all, or a C1 control a browser shows as nothing.  ``printable`` spells
every such character as ``\\xNN`` (or ``\\uNNNN``) and keeps every other character as it is; JSON
needs nothing more than ``ensure_ascii`` (its default in the standard library).
"""

from __future__ import annotations

import html


def printable(text: str) -> str:
    """``text`` with every non-printable character (C0, DEL, C1, separators, unassigned) as an escape; a byte
    of a file name that is no UTF-8 (carried as a surrogate, PEP 383) as the byte it was, ``\\xNN``."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 0x100 else
                   f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else f"\\u{ord(c):04x}"
                   for c in text)


def one_line(value: object) -> str:
    """``str(value)`` on one line, whitespace runs folded to a space: an exception's message as a reason."""
    return " ".join(str(value).split())


def printable_lines(text: str) -> str:
    """As ``printable``, keeping line breaks (for multi-line messages)."""
    return "\n".join(printable(line) for line in text.split("\n"))


def html_text(text: object, quote: bool = True) -> str:
    """``text`` for HTML and XML: ``printable`` first (a C0 or C1 control, which XML 1.0 cannot hold and a
    browser shows as nothing, is spelled ``\\xNN``), then ``html.escape``.  The one HTML encoder of the
    report."""
    return html.escape(printable(str(text)), quote)
