"""Live kernel text: the bytes that run after boot-time patching, and which boot variant each site has.

A kernel's text after boot is not its file's: alternatives, retpolines, return thunks, ftrace, static
calls, jump labels and LOCK prefixes are rewritten (``kernel.variants`` models what each may become).
``LiveText`` holds byte ranges of that live text at the running kernel's addresses, read from
``/proc/kcore`` (``image.running``) or from a captured dump, with the slide between the running
addresses and the image's (KASLR), taken from ``/proc/kallsyms``.  Everything here takes bytes and text
and returns values; files are read by the caller.

A dump is text, one range a line: ``ADDR HEX`` (a kernel address, then the bytes there), as
``rvctl peek`` prints them in the ``confirm`` guest (a ``RVC:live `` prefix is accepted, so a console
log can be given as it is); ``#`` starts a comment.  Kallsyms is ``/proc/kallsyms``' format, ``ADDR TYPE
NAME [MODULE]``, whole or only the lines needed (``_stext`` or ``_text``, and the functions asked about).

``live_variant`` names, per site, the model's variant the live instruction is (the one on disk first),
or says that none is: a finding against the model.  ``RUNTIME_KINDS`` are the site kinds whose bytes
change again after boot, so the bytes live now are one moment of them.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import iced_x86

from ..errors import InputError
from .variants import NoVariants, Variant

#: Names whose kallsyms address gives the slide against the image's .text, in the order tried.
TEXT_START_SYMBOLS = ("_stext", "_text")

_LINE = re.compile(r"(?:RVC:live\s+)?(?:0x)?([0-9a-fA-F]{1,16})\s+([0-9a-fA-F]*)\s*")


class RuntimeKind(NamedTuple):
    kind: str
    reason: str


#: Site kinds whose live bytes change after boot: the bytes read now hold until the next switch, so a
#: verdict for probing them keeps every variant the model allows (the file's judgement), not only the live one.
RUNTIME_KINDS: dict[str, RuntimeKind] = {row.kind: row for row in (
    RuntimeKind("fentry", "ftrace writes a call to its trampoline here whenever a function tracer is enabled, "
                          "and the NOP back when it is disabled"),
    RuntimeKind("static_call", "every static_call_update() rewrites the call (another function, or a NOP for "
                               "NULL)"),
    RuntimeKind("jump_label", "every static_branch_enable/disable() toggles the NOP and the jmp "
                              "(text_poke_bp)"),
    RuntimeKind("smp_lock", "CPU hotplug turns the DS prefix back into LOCK when a second CPU comes up "
                            "(alternatives_smp_switch)"),
)}


@dataclass(frozen=True)
class LiveText:
    """Ranges of live kernel text at running addresses; ``slide``: running address minus image address."""

    ranges: tuple[tuple[int, bytes], ...]  # (running address, bytes), sorted, not overlapping
    slide: int
    source: str  # '/proc/kcore' or the dump's path, for the output

    def read(self, address: int, size: int) -> bytes | None:
        """``size`` bytes at the image address ``address`` as they run, or None when the ranges do not hold
        them all."""
        at = address + self.slide
        i = bisect.bisect_right([a for a, _ in self.ranges], at) - 1
        if i < 0:
            return None
        start, data = self.ranges[i]
        if at + size > start + len(data):
            return None
        return data[at - start:at - start + size]

    def covers(self, address: int, size: int = 1) -> bool:
        return self.read(address, size) is not None


def merge_ranges(pieces: Sequence[tuple[int, bytes]]) -> tuple[tuple[int, bytes], ...]:
    """Adjacent or overlapping pieces joined (a later piece's bytes win where they overlap), sorted."""
    out: list[tuple[int, bytearray]] = []
    for start, data in sorted(pieces, key=lambda p: p[0]):
        if out and start <= out[-1][0] + len(out[-1][1]):
            base, buf = out[-1]
            end = start + len(data)
            if end > base + len(buf):
                buf.extend(bytes(end - base - len(buf)))
            buf[start - base:end - base] = data
        else:
            out.append((start, bytearray(data)))
    return tuple((a, bytes(b)) for a, b in out)


def parse_dump(text: str, where: str) -> tuple[tuple[int, bytes], ...]:
    """A dump's ranges (see the module doc); InputError naming the line otherwise."""
    pieces = []
    for number, line in enumerate(text.splitlines(), 1):
        body = line.split("#", 1)[0].strip()
        if not body:
            continue
        m = _LINE.fullmatch(body)
        if m is None or len(m.group(2)) % 2:
            raise InputError(f"{where}:{number}: not a live-text line: write ADDR HEX (a kernel address, then "
                             f"the bytes there in hex), as `rvctl peek` prints them; got {body[:60]!r}")
        if m.group(2):
            pieces.append((int(m.group(1), 16), bytes.fromhex(m.group(2))))
    if not pieces:
        raise InputError(f"{where}: no live text in it (lines ADDR HEX)")
    return merge_ranges(pieces)


def parse_kallsyms(text: str, where: str) -> dict[str, int]:
    """Name -> address of the core kernel's symbols (a module's, ``[name]``, left out; the first of a name)."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3 or len(parts) > 3 and parts[3].startswith("["):
            continue
        try:
            address = int(parts[0], 16)
        except ValueError:
            raise InputError(f"{where}: not kallsyms: {line[:60]!r} (lines ADDR TYPE NAME)") from None
        found.setdefault(parts[2], address)
    if not found:
        raise InputError(f"{where}: no symbols in it (lines ADDR TYPE NAME, as /proc/kallsyms)")
    if not any(found.values()):
        raise InputError(f"{where}: every address is 0: kptr_restrict hid them from the reader (read "
                         f"/proc/kallsyms as root)")
    return found


def slide(kallsyms: dict[str, int], text_start: int, where: str) -> int:
    """Running minus image address: kallsyms' ``_stext`` (or ``_text``) against the image's .text start."""
    for name in TEXT_START_SYMBOLS:
        if kallsyms.get(name):
            return kallsyms[name] - text_start
    raise InputError(f"{where}: has neither {' nor '.join(TEXT_START_SYMBOLS)}, so the running addresses cannot "
                     f"be matched with the image's (KASLR): give /proc/kallsyms whole, or at least its _stext line")


def live_text(dump: str, dump_where: str, kallsyms: str, kallsyms_where: str, text_start: int) -> LiveText:
    """A captured dump with its kallsyms, against an image whose .text starts at ``text_start``."""
    return LiveText(parse_dump(dump, dump_where), slide(parse_kallsyms(kallsyms, kallsyms_where), text_start,
                                                        kallsyms_where), dump_where)


@dataclass(frozen=True)
class LiveSite:
    """One site at an instruction, as it is live."""

    kind: str
    address: int
    variant: str | None  # the model's variant the live instruction is; None: none of them (or no model)
    differs: bool  # the live bytes at the instruction are not the file's
    note: str  # the model's reason when it names no variants, or the variants it has when none matches
    runtime: str = ""  # RUNTIME_KINDS' reason when the kind switches again after boot

    def describe(self, live: bytes, file: bytes) -> str:
        state = f"differs from the file (live {live.hex(' ')}, file {file.hex(' ')})" if self.differs else \
            "as in the file"
        if self.variant is not None:
            said = f"live variant '{self.variant}', {state}"
        else:
            said = f"no variant of the model is live ({self.note}); {state}"
        return f"{self.kind} at {self.address:#x}: {said}" + (f"; may switch: {self.runtime}" if self.runtime else "")

    def as_json(self) -> dict:
        return {"kind": self.kind, "address": hex(self.address), "variant": self.variant, "differs": self.differs,
                "note": self.note or None, "switches_at_runtime": self.runtime or None}


def live_variant(kind: str, address: int, variants: list[Variant] | NoVariants, live: bytes, file: bytes) -> LiveSite:
    """Which of ``variants`` (``VariantFinder.variants_at`` for the site) the live instruction ``live`` is."""
    runtime = RUNTIME_KINDS[kind].reason if kind in RUNTIME_KINDS else ""
    differs = live != file
    if isinstance(variants, NoVariants):
        return LiveSite(kind, address, None, differs, f"the model names none: {variants.reason}", runtime)
    for v in variants:
        if v.raw == live:
            return LiveSite(kind, address, v.name, differs, "", runtime)
    for v in variants:  # an instruction that starts with the variant's bytes (stac over a one-byte nop)
        if live[:len(v.raw)] == v.raw and v.raw:
            return LiveSite(kind, address, v.name, differs, "", runtime)
    names = ", ".join(v.name for v in variants)
    return LiveSite(kind, address, None, differs, f"a finding against the model, whose variants are: {names}",
                    runtime)


class LiveInstruction(NamedTuple):
    raw: bytes  # the live instruction at the address (iced-x86's length)
    boundary: bool | None  # the address starts an instruction of the live function (None: its start not held)


def live_instruction(live: LiveText, address: int, function_start: int | None) -> LiveInstruction | None:
    """The live instruction at ``address``, and whether a linear walk of the live text from the function's
    start meets it (a kprobe's ``can_probe`` walks so); None when the live text does not hold the address."""
    window = None
    for size in (15, 8, 4, 1):  # the end of a range may hold less than the longest instruction
        window = live.read(address, size)
        if window is not None:
            break
    if window is None:
        return None
    ins = iced_x86.Decoder(64, window, ip=address).decode()
    raw = window[:ins.len] if not ins.is_invalid else window[:1]
    boundary = None
    if function_start is not None and function_start <= address:
        body = live.read(function_start, address - function_start + len(raw))
        if body is not None:
            decoder = iced_x86.Decoder(64, body, ip=function_start)
            boundary = False
            for insn in decoder:
                if insn.ip == address:
                    boundary = True
                    break
                if insn.ip > address or insn.is_invalid:
                    break
    return LiveInstruction(raw, boundary)


class LiveVariants:
    """``VariantFinder``'s answer for the live bytes: at a site patched only at boot, the live instruction
    is what runs; at a site of ``RUNTIME_KINDS`` it is one moment, and every variant the model allows (for
    the file's bytes) can follow it."""

    def __init__(self, finder, file_raw: bytes, live_raw: bytes):
        self.finder, self.file_raw, self.live_raw = finder, file_raw, live_raw

    def variants_at(self, site, address: int, raw: bytes) -> list[Variant] | NoVariants:
        live = Variant("live", self.live_raw)
        if site.kind not in RUNTIME_KINDS:
            return [live]
        found = self.finder.variants_at(site, address, self.file_raw)
        return found if isinstance(found, NoVariants) else [live] + [v for v in found if v.raw != self.live_raw]
