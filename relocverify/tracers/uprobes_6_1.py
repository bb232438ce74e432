"""uprobes as of Linux 6.1 (Debian's linux-source-6.1, 6.1.192: arch/x86/kernel/uprobes.c)."""

from .uprobes import Uprobes, UprobesSource

MODEL = Uprobes(UprobesSource("6.1", "6.1", "linux-source-6.1 (6.1.192) arch/x86/kernel/uprobes.c"))
