"""uprobes as of Linux 6.12 (Debian's linux-source-6.12: arch/x86/kernel/uprobes.c).  Its instruction
decisions are 6.1's (the file changed in the uretprobe syscall trampoline and shadow stacks); the kernel
decoder it decodes with is 6.12's."""

from .uprobes import Uprobes, UprobesSource

MODEL = Uprobes(UprobesSource("6.12", "6.12", "linux-source-6.12 arch/x86/kernel/uprobes.c"))
