"""Versions of kprobes and kinst from before a fix, for the history of corpora/known_bugs.toml.

Each is the current model with the one decision the fix changed set back, citing the fix.
They are reconstructions from the fix commits (the code before the fix is the code after it
with the change undone), not models read from a released tarball."""

from __future__ import annotations

from dataclasses import replace

from .kinst import KINST, Kinst, KinstSource
from .kprobes import CORE, TEXT_PATCHING, Kprobes
from .kprobes_6_1 import SOURCE as K61

#: kprobes before 8924779df820 'x86/kprobes: Fix JNG/JNLE emulation' (v6.0): jle/jg tested ZF && SF!=OF.
KPROBES_5_19 = Kprobes(replace(
    K61, version="5.19", jle_or=False,
    jle_cite=f"{TEXT_PATCHING} int3_emulate_jcc before 8924779df820: match = match && (regs->flags & X86_EFLAGS_ZF)",
    source="kprobes 6.1 with 8924779df820 undone (known_bugs.toml bug1)"))

#: kprobes built with -funsigned-char (6.2 on) while prepare_emulation still read *(char *)immediate.bytes.
KPROBES_6_2 = Kprobes(replace(
    K61, version="6.2", rel8_signed=False,
    rel8_cite=f"{CORE} prepare_emulation: p->ainsn.rel32 = *(char *)insn->immediate.bytes, char unsigned "
              f"since 'kbuild: treat char as always unsigned' (6.2)",
    source="kprobes 6.1 under -funsigned-char (known_bugs.toml bug2)"))

#: kprobes before the 6.7 / stable 6.6.11 fix of kprobe_emulate_call_indirect: pushed ip - 1 + CALL_INSN_SIZE.
KPROBES_6_6 = Kprobes(replace(
    K61, version="6.6", call_indirect_len=False,
    call_indirect_cite=f"{CORE} kprobe_emulate_call_indirect before the stable 6.6.11 fix: "
                       f"int3_emulate_call(regs, ...) pushes regs->ip - INT3_INSN_SIZE + CALL_INSN_SIZE",
    source="kprobes 6.1 with the call-indirect fix undone (known_bugs.toml bug3)"))

#: kinst before calls were emulated (the 2022 review, known_bugs.toml bug9): e8 re-aimed and copied.
KINST_2022 = Kinst(KinstSource("2022", "kinst_isa.c with call emulation undone (known_bugs.toml bug9)",
                               emulate_calls=False,
                               calls_cite=f"{KINST} kinst_instr_dissect before call emulation: e8 copied, "
                                          f"rel32 re-aimed"))

HISTORY = {m.name: m for m in (KPROBES_5_19, KPROBES_6_2, KPROBES_6_6, KINST_2022)}
