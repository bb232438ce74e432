// SPDX-License-Identifier: GPL-2.0
/*
 * rvkprobe: a kprobe placed by register_kprobe() (relocverify confirm --via module), for sites
 * kprobe_events refuses (functions the kernel marks notrace, asm among them: Debian's config
 * lacks KPROBE_EVENTS_ON_NOTRACE).  Built against the package's own linux-headers.
 *
 *   insmod rvkprobe.ko symbol=NAME offset=N     register a kprobe at NAME+N (a module's symbols too)
 *   /sys/module/rvkprobe/parameters/hits        times the pre-handler ran
 *   /sys/module/rvkprobe/parameters/missed      the kprobe's nmissed
 *   /sys/module/rvkprobe/parameters/error       register_kprobe's errno (positive), 0 when placed
 *
 * A refusal loads the module anyway (init returns 0) so that error is readable; it says
 * "RVC:module refused -ERRNO" on the console.
 */
#include <linux/kprobes.h>
#include <linux/module.h>

static char *symbol = "";
static unsigned long offset;
static unsigned long hits;
static unsigned long missed;
static int error;
module_param(symbol, charp, 0444);
module_param(offset, ulong, 0444);
module_param(hits, ulong, 0444);
module_param(missed, ulong, 0444);
module_param(error, int, 0444);

static int pre(struct kprobe *p, struct pt_regs *regs)
{
	hits++;
	missed = p->nmissed;
	return 0;
}

static struct kprobe probe = { .pre_handler = pre };
static bool placed;

static int __init rvkprobe_init(void)
{
	int ret;

	probe.symbol_name = symbol;
	probe.offset = offset;
	ret = register_kprobe(&probe);
	if (ret < 0) {
		error = -ret;
		pr_info("RVC:module refused %d at %s+%#lx\n", ret, symbol, offset);
		return 0;
	}
	placed = true;
	pr_info("RVC:module placed %s+%#lx at %px\n", symbol, offset, probe.addr);
	return 0;
}

static void __exit rvkprobe_exit(void)
{
	if (placed)
		unregister_kprobe(&probe);
}

module_init(rvkprobe_init);
module_exit(rvkprobe_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("relocverify confirm: one kprobe by register_kprobe");
