"""Every disagreement involving the kernel's own decoder (``linux-insn@``), classified.

A row of ``CLASSES`` says what a difference between ``insn_decode`` and the
capstone/iced-x86 consensus is: a documented defect of capstone or iced-x86
(the kernel is right), a limitation of the kernel's decoder that its own
sources state (the opcode map, ``inat.h``, ``insn.c``), or a finding; and
what a kprobe or optprobe placed on such an instruction would do.  The
first row that matches a ``compare.Finding`` (with the kernel's full answer,
``linux_insn.Decoded``) is its class; one no row matches is ``UNCLASSIFIED``.

``MEASURED`` keeps what the whole-kernel runs found (``docs/gate.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import iced_x86

from ..x86.decoders.linux_insn import MAX_INSN, Decoded, OpcodeMap
from .compare import Finding

KNOWN_BUG, LIMITATION, FINDING = "known-decoder-bug", "linux-insn-limitation", "finding"


@dataclass(frozen=True)
class LinuxInsnClass:
    name: str
    kind: str  # KNOWN_BUG, LIMITATION or FINDING
    matches: Callable[[Finding, Decoded | None, OpcodeMap | None], bool]
    reason: str  # why, with the source that says so
    kprobe: str  # what a probe on such an instruction does


def _others(f: Finding):
    return [a for name, a in f.answers if name != f.tested]


def _explained(f: Finding, d, m) -> bool:
    return f.explained


def _capstone_cannot(f: Finding, d, m) -> bool:
    """capstone alone cannot decode it; iced-x86 and the kernel give the same answer."""
    table = dict(f.answers)
    return (not table.get("capstone", f.answer(f.tested)).ok and table.get("iced") == f.answer(f.tested)
            and f.answer(f.tested).ok)


def _i64(f: Finding, d: Decoded | None, m: OpcodeMap | None) -> bool:
    if d is None or m is None or not d.ok or d.vex or d.rex == 2 or len(d.opcode) != 1:
        return False
    line = m.entries.get((m.tables.get(0, "one byte opcode"), f"{d.opcode[0]:02x}"), "")
    return "(i64)" in line.split("|")[0] and not any(a.ok for a in _others(f))


def _no_map_line(f: Finding, d: Decoded | None, m: OpcodeMap | None) -> bool:
    """Decoded, though the opcode (or its group's ModRM.reg row) has no line in the map."""
    if d is None or not d.ok or d.vex or m is None:
        return False
    raw = f.raw.ljust(MAX_INSN, b"\x90") if d.padded else f.raw
    return any(not m.entries.get(key) for key in m.keys(d, raw))  # none, or an empty line ('19:')


def _ud0(f: Finding, d: Decoded | None, m) -> bool:
    """0f ff, which the map lists as 'ff: UD0' with no operand (no ModRM)."""
    return d is not None and d.ok and d.opcode == b"\x0f\xff" and not d.vex


_LEGACY = frozenset(b"\xf0\xf2\xf3\x2e\x36\x3e\x26\x64\x65\x66\x67")


def _iced_decodes(f: Finding) -> bool:
    iced = dict(f.answers).get("iced")
    return iced is not None and iced.ok


def _rex_not_last(f: Finding, d, m) -> bool:
    """A REX byte followed by another prefix (legacy or REX), in an instruction iced-x86 decodes: the CPU
    ignores that REX, insn.c takes the next prefix byte as the opcode."""
    run = _prefix_run(f.raw)
    return _iced_decodes(f) and any(0x40 <= b <= 0x4F for b in run[:-1])


def _prefix_run(raw: bytes) -> bytes:
    """The leading legacy and REX prefix bytes."""
    n = 0
    while n < len(raw) and (raw[n] in _LEGACY or 0x40 <= raw[n] <= 0x4F):
        n += 1
    return raw[:n]


def _mandatory_prefixes(raw: bytes) -> tuple[int | None, int | None]:
    """(the prefix the kernel picks the variant by, the one the CPU does) among 66/F2/F3: the kernel takes
    the last legacy prefix (``insn_last_prefix_id``), the CPU the last F2/F3 before any 66 (SDM Vol. 2 2.1)."""
    legacy = bytes(b for b in _prefix_run(raw) if b in _LEGACY)
    kernel = legacy[-1] if legacy and legacy[-1] in b"\x66\xf2\xf3" else None
    reps = [b for b in legacy if b in b"\xf2\xf3"]
    return kernel, reps[-1] if reps else (0x66 if 0x66 in legacy else None)


def _mandatory_not_last(f: Finding, d, m) -> bool:
    """The kernel's variant prefix is not the CPU's, in an instruction iced-x86 decodes: a 66/F2/F3 followed
    by another prefix, or F2/F3 then 66 (the CPU takes F2/F3, the map's 'last prefix' 66)."""
    kernel, cpu = _mandatory_prefixes(f.raw)
    return _iced_decodes(f) and kernel != cpu


_VARIANT_TAG = {0x66: "(66", 0xF2: "(F2", 0xF3: "(F3"}


def _unlisted_variant(f: Finding, d: Decoded | None, m: OpcodeMap | None) -> bool:
    """The last prefix is a 66/F2/F3 the opcode's line lists no form for, and the CPU decodes it (ignoring
    that prefix): inat_get_escape_attribute returns 0 for a variant table without the opcode."""
    if d is None or not d.ok or d.vex or m is None or not _iced_decodes(f) or d.attr != 0:
        return False
    kernel, _ = _mandatory_prefixes(f.raw)
    raw = f.raw.ljust(MAX_INSN, b"\x90") if d.padded else f.raw
    lines = [m.entries.get(k) for k in m.keys(d, raw)]
    return kernel is not None and bool(lines) and all(lines) and not any(_VARIANT_TAG[kernel] in x for x in lines)


def _mov_cr_dr(f: Finding, d: Decoded | None, m) -> bool:
    """mov to/from CR or DR (0f 20-23) with ModRM.mod != 11, which the CPU reads as 11 (iced-x86 decodes it)."""
    return (d is not None and d.ok and d.opcode[:1] == b"\x0f" and len(d.opcode) == 2 and 0x20 <= d.opcode[1] <= 0x23
            and d.modrm_offset is not None and f.raw[d.modrm_offset] < 0xC0 and _iced_decodes(f))


_AMD_ONLY = frozenset({"XOP", "FMA4", "TBM", "SSE4A", "D3NOW", "D3NOWEXT"})


def _iced(raw: bytes):
    ins = iced_x86.Decoder(64, raw).decode()
    return None if ins.is_invalid else ins


def _amd_only(f: Finding, d, m) -> bool:
    ins = _iced(f.raw)
    if ins is None:
        return False
    names = {v: k for k, v in vars(iced_x86.CpuidFeature).items() if k.isupper()}
    return any(names.get(c) in _AMD_ONLY for c in ins.cpuid_features())


def _is4(f: Finding, d: Decoded | None, m) -> bool:
    """The kernel, as capstone, counts the is4 register byte of a four-operand VEX form as an immediate."""
    mine, table = f.answer(f.tested), dict(f.answers)
    ins = _iced(f.raw)
    iced = table.get("iced")
    return (ins is not None and iced is not None and iced.ok and ins.op_count >= 4
            and ins.encoding in (iced_x86.EncodingKind.VEX, iced_x86.EncodingKind.XOP)
            and mine.ok and mine.imm_size == 1 and mine.imm_offset == mine.length - 1
            and mine._replace(imm_offset=None, imm_size=0) == iced)


def _accepts_invalid(f: Finding, d: Decoded | None, m) -> bool:
    iced = dict(f.answers).get("iced")
    return d is not None and d.ok and (not iced.ok if iced is not None else not any(a.ok for a in _others(f)))


def _newer_than_map(f: Finding, d: Decoded | None, m) -> bool:
    iced = dict(f.answers).get("iced")
    return d is not None and d.ret == -22 and iced is not None and iced.ok


def _same(a, b) -> bool:
    return a == b or (not a.ok and not b.ok)


def _capstone_alone(f: Finding, d, m) -> bool:
    table = dict(f.answers)
    return ("capstone" in table and "iced" in table and _same(table["iced"], f.answer(f.tested))
            and not _same(table["capstone"], table["iced"]))


CLASSES: tuple[LinuxInsnClass, ...] = (
    LinuxInsnClass(
        "capstone-known-bug", KNOWN_BUG, _explained,
        "the kernel agrees with iced-x86, and capstone's answer is a row of x86/decoders/known_bugs.py "
        "(disp_size 2 under 0x66, ud1 without its ModRM, instructions capstone 5 lacks) or its second "
        "immediate of enter/extrq/insertq",
        "none: the kernel's answer, which kprobes uses, is right"),
    LinuxInsnClass(
        "capstone-cannot-decode", KNOWN_BUG, _capstone_cannot,
        "capstone 5 cannot decode it (lkgs, tdcall: newer than capstone 5's tables, the same defect as "
        "known_bugs.py's capstone-missing-insn, whose list does not name them yet); iced-x86 and the kernel agree",
        "none: the kernel's answer is iced-x86's"),
    LinuxInsnClass(
        "rex-before-another-prefix", FINDING, _rex_not_last,
        "insn_get_prefixes reads legacy prefixes, then one REX; a REX followed by a legacy prefix or a second "
        "REX (which the CPU ignores: only a REX right before the opcode counts, SDM Vol. 2 2.2.1) ends its "
        "prefixes there, and the next prefix byte is taken as a one-byte opcode with no operands; the kernel "
        "does not say so",
        "no compiler or assembler emits a REX before another prefix, and none occurs in the kernels measured; "
        "on such hand-made bytes a kprobe would copy too few bytes and run the rest of the instruction out of "
        "the trampoline's following bytes"),
    LinuxInsnClass(
        "i64-decoded-in-64-bit-mode", LIMITATION, _i64,
        "x86-opcode-map.txt marks the opcode (i64), the SDM's 'invalid in 64-bit mode' superscript (Vol. 2, "
        "App. A.2.5), but gen-insn-attr-x86.awk turns (i64) into no attribute, so insn_decode in 64-bit mode "
        "decodes the 32-bit form (ea: 'JMP-far Ap (i64)', 7 bytes) where the CPU raises #UD",
        "in 64-bit kernel text such bytes are 32-bit code or data: the one in debian-6.1-cloud is the far jump "
        "in pvh_start_xen's .code32 part (ljmp $0x8,$0x10008a7), run once at boot in protected mode before "
        "kprobes exist, and the 7 bytes the kernel reads are that instruction's real length; no probe can fire"),
    LinuxInsnClass(
        "amd-only-encoding", LIMITATION, _amd_only,
        "x86-opcode-map.txt is '(mostly) based on' the Intel SDM (its first lines): AMD-only XOP (8f escape), "
        "FMA4, TBM, SSE4a and 3DNow! (whose suffix opcode byte it reads as an immediate) are not in it",
        "AMD-only instructions are not emitted in the x86-64 kernel text measured here (fuzzed inputs only); on "
        "such bytes a kprobe would copy the wrong length"),
    LinuxInsnClass(
        "is4-register-byte", KNOWN_BUG, _is4,
        "a convention, not a defect (known_bugs.py's is4-register-byte): the kernel, as capstone, counts the "
        "is4 register byte of a four-operand VEX form as an 8-bit immediate; iced-x86 counts it as an operand",
        "none: the length is the same and the byte is copied unchanged"),
    LinuxInsnClass(
        "ud0-without-modrm", LIMITATION, _ud0,
        "x86-opcode-map.txt has 'ff: UD0' in the 0f table with no operand, so insn_decode reads 0f ff as two "
        "bytes, AMD's ud0 (APM Vol. 3); Intel's ud0 takes a ModRM (SDM Vol. 2B, UD), as iced-x86 reads it: the "
        "length is the vendor's (plan/policy.py's ud0 row)",
        "none: ud0 raises #UD whatever its length, and kprobes refuses #UD sites it knows (the BUG/WARN "
        "ud2/ud1 sites); none occurs in the kernels measured"),
    LinuxInsnClass(
        "mandatory-prefix-not-last", LIMITATION, _mandatory_not_last,
        "x86-opcode-map.txt picks an opcode's variant by the last legacy prefix ('Last Prefix Superscripts: "
        "(66): the last prefix is 0x66', its header; insn_last_prefix_id in insn.h), the CPU by the last "
        "F2/F3, else 66: a 66/F2/F3 followed by another prefix (66 67 0f 38 39) decodes as the no-prefix "
        "form, F3 66 0f 52 as the 66 form, often no line at all (no ModRM)",
        "GNU as emits 66/F2/F3 after the segment and address-size prefixes, so compiled kernels do not have "
        "this order (none in the kernels measured); on such bytes a kprobe would copy too few bytes"),
    LinuxInsnClass(
        "unlisted-prefix-variant", FINDING, _unlisted_variant,
        "the opcode has a line, but the last prefix is a 66/F2/F3 it lists no form for (f3 0f 47 85 ..: cmova "
        "with a rep prefix the CPU ignores); inat_get_escape_attribute (inat.c) returns 0 for a variant table "
        "without the opcode, so insn_decode reads no ModRM and no displacement; the kernel does not say so",
        "compilers do not put a rep or operand-size prefix before cmov/setcc/hint-nop forms that have no such "
        "variant (none in the kernels and modules measured); on such bytes a kprobe copies too few bytes"),
    LinuxInsnClass(
        "mov-cr-dr-register-only", FINDING, _mov_cr_dr,
        "mov to/from a control or debug register (0f 20-23) takes a register whatever ModRM.mod says (SDM: "
        "'the mod field is ignored'); insn_get_displacement reads a displacement for mod 00/01/10 as for a "
        "memory operand (the map's 'Rd,Cd' operand is not used by the decoder); not said in the kernel",
        "assemblers always emit mod=11 for these (none in the kernels measured); a kprobe on hand-made "
        "mod!=11 bytes would copy a longer instruction than the CPU runs"),
    LinuxInsnClass(
        "no-opcode-map-line", LIMITATION, _no_map_line,
        "inat.h defines no 'invalid' attribute: an opcode (or a group's ModRM.reg row) x86-opcode-map.txt has "
        "no line for is 0 in the tables gen-insn-attr-x86.awk writes, and insn_decode succeeds with no ModRM "
        "and no immediate",
        "a kprobe on such an opcode, were it a real instruction with a ModRM or immediate, would copy too few "
        "bytes; none occurs in the debian-6.1-cloud or debian-6.12-cloud text (fuzzed inputs only)"),
    LinuxInsnClass(
        "newer-than-this-map", LIMITATION, _newer_than_map,
        "insn_decode refuses (-EINVAL) a VEX/EVEX form iced-x86 decodes: the instruction came after this "
        "kernel's x86-opcode-map.txt (the map names the SDM edition it follows in its header, and only what "
        "its lines mark v/ev is accepted with VEX); 6.1's lacks CMPccXADD, AVX-VNNI-INT8/INT16, SHA512, SM3/SM4",
        "none: insn_decode fails, so kprobes refuses the address (can_probe/arch_prepare_kprobe return an "
        "error) rather than copying a wrong length"),
    LinuxInsnClass(
        "accepts-what-the-cpu-rejects", LIMITATION, _accepts_invalid,
        "insn.c rejects only VEX/EVEX misuse (its two 'This instruction is bad' paths in insn_get_opcode and "
        "insn_get_modrm): a LOCK prefix on an instruction that cannot take one, a memory-only operand with "
        "mod=11, a 66/F2/F3/REX before VEX, a reserved VEX.W/L or mandatory-prefix combination decode with a "
        "length where the CPU (and iced-x86) raise #UD",
        "none on compiled code; kprobes' own checks (can_probe's boundary walk, the int3/emulate-prefix "
        "refusals) do not look for such bytes, so a probe on one would copy an instruction that faults as it "
        "would have faulted in place"),
    LinuxInsnClass(
        "capstone-alone-differs", FINDING, _capstone_alone,
        "the kernel and iced-x86 give the same answer and capstone another, outside known_bugs.py (e.g. "
        "66 REX.W push imm: capstone reads imm16, the REX.W makes it imm32): a capstone candidate defect",
        "none: the kernel agrees with iced-x86"),
)

UNCLASSIFIED = LinuxInsnClass(
    "unclassified", FINDING, lambda f, d, m: True,
    "no row explains it: the kernel's answer differs from the consensus; review it",
    "unknown until reviewed: the plan check in the gate's report says whether the relocation breaks")


def classify(finding: Finding, decoded: Decoded | None = None, opcode_map: OpcodeMap | None = None) -> LinuxInsnClass:
    """The first row of ``CLASSES`` matching ``finding``, else ``UNCLASSIFIED``."""
    return next((c for c in CLASSES if c.matches(finding, decoded, opcode_map)), UNCLASSIFIED)


@dataclass(frozen=True)
class Classified:
    """One disagreement of a ``linux-insn@`` gate report: the finding, its class, and what a kprobe on
    those bytes does with the kernel's answer (``kprobe_effect``)."""

    finding: Finding
    klass: LinuxInsnClass
    kprobe: str

    def as_json(self) -> dict:
        f, c = self.finding, self.klass
        return {"unit": f.unit, "address": hex(f.address), "bytes": f.raw.hex(" "), "count": f.count,
                "class": c.name, "kind": c.kind, "failing": f.failing,
                "answers": {name: a.describe(f.address) for name, a in f.answers},
                "kprobe": self.kprobe, "class_kprobe": c.kprobe}


def classify_report(report, adapter) -> list[Classified]:
    """Every finding of a gate report whose tested decoder is ``adapter`` (a ``linux-insn@`` one), classified."""
    raws = [f.raw for f in report.findings]
    details = dict(zip(raws, adapter.decode_detail(raws))) if raws else {}
    table = adapter.opcode_map()
    return [Classified(f, classify(f, details[f.raw], table), kprobe_effect(f, details[f.raw]))
            for f in report.findings]


def kprobe_effect(f: Finding, d: Decoded | None = None) -> str:
    """What a kprobe on these bytes does with the kernel's answer, by the fields kprobes uses: the length
    it copies (``__copy_instruction``), the displacement it re-targets when ``insn_rip_relative``, and the
    immediate of a relative jmp/call/jcc it emulates (``prepare_emulation``); judged against iced-x86's
    answer (the consensus decoder that is not known wrong here)."""
    mine, iced = f.answer(f.tested), dict(f.answers).get("iced")
    if not mine.ok:
        return "no misbehaviour: insn_decode fails, so arch_prepare_kprobe refuses the address (-EINVAL)"
    if iced is None or not iced.ok:
        return (f"no silent misbehaviour: the CPU raises #UD at these bytes (iced-x86 rejects them); kprobes "
                f"copies {mine.length} bytes and the copy faults as the original would")
    if mine.length != iced.length and _raises_ud(f.raw):
        return (f"no silent misbehaviour: the instruction is ud0/ud1/ud2, which raises #UD whether kprobes "
                f"copies {mine.length} bytes or the {iced.length} iced-x86 reads")
    if mine.length != iced.length:
        return (f"misbehaves: kprobes copies {mine.length} bytes of a {iced.length}-byte instruction, so the "
                f"copy runs other code than the original and resumes at the wrong address")
    rip = d is not None and "rip_relative" in d.flags
    if rip and mine.field("disp") != iced.field("disp"):
        return (f"misbehaves: the RIP-relative fixup rewrites bytes {mine.field('disp')} (offset, size) instead "
                f"of the displacement at {iced.field('disp')}")
    if mine.target_delta != iced.target_delta and (mine.target_delta is not None or iced.target_delta is not None):
        return "misbehaves: an emulated relative branch would go to another target"
    return ("no misbehaviour: the length, the RIP-relative displacement and the branch target kprobes uses "
            "are iced-x86's; only fields kprobes does not use differ")


def _raises_ud(raw: bytes) -> bool:
    ins = _iced(raw)
    return ins is not None and ins.mnemonic in (iced_x86.Mnemonic.UD0, iced_x86.Mnemonic.UD1, iced_x86.Mnemonic.UD2)


def counts(classified: list[Classified]) -> dict[str, dict]:
    """class -> its kind, distinct byte strings and instructions (occurrences)."""
    out: dict[str, dict] = {}
    for c in classified:
        row = out.setdefault(c.klass.name, {"kind": c.klass.kind, "distinct": 0, "instructions": 0})
        row["distinct"] += 1
        row["instructions"] += c.finding.count
    return dict(sorted(out.items()))


#: Findings (kind FINDING) printed in full per class; the rest are in ``--json``.
SHOW_FINDINGS = 5


def render(classified: list[Classified]) -> str:
    """Counts per class (distinct / instructions) with its kind, an example per limitation, and the first
    ``SHOW_FINDINGS`` findings of each finding class with every decoder's answer and what a kprobe does."""
    out = ["linux-insn disagreements by class (distinct / instructions):"]
    for name, row in counts(classified).items():
        out.append(f"  {name:<32} {row['distinct']:>7,} / {row['instructions']:>9,}  {row['kind']}")
        if row["kind"] == KNOWN_BUG:
            continue
        mine = [c for c in classified if c.klass.name == name]
        for c in mine[:SHOW_FINDINGS if row["kind"] == FINDING else 1]:
            f = c.finding
            out.append(f"    {'e.g. ' if row['kind'] != FINDING else ''}{f.address:#x} {f.raw.hex(' ')} in {f.unit}: "
                       + "; ".join(f"{n}: {a.describe(f.address)}" for n, a in f.answers))
            if row["kind"] == FINDING:
                out.append(f"      kprobe: {c.kprobe}")
    return "\n".join(out) + "\n"


#: The whole-kernel runs (2026-11-24; ``relocverify gate --decoder linux-insn@V --image VMLINUX --module DIR``,
#: capstone 5.0.6 and iced-x86 1.21.0 as the consensus): class -> (distinct byte strings, instructions).
#: linux-insn@6.1 and @6.12 answer every one of these instructions alike (docs/gate.md, the change report).
_KERNEL_61 = {"capstone-known-bug": (1594, 3229), "i64-decoded-in-64-bit-mode": (1, 1)}
_MODULES_61 = {"capstone-known-bug": (6171, 11158)}
_KERNEL_612 = {"capstone-known-bug": (1740, 7209), "capstone-cannot-decode": (2, 5)}
_MODULES_612 = {"capstone-known-bug": (5226, 11185), "is4-register-byte": (1, 4)}
MEASURED = {
    (image, decoder): counts
    for decoder in ("linux-insn@6.1", "linux-insn@6.12")
    for image, counts in (("debian-6.1-cloud", _KERNEL_61), ("debian-6.1-cloud modules", _MODULES_61),
                          ("debian-6.12-cloud", _KERNEL_612), ("debian-6.12-cloud modules", _MODULES_612))
}
