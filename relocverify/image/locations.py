"""Addresses as kernel and tracing engineers write them, resolved against an image's functions.

``parse_location(text)`` accepts:

  0xffffffff81234560        an absolute address
  tcp_v4_rcv                a function's first instruction
  tcp_v4_rcv+0x19           an offset into it, hex (perf, kallsyms) ...
  tcp_v4_rcv+25             ... or decimal (bpftrace's kprobe:func+25)
  kprobe:tcp_v4_rcv+25      bpftrace's probe syntax (also kretprobe:, kinst::func:28 is DTrace's)
  show_cpuinfo@0xffffffff81045a10(+off)   one of several functions of one name (static functions)

``FunctionIndex(functions).resolve(spec, boundaries)`` turns it into a
``Location`` (address, function, offset): an unknown name, a name several
functions share (unless ``@ADDR`` picks one), an offset past the function's
end, and an offset that is not an instruction boundary (``boundaries``
gives them) are one-line ``InputError``s that say what would be right (the
candidates with their addresses; the two nearest boundaries).
"""

from __future__ import annotations

import bisect
import difflib
import re
from dataclasses import dataclass
from typing import Callable, Iterable

from ..errors import InputError
from ..x86.registers import MASK64
from .functions import Function

_SPEC = re.compile(r"^(?:(?:kprobe|kretprobe|fentry|kfunc):)?(?P<name>[A-Za-z_.$][\w.$]*)"
                   r"(?:@(?P<at>0x[0-9a-fA-F]+))?(?:\+(?P<off>0x[0-9a-fA-F]+|\d+))?$")
_DTRACE = re.compile(r"^(?:kinst|fbt)?::(?P<name>[A-Za-z_.$][\w.$]*):(?P<off>\d+|entry)$")


@dataclass(frozen=True)
class LocationSpec:
    """What the user wrote: an absolute address, or a function (by name, maybe at an address) and an offset."""

    text: str
    absolute: int | None = None
    name: str | None = None
    at: int | None = None  # NAME@ADDR: which of several functions called NAME
    offset: int = 0

    @property
    def symbolic(self) -> bool:
        return self.absolute is None


@dataclass(frozen=True)
class Location:
    address: int
    function: Function | None
    offset: int | None  # from the function's start


def parse_location(text: str) -> LocationSpec:
    """See the module doc.  Raises InputError for anything else."""
    t = text.strip()
    if re.fullmatch(r"0x[0-9a-fA-F]+", t):
        v = int(t, 16)
        if v > MASK64:
            raise InputError(f"address {text!r} does not fit in 64 bits")
        return LocationSpec(text, absolute=v)
    m = _SPEC.match(t) or _DTRACE.match(t)
    if m is None:
        raise InputError(f"{text!r} is not an address: write 0xADDR, FUNCTION, FUNCTION+0x1c, FUNCTION+28, "
                         f"kprobe:FUNCTION+28 or FUNCTION@0xADDR+OFF")
    off = m.group("off")
    offset = 0 if off in (None, "entry") else int(off, 16) if off.lower().startswith("0x") else int(off)
    at = m.groupdict().get("at")
    return LocationSpec(text, name=m.group("name"), at=None if at is None else int(at, 16), offset=offset)


class FunctionIndex:
    """Functions by name and by address."""

    def __init__(self, functions: Iterable[Function], where: str = "the image"):
        self.where = where  # what the functions come from, for messages: "the image", "the store"
        self.functions = sorted(functions, key=lambda f: (f.start, f.end))
        self._starts = [f.start for f in self.functions]
        self.by_name: dict[str, list[Function]] = {}
        for f in self.functions:
            self.by_name.setdefault(f.name, []).append(f)

    def containing(self, address: int) -> Function | None:
        """The function whose bytes hold ``address`` (the nearest start below it, among a few overlapping)."""
        i = bisect.bisect_right(self._starts, address) - 1
        for j in range(i, max(i - 16, -1), -1):
            f = self.functions[j]
            if f.start <= address < f.end:
                return f
        return None

    def named(self, name: str, at: int | None = None, what: str = "function") -> Function:
        """The one function ``name`` (at ``at`` when given); InputError listing the candidates otherwise."""
        found = self.by_name.get(name, [])
        if not found:
            close = self.close_names(name)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise InputError(f"no {what} named {name!r} in {self.where}{hint}")
        if at is not None:
            match = [f for f in found if f.start == at]
            if not match:
                raise InputError(f"no {what} {name!r} starts at {at:#x}; it is at "
                                 f"{', '.join(f'{f.start:#x}' for f in found)}")
            return match[0]
        if len(found) > 1:
            listed = ", ".join(f"{name}@{f.start:#x}" for f in found[:8])
            raise InputError(f"{len(found)} functions are named {name!r} (static functions of different files): "
                             f"choose one as {listed}{' ...' if len(found) > 8 else ''}")
        return found[0]

    def close_names(self, name: str, n: int = 5) -> list[str]:
        """The names nearest ``name`` by edit similarity (a typo: ``vfs_raed`` -> ``vfs_read``), best first."""
        return difflib.get_close_matches(name, self.by_name, n=n, cutoff=0.75)

    def resolve(self, spec: LocationSpec, boundaries: Callable[[Function], list[int]] | None = None) -> Location:
        """The address ``spec`` names, checked against the function's instruction ``boundaries`` (offsets)."""
        if not spec.symbolic:
            f = self.containing(spec.absolute)
            return Location(spec.absolute, f, None if f is None else spec.absolute - f.start)
        f = self.named(spec.name, spec.at)
        if spec.offset >= f.size:
            raise InputError(f"{spec.text}: offset {spec.offset:#x} is past the end of {f.name} "
                             f"({f.size:#x} bytes at {f.start:#x})")
        if boundaries is not None:
            starts = boundaries(f)
            i = bisect.bisect_left(starts, spec.offset)
            if i == len(starts) or starts[i] != spec.offset:
                before = starts[i - 1] if i else None
                after = starts[i] if i < len(starts) else None
                near = " and ".join(f"{f.name}+{o:#x}" for o in (before, after) if o is not None)
                raise InputError(f"{spec.text}: {f.name}+{spec.offset:#x} is inside an instruction, not at its "
                                 f"start; the nearest instruction boundaries are {near}")
        return Location(f.start + spec.offset, f, spec.offset)
