// SPDX-License-Identifier: GPL-2.0
/*
 * rvtest: a test module whose code is the trigger (relocverify confirm, triggers.py row "lret"), for
 * audit classes no kernel path reaches after boot.  Built against the package's own headers.
 *
 * rv_far_return does what startup_64 does to reload CS: a far return to the next instruction,
 *
 *   +0x0  lea 1f(%rip), %rax
 *   +0x7  pushq $__KERNEL_CS
 *   +0x9  pushq %rax          optprobes: the jump written here covers +0x9..+0xd, and the copied
 *   +0xa  lretq                lretq returns to +0xc, into that jump's displacement
 *   +0xc  1: nop x5            kprobes at +0xa: lretq emulated as a near ret leaves CS on the stack
 *   +0x11 ret (the return thunk)
 *
 * Reading /proc/rv-test calls it 1,000 times and prints "far returns: 1000".
 */
#include <linux/linkage.h>
#include <linux/module.h>
#include <linux/proc_fs.h>
#include <linux/seq_file.h>
#include <linux/stringify.h>
#include <asm/segment.h>

void rv_far_return(void);

asm(".pushsection .text, \"ax\"\n"
    ".globl rv_far_return\n"
    ".type rv_far_return, @function\n"
    "rv_far_return:\n"
    "  lea 1f(%rip), %rax\n"
    "  pushq $" __stringify(__KERNEL_CS) "\n"
    "  pushq %rax\n"
    "  lretq\n"
    "1: nop\n  nop\n  nop\n  nop\n  nop\n"
    "  " ASM_RET
    ".size rv_far_return, .-rv_far_return\n"
    ".popsection\n");

static int rv_show(struct seq_file *m, void *v)
{
	int i;

	for (i = 0; i < 1000; i++)
		rv_far_return();
	seq_printf(m, "far returns: %d\n", i);
	return 0;
}

static struct proc_dir_entry *entry;

static int __init rvtest_init(void)
{
	entry = proc_create_single("rv-test", 0444, NULL, rv_show);
	return entry ? 0 : -ENOMEM;
}

static void __exit rvtest_exit(void)
{
	proc_remove(entry);
}

module_init(rvtest_init);
module_exit(rvtest_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("relocverify confirm: code for classes no kernel path reaches after boot");
