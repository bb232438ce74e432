"""Patched ranges: may a jump probe overwrite [A, A+L) at all, whatever its trampoline?

A jump-optimized probe writes ``jmp T`` over the first 5 bytes of the range
and relocates the whole range (``plan.block``, proved by ``proof.block``).
That is only safe if nothing else reaches into the range, which no proof of
the trampoline can see: Linux's optprobes ask the same questions in
``can_optimize`` (arch/x86/kernel/kprobes/opt.c, 6.1) and in the
``*_text_reserved`` checks of kprobe registration.  ``PatchRanges`` answers
them from the whole image, once per image:

* ``branch-target-inside``: some direct jmp/jcc/call/loop/xbegin ANYWHERE in
  the image aims strictly inside (A, A+L) (a ``foo.cold`` part jumps back
  into ``foo``; Linux looks only at the function, this is stronger), or an
  ``__ex_table`` fixup or a ``__jump_table`` target does (their jumps are not
  in the bytes).  A target exactly at A is fine: it lands on the jump.
* ``jump-table``: the function holds ``jmp *disp(,%reg,8)`` (a compiler
  jump table, whose entries we cannot bound), or an 8-byte pointer in a
  non-executable section aims strictly inside the range (a jump table, or
  any code pointer; in a module these are the applied relocations).
* ``indirect-jump-in-function``: the function holds any other indirect jmp
  (``jmp *%reg``, ``jmp *mem``), or a direct jmp/jcc to a retpoline thunk
  (``__x86_indirect_thunk_*``, ``__x86_indirect_jump_thunk_*``,
  ``__x86_indirect_its_thunk_*``, or anything in ``__indirect_thunk_start..end``
  but the return thunks there): its target is unknown, so it may
  land inside the range (Linux: ``insn_is_indirect_jump``).
* ``exception-table``: the function has an ``__ex_table`` entry: fixup code
  may jump back anywhere into it (Linux refuses the whole function).
* ``site:<kind>``: the range overlaps a kernel site (``kernel.sites``): code
  patched at boot or at run time (alternatives, paravirt, retpolines,
  return thunks, ftrace's fentry, static calls, jump labels, smp_locks,
  ...), a table looked up by address (bug, extable, kcfi), or text kprobes
  refuse (kprobe blacklist, noinstr, entry, kprobes text, init text).  Only
  ``irqentry``, ``softirqentry`` and ``cpuidle``, which mark text without
  changing it, are allowed.
* ``past-function-end``: the range runs past the function's end.

Not looked at: indirect calls (they return to the instruction after the
call, which is a target the direct-target set does not hold: a call inside
the range is refused by ``plan.block``, and a return address inside (A, A+L)
needs a call in the range), the bytes of ``.altinstr_replacement`` (their
jumps are fixed up for the site they are copied to; a site inside the range
is refused as ``site:alternative``), and code outside every function (the
walk is over ``image.functions`` bounds).  Without a ``SiteIndex`` the site,
exception-table and jump-label questions are not asked (``unchecked`` says so).
"""

from __future__ import annotations

import bisect
import os
from array import array
from dataclasses import dataclass
from typing import Iterable, Sequence

from iced_x86 import Decoder, FlowControl, Instruction, Mnemonic, OpKind, Register

from ..image.functions import Function, find_functions, function_bytes
from ..image.image import Image
from .sites import POLICY_BY_KIND, SiteIndex, kind_key, read_config

THUNK_PREFIXES = ("__x86_indirect_thunk_", "__x86_indirect_jump_thunk_", "__x86_indirect_its_thunk_")
MARK_ONLY_KINDS = frozenset({"irqentry", "softirqentry", "cpuidle"})
RETPOLINE_OPTIONS = ("CONFIG_RETPOLINE", "CONFIG_MITIGATION_RETPOLINE")

_DIRECT = frozenset({FlowControl.UNCONDITIONAL_BRANCH, FlowControl.CONDITIONAL_BRANCH, FlowControl.CALL,
                     FlowControl.XBEGIN_XABORT_XEND})
_JUMPS = frozenset({FlowControl.UNCONDITIONAL_BRANCH, FlowControl.CONDITIONAL_BRANCH})
_NEAR = frozenset({OpKind.NEAR_BRANCH16, OpKind.NEAR_BRANCH32, OpKind.NEAR_BRANCH64})


@dataclass(frozen=True)
class RangeRefusal:
    """Why a range may not be patched: ``key`` is a stable bucket for counting."""

    key: str
    reason: str

    def __str__(self) -> str:
        return self.reason


@dataclass(frozen=True)
class IndirectJump:
    address: int
    kind: str  # 'jump-table' | 'register' | 'memory' | 'thunk'
    text: str


@dataclass
class JumpCounts:
    """Indirect jumps of the text, by form."""

    table: int = 0       # jmp *disp(,%reg,8)
    register: int = 0    # jmp *%reg
    memory: int = 0      # jmp *mem, other forms
    thunk: int = 0       # jmp/jcc __x86_indirect_thunk_* (a retpoline: jmp *%reg once patched)

    @property
    def total(self) -> int:
        return self.table + self.register + self.memory + self.thunk


def _thunk_targets(image: Image, sites: SiteIndex | None):
    """A predicate: is a jump to this address an indirect jump through a thunk?  The named
    retpoline thunks, and anything in ``__indirect_thunk_start..end`` except the return thunks
    that also live there (``__x86_return_thunk``, ``its_return_thunk``: a jmp to those is a ret)."""
    ranges = [] if sites is None else [(s.address, s.end) for s in sites.iter_sites("indirect_thunk")]
    named = {s.address for s in image.symbols if s.name.startswith(THUNK_PREFIXES)}
    returns = {s.address for s in image.symbols if "return_thunk" in s.name} - named

    def is_thunk(target: int) -> bool:
        if target in named:
            return True
        return target not in returns and any(lo <= target < hi for lo, hi in ranges)
    return is_thunk


class PatchRanges:
    """The image-wide facts a patched range is checked against; see the module doc.

    Built once per image: one iced-x86 walk over every function (a few
    seconds for a kernel), one scan of the 8-byte-aligned qwords of the
    allocated non-executable sections, and the site tables."""

    def __init__(self, image: Image, functions: Iterable[Function], sites: SiteIndex | None = None):
        self.image = image
        self.sites = sites
        self.functions = sorted(functions, key=lambda f: (f.start, f.end))
        self._starts = [f.start for f in self.functions]
        self.unchecked: tuple[str, ...] = () if sites is not None else (
            "no SiteIndex: kernel sites, __ex_table and __jump_table were not checked",)
        self.counts = JumpCounts()
        self._indirect: dict[int, IndirectJump] = {}
        targets, sources = array("Q"), array("Q")
        self._walk(targets, sources)
        self._extable_functions: dict[int, int] = {}
        self._site_sources: dict[int, str] = {}  # a site's address -> its kind, for the entries it makes
        if sites is not None:
            for kind in ("extable", "jump_label"):
                for site in sites.iter_sites(kind):
                    if kind == "extable":
                        self._add_extable(site.address)
                    if site.target is not None:
                        targets.append(site.target)
                        sources.append(site.address)
                        self._site_sources[site.address] = kind
        self._targets = sorted(set(targets))
        self._found = (targets, sources)  # every (target, source), sorted by target when first asked
        self._by_target: array | None = None
        self._sources: array | None = None
        self._pointers = self._data_pointers()

    # -- building ------------------------------------------------------------
    def _walk(self, targets: array, sources: array) -> None:
        is_thunk = _thunk_targets(self.image, self.sites)
        counts = self.counts
        ins = Instruction()
        for function in self.functions:
            data = function_bytes(self.image, function)
            if not data:
                continue
            decoder = Decoder(64, data, ip=function.start)
            while decoder.can_decode:
                decoder.decode_out(ins)
                fc = ins.flow_control
                if fc in _DIRECT:
                    if ins.op0_kind not in _NEAR:
                        continue
                    target = ins.near_branch_target
                    targets.append(target)
                    sources.append(ins.ip)
                    if fc in _JUMPS and is_thunk(target):
                        counts.thunk += 1
                        self._note(function, ins, "thunk")
                elif fc == FlowControl.INDIRECT_BRANCH and ins.mnemonic == Mnemonic.JMP:
                    if ins.op0_kind == OpKind.MEMORY:
                        table = ins.memory_index != Register.NONE and ins.memory_index_scale == 8 \
                            and ins.memory_base == Register.NONE
                        kind = "jump-table" if table else "memory"
                        if table:
                            counts.table += 1
                        else:
                            counts.memory += 1
                    else:
                        kind = "register"
                        counts.register += 1
                    self._note(function, ins, kind)

    def _note(self, function: Function, ins: Instruction, kind: str) -> None:
        current = self._indirect.get(function.start)
        if current is None or (kind == "jump-table" and current.kind != "jump-table"):
            self._indirect[function.start] = IndirectJump(ins.ip, kind, str(ins))

    def _function_at(self, address: int) -> Function | None:
        i = bisect.bisect_right(self._starts, address) - 1
        while i >= 0:
            f = self.functions[i]
            if f.start <= address < f.end:
                return f
            if address - f.start > 1 << 20:
                return None
            i -= 1
        return None

    def _add_extable(self, address: int) -> None:
        f = self._function_at(address)
        if f is not None:
            self._extable_functions.setdefault(f.start, address)

    def _data_pointers(self) -> list[tuple[int, int]]:
        """(pointer value, where it is stored) of every 8-byte-aligned qword in an allocated
        non-executable section that aims inside executable text, but not at a function's start."""
        text = sorted((s.address, s.end) for s in self.image.iter_executable_sections())
        if not text:
            return []
        lo, hi = text[0][0], text[-1][1]
        starts = set(self._starts)
        out = []
        for section in self.image.iter_sections():
            if section.executable or not section.alloc or not section.data or section.address % 8:
                continue
            data = section.data[:len(section.data) // 8 * 8]
            values = array("Q", data)
            for k, v in enumerate(values):
                if lo < v < hi and v not in starts and self.image.is_executable(v):
                    out.append((v, section.address + 8 * k))
        out.sort()
        return out

    # -- questions -------------------------------------------------------------
    def targets_inside(self, address: int, length: int) -> list[int]:
        """Direct targets strictly inside (address, address+length)."""
        i = bisect.bisect_right(self._targets, address)
        j = bisect.bisect_left(self._targets, address + length)
        return self._targets[i:j]

    def entries_inside(self, address: int, length: int) -> list[tuple[int, int, str]]:
        """(target, source, how) of every transfer strictly inside (address, address+length): a
        direct branch or call of the text ('branch'), an exception fixup ('extable') or a static
        key's jump ('jump_label')."""
        if self._by_target is None:  # only the tracer audit asks where a target comes from
            targets, sources = self._found
            order = sorted(range(len(targets)), key=targets.__getitem__)
            self._by_target = array("Q", (targets[i] for i in order))
            self._sources = array("Q", (sources[i] for i in order))
        i = bisect.bisect_right(self._by_target, address)
        j = bisect.bisect_left(self._by_target, address + length)
        out = []
        for k in range(i, j):
            source = self._sources[k]
            how = self._site_sources.get(source)
            if how is None:
                how = "branch"
            out.append((self._by_target[k], source, how))
        return out

    def function_at(self, address: int) -> Function | None:
        """The function whose bytes hold ``address`` (None outside every function)."""
        return self._function_at(address)

    def indirect_jump(self, function: Function) -> IndirectJump | None:
        return self._indirect.get(function.start)

    def refusal(self, function: Function, address: int, length: int) -> RangeRefusal | None:
        """None when [address, address+length) may be overwritten by a jump, else why not."""
        if not function.start <= address < function.end:
            raise ValueError(f"{address:#x} is not inside {function.name} [{function.start:#x}, {function.end:#x})")
        end = address + length
        if end > function.end:
            return past_end(function, address, end)
        if self.sites is not None:
            for kind in self.sites.kinds_at(address, length):
                if kind not in MARK_ONLY_KINDS:
                    return site_refusal(kind)
            if function.start in self._extable_functions:
                return _extable_refusal(function, self._extable_functions[function.start])
        jump = self._indirect.get(function.start)
        if jump is not None and jump.kind == "jump-table":
            return _indirect_refusal(function, jump)
        k = bisect.bisect_right(self._pointers, (address, 1 << 64))
        if k < len(self._pointers) and self._pointers[k][0] < end:
            return pointer_refusal(*self._pointers[k])
        if jump is not None:
            return _indirect_refusal(function, jump)
        inside = self.targets_inside(address, length)
        if inside:
            return target_refusal(inside[0], address, end)
        return None

    def function_facts(self, function: Function) -> "FunctionRanges | None":
        """What belongs to the whole function of the questions ``refusal`` asks of its ranges, gathered
        once (``refusals``, and the native jump walk, ``engine.jump_walk``, read it), or None for a
        subclass that answers ``refusal`` otherwise (then each range is asked on its own)."""
        if type(self).refusal is not PatchRanges.refusal:
            return None
        fs, fe = function.start, function.end
        covering: list[tuple[tuple, str]] = []  # (kind_key, kind) of sites over the whole function
        points: list[tuple[int, int, tuple, str]] = []  # (start, end, kind_key, kind) of the others
        extable = None
        if self.sites is not None:
            for site in self.sites.sites_at(fs, fe - fs):
                if site.kind in MARK_ONLY_KINDS:
                    continue
                if site.address <= fs and site.end >= fe:
                    covering.append((kind_key(site.kind), site.kind))
                else:
                    points.append((site.address, site.end, kind_key(site.kind), site.kind))
            points.sort()
            at = self._extable_functions.get(fs)
            extable = None if at is None else _extable_refusal(function, at)
        indirect = self._indirect.get(fs)
        lo = bisect.bisect_right(self._pointers, (fs, 1 << 64))
        return FunctionRanges(
            function, self.sites is not None, min(covering) if covering else None, points, extable, indirect,
            None if indirect is None else _indirect_refusal(function, indirect),
            self._pointers[lo:bisect.bisect_left(self._pointers, (fe, 0))],
            self._targets[bisect.bisect_right(self._targets, fs):bisect.bisect_left(self._targets, fe)])

    def refusals(self, function: Function, ranges: Sequence[tuple[int, int]]) -> list[RangeRefusal | None]:
        """``refusal(function, address, length)`` for each (address, length) of ``function``, in order:
        the same answers (``tests/test_patch_range.py`` compares them over the kernel's functions),
        with what belongs to the whole function asked once (``function_facts``): its sites (those over
        the whole function, and the others sorted, with their longest length, so a range's are found by
        bisection), its exception-table entry, indirect jump, stored pointers and branch targets.  A
        subclass that answers ``refusal`` otherwise is asked range by range."""
        facts = self.function_facts(function)
        if facts is None:
            return [self.refusal(function, a, n) for a, n in ranges]
        fs, fe = function.start, function.end
        points, extable, jump, pointers, targets = (facts.points, facts.extable, facts.jump, facts.pointers,
                                                    facts.targets)
        best_cover = facts.cover
        starts = [p[0] for p in points]
        reach = max((p[1] - p[0] for p in points), default=0)
        table = facts.indirect is not None and facts.indirect.kind == "jump-table"
        pointer_values = [v for v, _ in pointers]
        by_kind: dict[str, RangeRefusal] = {}
        out: list[RangeRefusal | None] = []
        for address, length in ranges:
            if not fs <= address < fe:
                raise ValueError(f"{address:#x} is not inside {function.name} [{fs:#x}, {fe:#x})")
            end = address + length
            if end > fe:
                out.append(past_end(function, address, end))
                continue
            if facts.sites:
                best = best_cover
                top = address + max(length, 1)
                for k in range(bisect.bisect_right(starts, address - reach), bisect.bisect_left(starts, top)):
                    p = points[k]
                    if p[1] > address and (best is None or p[2] < best[0]):
                        best = (p[2], p[3])
                if best is not None:
                    refusal = by_kind.get(best[1])
                    if refusal is None:
                        refusal = by_kind[best[1]] = site_refusal(best[1])
                    out.append(refusal)
                    continue
                if extable is not None:
                    out.append(extable)
                    continue
            if table:
                out.append(jump)
                continue
            k = bisect.bisect_right(pointers, (address, 1 << 64))
            if k < len(pointers) and pointer_values[k] < end:
                out.append(pointer_refusal(*pointers[k]))
                continue
            if jump is not None:
                out.append(jump)
                continue
            i = bisect.bisect_right(targets, address)
            out.append(target_refusal(targets[i], address, end) if i < len(targets) and targets[i] < end else None)
        return out


@dataclass(frozen=True)
class FunctionRanges:
    """``PatchRanges.function_facts``: a function's answers to the range questions that do not depend on
    the range.  ``sites``: whether site questions are asked at all; ``cover``, the first (by
    ``kind_key``) of the sites over the whole function, as (kind_key, kind); ``points``, the other
    sites (start, end, kind_key, kind), sorted; ``extable``, its exception-table refusal; ``indirect``
    and ``jump``, its indirect jump and the refusal it makes; ``pointers``, (value, where) of the
    stored pointers that aim into it, and ``targets``, the direct branch targets in it, both sorted."""

    function: Function
    sites: bool
    cover: tuple[tuple, str] | None
    points: list[tuple[int, int, tuple, str]]
    extable: RangeRefusal | None
    indirect: IndirectJump | None
    jump: RangeRefusal | None
    pointers: list[tuple[int, int]]
    targets: list[int]


# The reasons, one builder each (``refusal`` and ``refusals`` give the same text).

def past_end(function: Function, address: int, end: int) -> RangeRefusal:
    return RangeRefusal("past-function-end", f"the range [{address:#x}, {end:#x}) runs past the end of "
                        f"{function.name} at {function.end:#x}")


def site_refusal(kind: str) -> RangeRefusal:
    row = POLICY_BY_KIND.get(kind)
    return RangeRefusal(f"site:{kind}", f"the range overlaps a {kind} site: {row.reason if row else 'a kernel site'}")


def _extable_refusal(function: Function, at: int) -> RangeRefusal:
    return RangeRefusal("exception-table", f"{function.name} has an __ex_table entry (at {at:#x}): its fixup code "
                        f"may jump back anywhere into the function (optprobes refuse the whole function)")


def _indirect_refusal(function: Function, jump: IndirectJump) -> RangeRefusal:
    if jump.kind == "jump-table":
        return RangeRefusal("jump-table", f"{function.name} dispatches through a jump table ({jump.text} at "
                            f"{jump.address:#x}) whose entries may aim inside the range")
    return RangeRefusal("indirect-jump-in-function", f"{function.name} has an indirect jump ({jump.text} at "
                        f"{jump.address:#x}, {jump.kind}) whose target may lie inside the range")


def pointer_refusal(value: int, where: int) -> RangeRefusal:
    return RangeRefusal("jump-table", f"a pointer stored at {where:#x} aims at {value:#x}, inside the range "
                        f"(a jump table entry, or another code pointer)")


def target_refusal(target: int, address: int, end: int) -> RangeRefusal:
    return RangeRefusal("branch-target-inside", f"{target:#x}, strictly inside [{address:#x}, {end:#x}), is a branch "
                        f"target: a jump there would land in the probe's jump")


def _retpoline_config(config) -> tuple[bool | None, str]:
    if config is None:
        return None, "no kernel config"
    options = read_config(config)
    for name in RETPOLINE_OPTIONS:
        if options.get(name) == "y":
            gcc = options.get("CONFIG_CC_IS_GCC") == "y"
            return True, (f"{name}=y" + (" with gcc: arch/x86/Makefile adds -fno-jump-tables" if gcc else
                                         " (clang: no jump tables under retpolines by default)"))
    return False, f"{' and '.join(RETPOLINE_OPTIONS)} not set: the compiler may emit jump tables"


def jump_table_fact(image: Image, config: str | os.PathLike | dict | None = None,
                    ranges: PatchRanges | None = None) -> tuple[bool, str]:
    """Whether ``image`` can hold compiler jump tables, and the evidence.

    Two sources, reported together: the kernel config (``CONFIG_RETPOLINE``
    or ``CONFIG_MITIGATION_RETPOLINE`` with gcc: the x86 Makefile adds
    ``-fno-jump-tables``), and the text itself, walked by ``PatchRanges``:
    every form of indirect jmp counted.  A compiler jump table is only ever
    reached through an indirect jmp (``jmp *disp(,%reg,8)``, or a load and
    ``jmp *%reg`` / a retpoline thunk), so text with no indirect jmp at all
    holds none that is used; a ``jmp *disp(,%reg,8)`` is one.  Otherwise the
    config decides, and without a config the answer is yes (not known)."""
    if ranges is None:
        ranges = PatchRanges(image, find_functions(image), None)
    c = ranges.counts
    text = (f"text: {c.table} jmp *disp(,%reg,8), {c.register} jmp *%reg, {c.memory} other jmp *mem, "
            f"{c.thunk} jumps to retpoline thunks")
    retpoline, why = _retpoline_config(config)
    if c.table:
        return True, f"{text}: table jumps are present ({why})"
    if c.total == 0:
        return False, f"{text}: no indirect jmp of any form, so no jump table can be dispatched ({why})"
    if retpoline:
        return False, f"{why}; {text}: no table-form jmp"
    return True, f"{why}; {text}: indirect jmps exist and the build may use tables for them"
