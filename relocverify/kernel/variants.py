"""The variants of a boot-patched site: every byte string that can run at an address.

At a boot-time patch site the bytes on disk are not (always) the bytes that
run.  For an instruction at A inside such a site, ``variants_at`` returns
each instruction that can be at A in the live kernel, as ``Variant(name,
raw)``, the on-disk bytes included; or a ``NoVariants`` value whose reason
says why they cannot be known from the image.  The batch verifies every
variant and keeps the weakest verdict, so a proof of bytes that will not
run is never presented as covering the live kernel.

Per kind, what Linux 6.1 x86-64 writes (arch/x86/kernel/alternative.c,
ftrace.c, static_call.c, jump_label.c):

  return_thunk  jmp __x86_return_thunk, or ``ret; int3...`` (apply_returns, ``return_site_bytes``)
  retpoline     call/jmp __x86_indirect_thunk_REG, or ``call/jmp *%REG`` + NOPs,
                or ``lfence; call/jmp *%REG`` (apply_retpolines, patch_retpoline)
  fentry        call __fentry__, a 5-byte NOP (ftrace_init), or a call to an
                ftrace trampoline while tracing (any rel32 target)
  static_call   call/jmp to the trampoline, a direct call/jmp to the current
                function (any rel32 target), or a 5-byte NOP for a NULL function
  jump_label    a 2- or 5-byte NOP, or jmp rel8/rel32 to the entry's target
  smp_lock      a LOCK prefix, or the DS prefix 0x3e that replaces it on UP
  alternative   the original bytes, or the replacement copied over them
                (its first call/jmp re-targeted, recompute_jump), NOP-padded
  paravirt      replaced by templates chosen at boot: not in the image
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import iced_x86

from ..image.image import Image
from ..x86.encoding import rel_from
from ..x86.registers import GPR64, MASK64, fits_s32
from .sites import Site

NOP5 = bytes.fromhex("0f1f440000")
NOP2 = bytes.fromhex("6690")


@dataclass(frozen=True)
class Variant:
    name: str
    raw: bytes  # the instruction at A in this variant


@dataclass(frozen=True)
class NoVariants:
    reason: str


def _insn_len(raw: bytes, at: int) -> int:
    ins = iced_x86.Decoder(64, raw, ip=at).decode()
    return 0 if ins.is_invalid else ins.len


def _rel32(op: int, at: int, target: int) -> bytes | None:
    d = rel_from(at + 5, target)
    return bytes([op]) + struct.pack("<i", d) if fits_s32(d) else None


def _indirect(kind_call: bool, reg: str) -> bytes:
    n = GPR64.index(reg)
    modrm = (0xD0 if kind_call else 0xE0) | (n & 7)
    return (b"\x41" if n >= 8 else b"") + bytes([0xFF, modrm])


def return_site_bytes(raw: bytes, rethunk: bool) -> bytes:
    """The live bytes of a ``.return_sites`` entry (``jmp __x86_return_thunk``) after 6.1's
    ``apply_returns`` -> ``patch_return``: with ``X86_FEATURE_RETHUNK`` (a return-thunk mitigation
    chosen for the CPU and command line: retbleed's unret or IBPB, SRSO's safe RET) the file's jump
    stays (to ``__x86_return_thunk``, the thunk 6.1.187 uses); without it, ``ret`` and ``int3`` to the
    jump's length (``c3 cc cc cc cc``)."""
    if rethunk or raw[:1] != b"\xe9":
        return raw
    return b"\xc3" + b"\xcc" * (len(raw) - 1)


class VariantFinder:
    """Knows the image's thunk symbols; answers ``variants_at``."""

    def __init__(self, image: Image):
        self.image = image
        self.thunk_reg: dict[int, str] = {}
        for s in image.symbols:
            if s.name.startswith("__x86_indirect_thunk_"):
                self.thunk_reg[s.address] = s.name[len("__x86_indirect_thunk_"):]

    def variants_at(self, site: Site, address: int, raw: bytes) -> list[Variant] | NoVariants:
        # (A memo by the bytes missed 95% of a kernel's 99 k calls: a call, a jmp or a locked instruction at
        # a site carries its own rel32 or displacement.  It held 94 k entries per worker for nothing.)
        fn = getattr(self, f"_{site.kind}", None)
        if fn is None:
            return [Variant("on disk", raw)]
        return fn(site, address, raw)

    # -- one method per kind ------------------------------------------------
    def _return_thunk(self, site, a, raw):
        if site.address != a:
            return [Variant("on disk", raw)]
        return [Variant("jmp __x86_return_thunk (on disk)", raw), Variant("ret (apply_returns)", b"\xc3")]

    def _retpoline(self, site, a, raw):
        if site.address != a:
            return NoVariants("inside a retpoline site, whose NOP padding apply_retpolines() chooses at boot")
        body = raw[1:] if raw[:1] == b"\x2e" else raw  # -mindirect-branch-cs-prefix leaves room for lfence
        if len(body) == 5 and body[0] in (0xE8, 0xE9):
            cc = None
        elif len(body) == 6 and body[0] == 0x0F and body[1] & 0xF0 == 0x80:
            cc = body[1] & 0x0F
        else:
            return NoVariants(f"retpoline site of an unexpected form ({raw.hex()})")
        target = (a + len(raw) + struct.unpack("<i", body[-4:])[0]) & MASK64
        reg = self.thunk_reg.get(target)
        if reg is None:
            return NoVariants("the retpoline thunk's register is unknown (no symbols: pass System.map)")
        if cc is not None:
            # patch_retpoline: "Jncc.d8 1f; [lfence]; jmp *%reg; 1:" -- at A, the inverted short jcc.
            return [Variant("jcc thunk (on disk)", raw), Variant("jncc over jmp *%reg", bytes([0x70 + (cc ^ 1), len(raw) - 2]))]
        call = body[0] == 0xE8
        return [Variant("thunk (on disk)", raw), Variant(f"{'call' if call else 'jmp'} *%{reg}", _indirect(call, reg)),
                Variant("lfence (lfence; indirect)", b"\x0f\xae\xe8")]

    def _fentry(self, site, a, raw):
        if site.address != a:
            return [Variant("on disk", raw)]
        return [Variant("call __fentry__ (on disk)", raw), Variant("nop5 (ftrace off)", NOP5)]

    def _static_call(self, site, a, raw):
        if site.address != a:
            return [Variant("on disk", raw)]
        out = [Variant("trampoline call (on disk)", raw), Variant("nop5 (NULL function)", NOP5)]
        if raw[:1] == b"\xe9":
            out.append(Variant("ret (tail call of a NULL function)", b"\xc3"))
        return out

    def _jump_label(self, site, a, raw):
        if site.address != a or site.target is None:
            return [Variant("on disk", raw)]
        if len(raw) == 2:
            jmp = bytes([0xEB]) + struct.pack("<b", rel_from(a + 2, site.target)) \
                if -128 <= rel_from(a + 2, site.target) < 128 else None
            other = [Variant("nop2", NOP2)] + ([Variant(f"jmp {site.target:#x}", jmp)] if jmp else [])
        elif len(raw) == 5:
            other = [Variant("nop5", NOP5)]
            jmp = _rel32(0xE9, a, site.target)
            if jmp:
                other.append(Variant(f"jmp {site.target:#x}", jmp))
        else:
            return NoVariants(f"jump-label site of length {len(raw)}")
        return [Variant("on disk", raw)] + [v for v in other if v.raw != raw]

    def _smp_lock(self, site, a, raw):
        if site.address != a or raw[:1] != b"\xf0":
            return [Variant("on disk", raw)]
        return [Variant("lock (SMP, on disk)", raw), Variant("ds (UP)", b"\x3e" + raw[1:])]

    def _paravirt(self, site, a, raw):
        return NoVariants("apply_paravirt() patches this call with a native template or a direct call chosen "
                          "at boot; those bytes are not in the image, so no verdict covers the live kernel")

    def _alternative(self, site, a, raw):
        if site.target is None or site.target_length is None:
            return NoVariants("alternative without its replacement")
        repl = self.image.read(site.target, site.target_length) if site.target_length else b""
        patched = self._patched_replacement(site, repl)
        off = a - site.address
        # instruction boundaries of the replacement as it runs at the site
        pos, at_a = 0, None
        while pos < len(patched):
            n = _insn_len(patched[pos:], site.address + pos)
            if n == 0:
                return NoVariants("the replacement does not decode")
            if pos == off:
                at_a = patched[pos:pos + n]
            pos += n
        if at_a is None:
            if off >= len(patched):
                return NoVariants("in the NOP padding after an alternative's replacement; optimize_nops() "
                                  "chooses its instruction boundaries at boot")
            return NoVariants("not an instruction boundary of the alternative's replacement")
        return [Variant("original (on disk)", raw), Variant(f"replacement (cpuid {site.tag:#x})", at_a)]

    def _patched_replacement(self, site: Site, repl: bytes) -> bytes:
        """The replacement as apply_alternatives() leaves it at the site: a first
        call/jmp re-targeted to keep its absolute target (6.1: the 0xe8 fixup
        and recompute_jump)."""
        if len(repl) >= 5 and repl[0] in (0xE8, 0xE9):
            target = (site.target + 5 + struct.unpack("<i", repl[1:5])[0]) & MASK64
            fixed = _rel32(repl[0], site.address, target)
            if fixed is not None:
                return fixed + repl[5:]
        if len(repl) >= 2 and repl[0] == 0xEB:
            target = (site.target + 2 + struct.unpack("<b", repl[1:2])[0]) & MASK64
            fixed = _rel32(0xE9, site.address, target)
            if fixed is not None and len(repl) <= 5:
                return fixed
        return repl

    def replacement_instructions(self, site: Site) -> list[tuple[int, bytes]] | NoVariants:
        """Every instruction of an alternative's replacement, at its live address."""
        if site.target is None or not site.target_length:
            return []
        patched = self._patched_replacement(site, self.image.read(site.target, site.target_length))
        out, pos = [], 0
        while pos < len(patched):
            n = _insn_len(patched[pos:], site.address + pos)
            if n == 0:
                return NoVariants("the replacement does not decode")
            out.append((site.address + pos, patched[pos:pos + n]))
            pos += n
        return out
