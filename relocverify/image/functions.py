"""The functions stage: where each function of an image starts and ends.

``find_functions(image)`` takes its bounds from the best source the image has:

1. ELF symbols with a size in an executable section (an unstripped vmlinux):
   exact.  ``STT_FUNC`` and, for assembly (``SYM_CODE_START``/``SYM_CODE_END``
   gives ``entry_SYSCALL_64`` a size but no type), sized ``STT_NOTYPE``
   symbols; ``STT_OBJECT`` is never code.  Size-0 symbols are skipped; aliases at one address keep one name (the
   largest size, then fewest leading underscores, then shortest, then
   alphabetical).  Overlapping symbols at different addresses are all kept.
2. System.map (or kallsyms) text symbols: a function runs to the next
   symbol's address (or its section's end); trailing int3 padding is then
   trimmed, but only whole 1-byte ``cc`` instructions found by decoding
   linearly from the start, so a real instruction that ends in a ``cc``
   byte (``eb cc``: ``jmp .-50``) is never cut.
3. No symbols at all, or only a stripped ELF's exported ones (``.dynsym``):
   a heuristic linear sweep.  Each executable section is
   one pseudo-function named ``sub_<address>``, split after a ``ret`` or
   ``jmp`` that is followed by two or more 1-byte ``int3`` instructions
   (the padding between functions); the padding is dropped.  Padding made
   of NOPs does not split, and data in text would desynchronise the sweep.

``iter_instruction_spans(image, function)`` yields ``(address, raw bytes)``
for every instruction as iced-x86 decodes it linearly; undecodable bytes
come out as whatever iced consumed, so every byte of the function lies in
exactly one span.
"""

from __future__ import annotations

import bisect
import re
from operator import itemgetter
from typing import Iterator, NamedTuple

from iced_x86 import Decoder, FlowControl, Instruction

from .image import Image, Section

INT3 = 0xCC

#: Flow control of an instruction after which padding may begin.
_ENDS_BLOCK = frozenset({FlowControl.RETURN, FlowControl.UNCONDITIONAL_BRANCH,
                         FlowControl.INDIRECT_BRANCH})

_INT3_RUN = re.compile(rb"\xcc{2,}")


class Function(NamedTuple):
    """A function's bounds: [start, end) inside one executable section.  A ``NamedTuple`` (a value like the
    frozen dataclasses around it) because a kernel has 46 thousand, made by every run."""

    name: str
    start: int
    end: int
    section: str

    @property
    def size(self) -> int:
        return self.end - self.start


_START_NAME = itemgetter(1, 0)  # a function's (start, name)


def find_functions(image: Image) -> list[Function]:
    """Every function of ``image``, sorted by (start, name); see the module doc."""
    sections = [s for s in image.iter_executable_sections()]
    if image.symbol_source == "dynsym":
        # a stripped executable or library: its exported functions leave most of its code out, so
        # the code is swept whole (the exported symbols would only split it)
        functions = [f for s in sections for f in _sweep_section(s)]
    elif any(s.size for s in image.symbols if s.kind == "func"):
        functions = _from_sized_symbols(image, sections)
    elif image.has_symbols():
        functions = _from_map_symbols(image, sections)
    else:
        functions = [f for s in sections for f in _sweep_section(s)]
    functions.sort(key=_START_NAME)
    return functions


def iter_instruction_spans(image: Image, function: Function) -> Iterator[tuple[int, bytes]]:
    """``(address, raw bytes)`` of each instruction of ``function``, in order.

    Nothing is yielded for a function that no executable section holds.
    """
    data = function_bytes(image, function)
    decoder = Decoder(64, data, ip=function.start)
    instruction = Instruction()
    position = 0
    while decoder.can_decode:
        decoder.decode_out(instruction)
        length = instruction.len
        yield function.start + position, data[position:position + length]
        position += length


def count_instructions(image: Image, function: Function) -> int:
    """How many spans ``iter_instruction_spans`` yields, without slicing bytes."""
    decoder = Decoder(64, function_bytes(image, function), ip=function.start)
    instruction = Instruction()
    count = 0
    while decoder.can_decode:
        decoder.decode_out(instruction)
        count += 1
    return count


def function_bytes(image: Image, function: Function) -> bytes:
    """The bytes of ``function`` as its executable section holds them; ``b""`` when no executable
    section with data holds the whole function (what every sweep of a function reads)."""
    section = image.get_section(function.section)
    if section is None or not section.contains(function.start, function.size):
        section = image.section_at(function.start)
    if section is None or not section.executable or not section.data \
            or not section.contains(function.start, function.size):
        return b""
    offset = function.start - section.address
    return section.data[offset:offset + function.size]


# --- ELF symbols with sizes -------------------------------------------------

def _alias_key(name: str) -> tuple:
    return (len(name) - len(name.lstrip("_")), len(name), name)


def _from_sized_symbols(image: Image, sections: list[Section]) -> list[Function]:
    locate = _SectionLocator(sections)
    best: dict[int, tuple] = {}
    for symbol in image.symbols:
        if symbol.kind == "object" or not symbol.size:
            continue
        section = locate(symbol.address)
        if section is None:
            continue
        end = min(symbol.address + symbol.size, section.end)
        key = (-(end - symbol.address), _alias_key(symbol.name))
        current = best.get(symbol.address)
        if current is None or key < current[0]:
            best[symbol.address] = (key, Function(symbol.name, symbol.address, end, section.name))
    return [entry[1] for entry in best.values()]


# --- System.map symbols --------------------------------------------------------

def _from_map_symbols(image: Image, sections: list[Section]) -> list[Function]:
    locate = _SectionLocator(sections)
    names: dict[int, str] = {}
    for symbol in image.symbols:
        if symbol.kind != "func":
            continue
        current = names.get(symbol.address)
        if current is None or _alias_key(symbol.name) < _alias_key(current):
            names[symbol.address] = symbol.name
    by_section: dict[str, list[int]] = {}
    for address in names:
        section = locate(address)
        if section is not None:
            by_section.setdefault(section.name, []).append(address)
    functions = []
    for section in sections:
        starts = sorted(by_section.get(section.name, ()))
        for i, start in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else section.end
            end = trim_int3_padding(section, start, end)
            if end > start:
                functions.append(Function(names[start], start, end, section.name))
    return functions


def trim_int3_padding(section: Section, start: int, end: int) -> int:
    """``end`` moved back over a trailing run of 1-byte int3 instructions.

    Decodes linearly from ``start`` so that only whole ``cc`` instructions
    are dropped; a longer instruction whose last byte is ``cc`` stays.
    """
    data = section.data
    offset, stop = start - section.address, end - section.address
    if stop <= offset or data[stop - 1] != INT3:
        return end
    decoder = Decoder(64, data[offset:stop], ip=start)
    instruction = Instruction()
    run_start = None
    position = 0
    while decoder.can_decode:
        decoder.decode_out(instruction)
        length = instruction.len
        if length == 1 and data[offset + position] == INT3:
            if run_start is None:
                run_start = position
        else:
            run_start = None
        position += length
    return end if run_start is None else start + run_start


# --- no symbols: the linear sweep ------------------------------------------------

def _sweep_section(section: Section) -> list[Function]:
    """Pseudo-functions of one section, split at int3 padding after ret/jmp."""
    data = section.data
    candidates = [m.span() for m in _INT3_RUN.finditer(data)]
    if not candidates:
        return [_pseudo(section, 0, len(data))]
    cuts = _padding_runs(section, candidates)
    functions = []
    begin = 0
    for run_start, run_end in cuts:
        if run_start > begin:
            functions.append(_pseudo(section, begin, run_start))
        begin = run_end
    if begin < len(data):
        functions.append(_pseudo(section, begin, len(data)))
    return functions


def _padding_runs(section: Section, candidates: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``cc`` runs that start on an instruction boundary right
    after a ret/jmp and are >= 2 bytes long.  From a boundary on, every ``cc``
    byte decodes as a 1-byte int3, so such a part is all int3 instructions."""
    data = section.data
    starts = [start for start, _ in candidates]
    decoder = Decoder(64, data, ip=section.address)
    instruction = Instruction()
    cuts = []
    previous = None  # offset of the instruction before ``position``
    position = 0
    next_start = starts[0]
    while decoder.can_decode:
        if position >= next_start:
            j = bisect.bisect_right(starts, position) - 1
            end = candidates[j][1]
            if end - position >= 2 and previous is not None and _ends_block(data, previous):
                cuts.append((position, end))
            next_start = starts[j + 1] if j + 1 < len(starts) else len(data) + 1
        decoder.decode_out(instruction)
        previous = position
        position += instruction.len
    return cuts


def _ends_block(data: bytes, offset: int) -> bool:
    decoder = Decoder(64, data[offset:offset + 15])
    return decoder.decode().flow_control in _ENDS_BLOCK


def _pseudo(section: Section, begin: int, end: int) -> Function:
    address = section.address + begin
    return Function(f"sub_{address:x}", address, section.address + end, section.name)


class _SectionLocator:
    """Which of a few sections holds an address (bisect on starts)."""

    def __init__(self, sections: list[Section]) -> None:
        self.sections = sorted(sections, key=lambda s: s.address)
        self.starts = [s.address for s in self.sections]

    def __call__(self, address: int) -> Section | None:
        i = bisect.bisect_right(self.starts, address) - 1
        if i >= 0 and address < self.sections[i].end:
            return self.sections[i]
        return None
