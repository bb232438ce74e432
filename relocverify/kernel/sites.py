"""The sites stage: kernel sites that the instruction bytes alone do not reveal.

``find_sites(image)`` reads the kernel's own tables, with the entry layouts of
Linux 6.1 x86-64 (Debian 12), and returns a :class:`SiteIndex` that answers
"which kinds of site overlap these bytes?" by bisection.

Where each kind comes from (``TABLES`` and ``RANGES`` below say it as data):

* tables in their own section, found with or without symbols: ``__ex_table``,
  ``__bug_table``, ``.altinstructions``, ``.parainstructions``,
  ``.retpoline_sites``, ``.return_sites``, ``.smp_locks`` (and, when a kernel
  has them, ``.kcfi_traps``, ``.ibt_endbr_seal``, ``.call_sites``,
  ``.cfi_sites``);
* tables inside ``.rodata``/``.data``/``.init.data`` between ``__start_X`` and
  ``__stop_X`` symbols, so they need symbols (ELF or System.map):
  ``__jump_table``, ``static_call_sites``, ``__mcount_loc`` (fentry calls),
  ``_kprobe_blacklist``;
* text ranges between marker symbols (noinstr, entry, irqentry, ...), and
  whole sections (``.altinstr_replacement``, ``.init.text``).

Self-relative entries are read as linked: in a vmlinux they are final at link
time (``--emit-relocs`` leaves ``.rela`` records of them, which are not
applied again); absolute pointers are link-time addresses (before KASLR).

Where two layouts are possible (``struct alt_instr`` grew from 12 to 14 bytes
in 6.3; ``paravirt_patch_site`` went from an absolute pointer to a packed s32
in 6.3; ``bug_entry`` is 8 or 12 bytes with or without
CONFIG_DEBUG_BUGVERBOSE) each candidate whose entry size divides the table
is tried, and the first whose every address lands in an executable section
is taken; ``SiteIndex.notes`` says which.

Each site's ``length`` is what it covers: the instruction at the address as
iced-x86 decodes it for point sites, ``instrlen``/``len`` for alternatives
and paravirt sites, the range for ranges, the symbol's size (or the distance
to the next text symbol) for kprobe-blacklisted functions.
"""

from __future__ import annotations

import bisect
import os
import struct
from operator import itemgetter
from typing import Callable, Iterator, NamedTuple

from iced_x86 import Decoder

from ..errors import InputError
from ..image.image import Image, Section
from ..x86.registers import MASK64


class Site(NamedTuple):
    """One kernel site: ``length`` bytes at ``address`` are special.  A ``NamedTuple``, a value like the frozen
    dataclasses around it, because a kernel has so many: the Debian 6.1 vmlinux's 129,547 took 0.15-0.19 s to
    make as frozen dataclasses when a run loaded them from the proof cache (``engine.site_memo``).

    Per kind, the optional fields mean:

    ========== ========================= ============== ===============================
    kind       target                    target_length  tag
    ========== ========================= ============== ===============================
    extable    fixup address                            ``data`` (type | imm << 16 ...)
    bug                                                 ``flags`` (BUGFLAG_WARNING=1..)
    alternative replacement bytes address replacement   cpuid word (bit 15: ALT_NOT) or
                                         length         ``ft_flags`` (6.3+)
    paravirt                                            patch type (pv_ops slot)
    jump_label jump target               (key address   key flags (1 branch, 2 init)
               in ``detail``)
    static_call key address                             flags (1 tail call, 2 init)
    ========== ========================= ============== ===============================
    """

    kind: str
    address: int
    length: int
    detail: str = ""
    target: int | None = None
    target_length: int | None = None
    tag: int | None = None

    @property
    def end(self) -> int:
        return self.address + self.length

    def __str__(self) -> str:
        return f"{self.kind} at {self.address:#x}+{self.length}" + (f": {self.detail}" if self.detail else "")


_ADDRESS, _ADDRESS_LENGTH = itemgetter(1), itemgetter(1, 2)  # a site's address; its (address, length)


class PolicyRow(NamedTuple):
    kind: str
    consequence: str  # 'reject' | 'mark' | 'verify-variants'
    reason: str


#: What a relocator must do about each kind of site, and why.
SITE_POLICY: tuple[PolicyRow, ...] = (
    PolicyRow("extable", "reject",
              "a fault in the relocated copy happens at T, where no exception-table entry exists, "
              "so the fixup never runs and the fault is fatal; kprobes never boosts such instructions "
              "and optprobes refuse the whole function"),
    PolicyRow("bug", "reject",
              "report_bug() looks the trapping ud2 up in __bug_table by address; from a copy it finds "
              "nothing, so a WARN becomes a fatal invalid-opcode oops; kprobes refuses BUG/WARN sites"),
    PolicyRow("kcfi", "reject",
              "a kCFI check sequence: its ud2 is looked up in .kcfi_traps by address; kprobes refuses it"),
    PolicyRow("kprobe_blacklist", "reject",
              "NOKPROBE_SYMBOL: the kernel forbids probes in this function (it runs in the int3/debug "
              "path or before the probe machinery can cope)"),
    PolicyRow("noinstr", "reject",
              "noinstr text runs where instrumentation is unsafe (entry/exit, RCU not watching); "
              "kprobes blacklists __noinstr_text_start..__noinstr_text_end"),
    PolicyRow("entry", "reject",
              "entry text runs on entry stacks with user GS/CR3 still live; x86 kprobes blacklists "
              "__entry_text_start..__entry_text_end"),
    PolicyRow("kprobes_text", "reject",
              "__kprobes functions are the probe machinery itself; kprobes blacklists the section"),
    PolicyRow("alt_replacement", "reject",
              "replacement bytes never run where they lie: apply_alternatives() copies them over the "
              "original site and fixes their relative operands for that address"),
    PolicyRow("static_call_tramp", "reject",
              "a static-call trampoline: arch_static_call_transform() rewrites its jmp on every "
              "static_call_update(), so a copy goes stale"),
    PolicyRow("alternative", "verify-variants",
              "the bytes on disk are not the bytes that run: apply_alternatives() copies the "
              "replacement over the site at boot when the CPU has the feature (or lacks it, ALT_NOT); "
              "verify every variant"),
    PolicyRow("paravirt", "verify-variants",
              "the bytes on disk are not the bytes that run: apply_paravirt() replaces the indirect "
              "pv_ops call with native code or a direct call at boot"),
    PolicyRow("retpoline", "verify-variants",
              "the bytes on disk are not the bytes that run: apply_retpolines() rewrites calls/jumps "
              "through __x86_indirect_thunk_* into an inline indirect branch or lfence form at boot"),
    PolicyRow("return_thunk", "verify-variants",
              "the bytes on disk are not the bytes that run: apply_returns() rewrites "
              "jmp __x86_return_thunk into ret; int3 when the return mitigation is off"),
    PolicyRow("fentry", "verify-variants",
              "the bytes on disk are not the bytes that run: ftrace turns call __fentry__ into a 5-byte "
              "NOP at boot and back into a call to a trampoline while tracing"),
    PolicyRow("static_call", "verify-variants",
              "the bytes on disk are not the bytes that run: the call to the trampoline is rewritten "
              "into a direct call (or NOP) at boot and at every static_call_update(); kprobes refuses "
              "these sites (static_call_text_reserved)"),
    PolicyRow("jump_label", "verify-variants",
              "the bytes on disk are not the bytes that run: jump_label toggles a NOP and a 2/5-byte "
              "jmp at runtime (text_poke_bp); kprobes refuses these sites (jump_label_text_reserved)"),
    PolicyRow("smp_lock", "verify-variants",
              "the bytes on disk are not the bytes that run: alternatives_smp_unlock() turns the LOCK "
              "prefix into a DS prefix on UP and back on CPU hotplug; kprobes refuses these sites "
              "(alternatives_text_reserved)"),
    PolicyRow("endbr_seal", "verify-variants",
              "apply_seal_endbr() overwrites an unused ENDBR64 with a NOP at boot (IBT kernels)"),
    PolicyRow("call_thunk", "verify-variants",
              "call-depth tracking rewrites the call to go through an accounting thunk at boot"),
    PolicyRow("cfi", "verify-variants",
              "FineIBT rewrites the kCFI preamble at boot"),
    PolicyRow("irqentry", "mark",
              "irq entry text (__irqentry_text): the graph tracer and stack traces treat it as an "
              "exception boundary; in 6.1 x86 it lies inside entry text"),
    PolicyRow("softirqentry", "mark",
              "softirq entry text: stack traces treat it as a boundary"),
    PolicyRow("cpuidle", "mark",
              "cpuidle text runs with RCU not watching in the idle loop (objtool checks it like "
              "noinstr); a probe handler there must not use RCU"),
    PolicyRow("indirect_thunk", "mark",
              "the retpoline/return thunks themselves: every indirect branch and return funnels "
              "through them"),
    PolicyRow("init_text", "mark",
              "init text is freed after boot; a probe there outlives its code"),
)

POLICY_BY_KIND: dict[str, PolicyRow] = {row.kind: row for row in SITE_POLICY}
KIND_ORDER: dict[str, int] = {row.kind: i for i, row in enumerate(SITE_POLICY)}


# --- table layouts -----------------------------------------------------------

class Layout(NamedTuple):
    """One entry layout of a kernel table."""

    name: str          # e.g. "alt_instr 6.1 (12 bytes)"
    size: int          # bytes per entry
    format: str        # struct format of one entry
    source: str        # where the layout was read


class Table(NamedTuple):
    """Where a kind's table lives and how its entries read."""

    kind: str
    section: str | None          # a section that is exactly the table
    start: str | None            # or the symbols around it
    stop: str | None
    layouts: tuple[Layout, ...]  # candidates, newest-matching first
    optional: bool = False       # absent on many kernels; not a 'missing' note


_S32 = Layout("s32 self-relative", 4, "<i", "the .long 1b - . lists of objtool/asm")
_U64 = Layout("unsigned long absolute", 8, "<Q", "unsigned long arrays")

EXTABLE_61 = Layout("exception_table_entry {int insn, fixup, data} (12 bytes)", 12, "<iii",
                    "arch/x86/include/asm/extable.h, 5.17+")
BUG_VERBOSE = Layout("bug_entry {s32 bug_addr_disp, file_disp; u16 line, flags} (12 bytes)", 12, "<iiHH",
                     "include/asm-generic/bug.h, GENERIC_BUG_RELATIVE_POINTERS + DEBUG_BUGVERBOSE")
BUG_TERSE = Layout("bug_entry {s32 bug_addr_disp; u16 flags} (8 bytes)", 8, "<iH2x",
                   "include/asm-generic/bug.h, GENERIC_BUG_RELATIVE_POINTERS, no DEBUG_BUGVERBOSE")
ALT_61 = Layout("alt_instr {s32 instr_offset, repl_offset; u16 cpuid; u8 instrlen, replacementlen} "
                "(12 bytes)", 12, "<iiHBB", "arch/x86/include/asm/alternative.h, 5.13..6.2")
ALT_63 = Layout("alt_instr {s32 instr_offset, repl_offset; u32 ft_flags; u8 instrlen, replacementlen} "
                "(14 bytes)", 14, "<iiIBB", "arch/x86/include/asm/alternative.h, 6.3+")
PARAVIRT_61 = Layout("paravirt_patch_site {u8 *instr; u8 type, len} (16 bytes)", 16, "<QBB6x",
                     "arch/x86/include/asm/paravirt_types.h, up to 6.2")
PARAVIRT_63 = Layout("paravirt_patch_site {s32 instr_offset; u8 type, len} packed (6 bytes)", 6, "<iBB",
                     "arch/x86/include/asm/paravirt_types.h, 6.3..6.7")
JUMP_ENTRY = Layout("jump_entry {s32 code, target; long key} (16 bytes)", 16, "<iiq",
                    "include/linux/jump_label.h, HAVE_ARCH_JUMP_LABEL_RELATIVE")
STATIC_CALL_SITE = Layout("static_call_site {s32 addr, key} (8 bytes)", 8, "<ii",
                          "include/linux/static_call_types.h")

TABLES: tuple[Table, ...] = (
    Table("extable", "__ex_table", "__start___ex_table", "__stop___ex_table", (EXTABLE_61,)),
    Table("bug", "__bug_table", "__start___bug_table", "__stop___bug_table", (BUG_VERBOSE, BUG_TERSE)),
    Table("alternative", ".altinstructions", "__alt_instructions", "__alt_instructions_end",
          (ALT_61, ALT_63)),
    Table("paravirt", ".parainstructions", "__parainstructions", "__parainstructions_end",
          (PARAVIRT_61, PARAVIRT_63)),
    Table("retpoline", ".retpoline_sites", "__retpoline_sites", "__retpoline_sites_end", (_S32,)),
    Table("return_thunk", ".return_sites", "__return_sites", "__return_sites_end", (_S32,)),
    Table("smp_lock", ".smp_locks", "__smp_locks", "__smp_locks_end", (_S32,)),
    Table("jump_label", None, "__start___jump_table", "__stop___jump_table", (JUMP_ENTRY,)),
    Table("static_call", None, "__start_static_call_sites", "__stop_static_call_sites",
          (STATIC_CALL_SITE,)),
    Table("fentry", None, "__start_mcount_loc", "__stop_mcount_loc", (_U64,)),
    Table("kprobe_blacklist", None, "__start_kprobe_blacklist", "__stop_kprobe_blacklist", (_U64,)),
    Table("kcfi", ".kcfi_traps", "__start___kcfi_traps", "__stop___kcfi_traps", (_S32,), optional=True),
    Table("endbr_seal", ".ibt_endbr_seal", "__ibt_endbr_seal", "__ibt_endbr_seal_end", (_S32,),
          optional=True),
    Table("call_thunk", ".call_sites", "__call_sites", "__call_sites_end", (_S32,), optional=True),
    Table("cfi", ".cfi_sites", "__cfi_sites", "__cfi_sites_end", (_S32,), optional=True),
)


class Range(NamedTuple):
    kind: str
    start: str  # symbol
    stop: str


RANGES: tuple[Range, ...] = (
    Range("noinstr", "__noinstr_text_start", "__noinstr_text_end"),
    Range("entry", "__entry_text_start", "__entry_text_end"),
    Range("irqentry", "__irqentry_text_start", "__irqentry_text_end"),
    Range("softirqentry", "__softirqentry_text_start", "__softirqentry_text_end"),
    Range("cpuidle", "__cpuidle_text_start", "__cpuidle_text_end"),
    Range("kprobes_text", "__kprobes_text_start", "__kprobes_text_end"),
    Range("static_call_tramp", "__static_call_text_start", "__static_call_text_end"),
    Range("indirect_thunk", "__indirect_thunk_start", "__indirect_thunk_end"),
)

#: Whole sections that are a site kind of their own.
SECTION_RANGES: tuple[tuple[str, str], ...] = (
    ("alt_replacement", ".altinstr_replacement"),
    ("init_text", ".init.text"),
)

#: Kinds that a stripped image without System.map cannot have.
_CORE_RANGE_KINDS = ("noinstr", "entry")


# --- the index -------------------------------------------------------------------

class SiteIndex:
    """All sites of an image, by kind, with overlap queries.

    ``count_by_kind()`` counts table entries (non-zero ones for tables that
    are padded: ``.smp_locks``, ``__mcount_loc``) and non-empty ranges.
    ``stray_by_kind()`` counts entries whose address is not in an executable
    section (expected: zero).  ``missing`` says which kinds could not be
    looked for and why; ``notes`` records the layouts chosen.

    Queries cost two bisections: short sites (up to ``POINT_LIMIT`` bytes)
    sit in one sorted list scanned back at most ``POINT_LIMIT`` bytes; long
    ones (ranges, blacklisted functions) are cut into elementary segments,
    each holding the sites that cover it.
    """

    POINT_LIMIT = 64

    def __init__(self, sites: dict[str, list[Site]], missing: list[str], notes: list[str],
                 stray: dict[str, int]) -> None:
        self._sites = {kind: tuple(sorted(found, key=_ADDRESS_LENGTH)) for kind, found in sites.items()}
        self.missing = tuple(missing)
        self.notes = tuple(notes)
        self._stray = dict(stray)
        every = [site for found in self._sites.values() for site in found if site.length > 0]
        points = sorted((s for s in every if s.length <= self.POINT_LIMIT), key=_ADDRESS)
        self._points = points
        self._point_starts = list(map(_ADDRESS, points))
        self._reach = max((s.length for s in points), default=0)
        self._bounds, self._segments = _segment(s for s in every if s.length > self.POINT_LIMIT)

    def count_by_kind(self) -> dict[str, int]:
        return {kind: len(found) for kind, found in self._sites.items()}

    def as_data(self) -> tuple:
        """What the index is made of, as tuples, dicts and strings (``from_data`` makes it again):
        what a cache keeps (``engine.site_memo``)."""
        return ({kind: [tuple(site) for site in found] for kind, found in self._sites.items()},
                list(self.missing), list(self.notes), dict(self._stray))

    @classmethod
    def from_data(cls, data: tuple) -> SiteIndex:
        sites, missing, notes, stray = data
        return cls({kind: list(map(Site._make, found)) for kind, found in sites.items()},
                   list(missing), list(notes), dict(stray))

    def stray_by_kind(self) -> dict[str, int]:
        return dict(self._stray)

    def kinds(self) -> tuple[str, ...]:
        return tuple(sorted(self._sites, key=kind_key))

    def iter_sites(self, kind: str | None = None) -> Iterator[Site]:
        if kind is not None:
            return iter(self._sites.get(kind, ()))
        return (site for k in self.kinds() for site in self._sites[k])

    def sites_at(self, address: int, length: int = 1) -> list[Site]:
        """Every site overlapping [address, address + length), in SITE_POLICY order."""
        found = self._overlapping(address, address + max(length, 1))
        found.sort(key=lambda s: (kind_key(s.kind), s.address))
        return found

    def kinds_at(self, address: int, length: int = 1) -> tuple[str, ...]:
        """The kinds of site overlapping [address, address + length), in SITE_POLICY order."""
        found = self._overlapping(address, address + max(length, 1))
        if not found:
            return ()
        return tuple(sorted({site.kind for site in found}, key=kind_key))

    def _overlapping(self, address: int, end: int) -> list[Site]:
        found = []
        starts, points = self._point_starts, self._points
        lowest = address - self._reach
        i = bisect.bisect_left(starts, end) - 1
        while i >= 0 and starts[i] > lowest:
            if points[i].end > address:
                found.append(points[i])
            i -= 1
        bounds = self._bounds
        j = max(bisect.bisect_right(bounds, address) - 1, 0)
        while j < len(self._segments) and bounds[j] < end:
            found.extend(self._segments[j])
            j += 1
        return list(dict.fromkeys(found)) if len(found) > 1 else found


def _segment(long_sites) -> tuple[list[int], list[tuple[Site, ...]]]:
    """Boundaries b[0] < b[1] < ... and, per [b[i], b[i+1]), the sites covering it."""
    long_sites = list(long_sites)
    bounds = sorted({s.address for s in long_sites} | {s.end for s in long_sites})
    covering: list[list[Site]] = [[] for _ in range(max(len(bounds) - 1, 0))]
    for site in long_sites:
        first = bisect.bisect_left(bounds, site.address)
        last = bisect.bisect_left(bounds, site.end)
        for k in range(first, last):
            covering[k].append(site)
    return bounds, [tuple(c) for c in covering]


def kind_key(kind: str) -> tuple:
    return (KIND_ORDER.get(kind, len(KIND_ORDER)), kind)


# --- entry point ---------------------------------------------------------------------

def find_sites(image: Image, config: str | os.PathLike | dict | None = None) -> SiteIndex:
    """Read every site table and range of ``image``; see the module doc.

    ``config`` (a kernel ``.config`` path or a ``{name: value}`` dict) is
    optional; when given, the ``bug_entry`` layout it implies is tried first
    and a disagreement with the table is noted.
    """
    options = read_config(config)
    reader = _Reader(image)
    sites: dict[str, list[Site]] = {}
    missing: list[str] = []
    notes: list[str] = []
    stray: dict[str, int] = {}
    for table in TABLES:
        located = reader.locate(table)
        if isinstance(located, str):
            if not table.optional:
                missing.append(f"{table.kind}: {located}")
            continue
        address, data = located
        layouts = _order_layouts(table, options, notes)
        layout, entries = reader.choose_layout(table, layouts, address, data)
        if layout is None:
            missing.append(f"{table.kind}: table of {len(data)} bytes fits no known layout "
                           f"({', '.join(str(l.size) for l in table.layouts)}-byte entries)")
            continue
        if len(table.layouts) > 1:
            notes.append(f"{table.kind}: {layout.name} [{layout.source}]")
        if layouts != table.layouts and layout is not layouts[0]:
            notes.append(f"{table.kind}: the table contradicts the kernel config; the table wins")
        sites[table.kind] = entries
    for range_ in RANGES:
        start, stop = image.symbol_address(range_.start), image.symbol_address(range_.stop)
        if start is None or stop is None:
            if range_.kind in _CORE_RANGE_KINDS:
                missing.append(f"{range_.kind}: {_why_no_symbols(image, range_.start)}")
            continue
        sites[range_.kind] = [Site(range_.kind, start, stop - start, f"{range_.start}..{range_.stop}")] \
            if stop > start else []
    for kind, name in SECTION_RANGES:
        section = image.get_section(name)
        if section is not None and section.size:
            sites[kind] = [Site(kind, section.address, section.size, name)]
    for kind, found in sites.items():
        stray[kind] = sum(1 for site in found if not image.is_executable(site.address))
    return SiteIndex(sites, missing, notes, stray)


def _why_no_symbols(image: Image, symbol: str) -> str:
    if image.symbol_source == "none":
        return "no symbols (pass System.map)"
    return f"{symbol} is not in the {image.symbol_source} symbols"


def read_config(config) -> dict[str, str]:
    """A kernel's build options (``CONFIG_X=y`` lines, a path to them, or a dict already read) as a dict."""
    if config is None:
        return {}
    if isinstance(config, dict):
        return dict(config)
    options = {}
    try:
        with open(config, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                name, equals, value = line.strip().partition("=")
                if equals and name.startswith("CONFIG_"):
                    options[name] = value
    except OSError as exc:
        raise InputError(f"{os.fspath(config)}: cannot read the kernel config: {exc.strerror}") from None
    return options


def _order_layouts(table: Table, options: dict[str, str], notes: list[str]) -> tuple[Layout, ...]:
    if table.kind != "bug" or "CONFIG_GENERIC_BUG" not in options:
        return table.layouts
    verbose = options.get("CONFIG_DEBUG_BUGVERBOSE") == "y"
    expected = BUG_VERBOSE if verbose else BUG_TERSE
    notes.append(f"bug: config has DEBUG_BUGVERBOSE={'y' if verbose else 'n'}, "
                 f"expects {expected.size}-byte entries")
    return (expected,) + tuple(l for l in table.layouts if l is not expected)


# --- reading tables ------------------------------------------------------------------

class _Reader:
    """Table bytes and instruction lengths out of an image."""

    def __init__(self, image: Image) -> None:
        self.image = image
        text = [s for s in image.sections if s.executable and s.alloc and s.data]
        self.text = sorted(text, key=lambda s: s.address)
        self.text_starts = [s.address for s in self.text]
        self.text_ends = [s.end for s in self.text]
        self._decoders = [Decoder(64, s.data, ip=s.address) for s in self.text]
        self._func_ends = None

    def locate(self, table: Table) -> tuple[int, bytes] | str:
        image = self.image
        section = image.get_section(table.section) if table.section else None
        if section is not None:
            return section.address, section.data
        start = image.symbol_address(table.start) if table.start else None
        stop = image.symbol_address(table.stop) if table.stop else None
        if start is None or stop is None:
            if table.section is not None and image.symbol_source == "none":
                return f"no {table.section} section and no symbols"
            if image.symbol_source == "none":
                return "no symbols (pass System.map)"
            where = f"no {table.section} section and " if table.section else ""
            return f"{where}{table.start} is not in the {image.symbol_source} symbols"
        if stop < start:
            return f"{table.stop} lies before {table.start}"
        section = image.section_at(start) if stop > start else None
        if stop > start and (section is None or not section.contains(start, stop - start)):
            return f"{table.start}..{table.stop} is not inside one section"
        return start, (image.read(start, stop - start) if stop > start else b"")

    def choose_layout(self, table: Table, layouts, address: int, data: bytes):
        best = (None, [], -1)
        for layout in layouts:
            if len(data) % layout.size:
                continue
            entries = PARSERS[table.kind](self, layout, address, data)
            bad = sum(1 for site in entries if not self.executable(site.address))
            if bad == 0:
                return layout, entries
            if best[0] is None or bad < best[2]:
                best = (layout, entries, bad)
        return best[0], best[1]

    def _text_index(self, address: int) -> int:
        i = bisect.bisect_right(self.text_starts, address) - 1
        return i if i >= 0 and address < self.text_ends[i] else -1

    def executable(self, address: int) -> Section | None:
        i = self._text_index(address)
        return self.text[i] if i >= 0 else None

    def insn_length(self, address: int) -> int:
        """The length iced decodes at ``address`` (as if the section ended 15 bytes on); 1 outside
        executable sections."""
        i = self._text_index(address)
        if i < 0:
            return 1
        section, decoder = self.text[i], self._decoders[i]
        offset = address - section.address
        if offset + 15 > len(section.data):
            return Decoder(64, section.data[offset:offset + 15], ip=address).decode().len or 1
        decoder.position = offset
        decoder.ip = address
        return decoder.decode().len or 1

    def function_length(self, address: int) -> int:
        """Size of the function starting at ``address``: the ELF size, else the
        distance to the next text symbol (or the section end)."""
        if self._func_ends is None:
            sizes, starts = {}, set()
            for symbol in self.image.symbols:
                if symbol.kind == "func":
                    starts.add(symbol.address)
                    if symbol.size:
                        sizes[symbol.address] = max(sizes.get(symbol.address, 0), symbol.size)
            self._func_ends = (sizes, sorted(starts))
        sizes, starts = self._func_ends
        if address in sizes:
            return sizes[address]
        section = self.executable(address)
        i = bisect.bisect_right(starts, address)
        end = starts[i] if i < len(starts) else (section.end if section else address + 1)
        if section is not None:
            end = min(end, section.end)
        return max(end - address, 1)


def _entries(layout: Layout, data: bytes):
    return enumerate(struct.iter_unpack(layout.format, data))


def _rel(base: int, value: int) -> int:
    return (base + value) & MASK64


def _parse_s32_list(reader: _Reader, layout: Layout, address: int, data: bytes, kind: str) -> list[Site]:
    sites = []
    for i, (offset,) in _entries(layout, data):
        if offset == 0:  # alignment padding (.smp_locks is padded to a page)
            continue
        site = _rel(address + 4 * i, offset)
        sites.append(Site(kind, site, reader.insn_length(site)))
    return sites


def _parse_extable(reader: _Reader, layout: Layout, address: int, data: bytes) -> list[Site]:
    sites = []
    for i, (insn, fixup, extra) in _entries(layout, data):
        entry = address + 12 * i
        site, target = _rel(entry, insn), _rel(entry + 4, fixup)
        sites.append(Site("extable", site, reader.insn_length(site),
                          f"type {extra & 0xFF} fixup {target:#x}", target=target, tag=extra))
    return sites


def _parse_bug(reader: _Reader, layout: Layout, address: int, data: bytes) -> list[Site]:
    sites = []
    for i, values in _entries(layout, data):
        entry = address + layout.size * i
        site = _rel(entry, values[0])
        if layout is BUG_VERBOSE:
            file_name = _c_string(reader.image, _rel(entry + 4, values[1]))
            detail, flags = f"{file_name}:{values[2]} flags {values[3]:#x}", values[3]
        else:
            detail, flags = f"flags {values[1]:#x}", values[1]
        sites.append(Site("bug", site, reader.insn_length(site), detail, tag=flags))
    return sites


def _parse_alternative(reader: _Reader, layout: Layout, address: int, data: bytes) -> list[Site]:
    sites = []
    for i, (instr, repl, feature, instrlen, replen) in _entries(layout, data):
        entry = address + layout.size * i
        site, replacement = _rel(entry, instr), _rel(entry + 4, repl)
        if layout is ALT_61:
            word, inverted = feature & 0x7FFF, bool(feature & 0x8000)
        else:
            word, inverted = feature & 0xFFFF, bool((feature >> 16) & 1)
        detail = (f"feature {word >> 5}*32+{word & 31}{' (ALT_NOT)' if inverted else ''} "
                  f"replacement {replacement:#x}+{replen}")
        sites.append(Site("alternative", site, instrlen, detail, target=replacement,
                          target_length=replen, tag=feature))
    return sites


def _parse_paravirt(reader: _Reader, layout: Layout, address: int, data: bytes) -> list[Site]:
    sites = []
    for i, (instr, kind, length) in _entries(layout, data):
        site = instr & MASK64 if layout is PARAVIRT_61 else _rel(address + layout.size * i, instr)
        sites.append(Site("paravirt", site, length, f"type {kind} len {length}", tag=kind))
    return sites


def _parse_jump_label(reader: _Reader, layout: Layout, address: int, data: bytes) -> list[Site]:
    sites = []
    for i, (code, target, key) in _entries(layout, data):
        entry = address + 16 * i
        site, jump, key_address = _rel(entry, code), _rel(entry + 4, target), _rel(entry + 8, key)
        flags = key_address & 3
        key_address &= ~3 & MASK64
        detail = f"target {jump:#x} key {key_address:#x}" + (" branch" if flags & 1 else "") + \
            (" init" if flags & 2 else "")
        sites.append(Site("jump_label", site, reader.insn_length(site), detail, target=jump, tag=flags))
    return sites


def _parse_static_call(reader: _Reader, layout: Layout, address: int, data: bytes) -> list[Site]:
    sites = []
    for i, (addr, key) in _entries(layout, data):
        entry = address + 8 * i
        site, key_address = _rel(entry, addr), _rel(entry + 4, key)
        flags = key_address & 3
        key_address &= ~3 & MASK64
        detail = f"key {key_address:#x}" + (" tail" if flags & 1 else "") + (" init" if flags & 2 else "")
        sites.append(Site("static_call", site, reader.insn_length(site), detail, target=key_address,
                          tag=flags))
    return sites


def _parse_fentry(reader: _Reader, layout: Layout, address: int, data: bytes) -> list[Site]:
    return [Site("fentry", value, reader.insn_length(value))
            for _, (value,) in _entries(layout, data) if value]


def _parse_kprobe_blacklist(reader: _Reader, layout: Layout, address: int, data: bytes) -> list[Site]:
    return [Site("kprobe_blacklist", value, reader.function_length(value))
            for _, (value,) in _entries(layout, data) if value]


def _s32_parser(kind: str) -> Callable:
    return lambda reader, layout, address, data: _parse_s32_list(reader, layout, address, data, kind)


PARSERS: dict[str, Callable] = {
    "extable": _parse_extable,
    "bug": _parse_bug,
    "alternative": _parse_alternative,
    "paravirt": _parse_paravirt,
    "jump_label": _parse_jump_label,
    "static_call": _parse_static_call,
    "fentry": _parse_fentry,
    "kprobe_blacklist": _parse_kprobe_blacklist,
    **{kind: _s32_parser(kind) for kind in
       ("retpoline", "return_thunk", "smp_lock", "kcfi", "endbr_seal", "call_thunk", "cfi")},
}


def _c_string(image: Image, address: int, limit: int = 256) -> str:
    section = image.section_at(address)
    if section is None or not section.data:
        return "?"
    offset = address - section.address
    end = section.data.find(b"\0", offset, offset + limit)
    if end < 0:
        return "?"
    return section.data[offset:end].decode("utf-8", "replace")
