"""kprobes as of Linux 6.12 (Debian's linux-source-6.12: arch/x86/kernel/kprobes/core.c)."""

from .kprobes import CORE, TEXT_PATCHING, Kprobes, KprobesSource

SOURCE = KprobesSource(
    version="6.12",
    decoder="6.12",
    source="linux-source-6.12 arch/x86/kernel/kprobes/core.c, kernel/kprobes.c, asm/text-patching.h",
    rel8_signed=True,
    rel8_cite=f"{CORE} prepare_emulation: p->ainsn.rel32 = insn->immediate.value (sign-extended by insn_decode)",
    jle_or=True,
    jle_cite=f"{TEXT_PATCHING} int3_emulate_jcc: if (cc >= 0xe) match = match || (regs->flags & X86_EFLAGS_ZF)",
    call_indirect_len=True,
    call_indirect_cite=f"{CORE} kprobe_emulate_call_indirect: int3_emulate_push(regs, regs->ip - INT3_INSN_SIZE "
                       f"+ p->ainsn.size)",
    refuse_exception_insns=True,
    exception_cite=f"{CORE} can_probe: if (is_exception_insn(&insn)) return false",
    boost_groups=True,
)

MODEL = Kprobes(SOURCE)
