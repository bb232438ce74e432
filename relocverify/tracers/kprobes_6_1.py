"""kprobes as of Linux 6.1 (Debian's linux-source-6.1, 6.1.192: arch/x86/kernel/kprobes/core.c)."""

from .kprobes import CORE, TEXT_PATCHING, Kprobes, KprobesSource

SOURCE = KprobesSource(
    version="6.1",
    decoder="6.1",
    source="linux-source-6.1 (6.1.192) arch/x86/kernel/kprobes/core.c, kernel/kprobes.c, asm/text-patching.h",
    rel8_signed=True,
    rel8_cite=f"{CORE} prepare_emulation: p->ainsn.rel32 = *(char *)insn->immediate.bytes (6.1 builds with a "
              f"signed char on x86; -funsigned-char came in 6.2)",
    jle_or=True,
    jle_cite=f"{TEXT_PATCHING} int3_emulate_jcc: if (cc >= 0xe) match = match || (regs->flags & X86_EFLAGS_ZF)",
    call_indirect_len=True,
    call_indirect_cite=f"{CORE} kprobe_emulate_call_indirect: int3_emulate_push(regs, regs->ip - INT3_INSN_SIZE "
                       f"+ p->ainsn.size) (the stable backport of the 6.7 fix)",
    refuse_exception_insns=False,
    exception_cite=f"{CORE} can_probe (6.1 has no is_exception_insn)",
)

MODEL = Kprobes(SOURCE)
