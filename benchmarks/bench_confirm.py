"""Benchmark: the boot-probe-trigger cycle of ``relocverify confirm`` (goal: <= 20 s under TCG).

    python benchmarks/bench_confirm.py [--package debian-6.1-cloud] [--site dcache_readdir+0x82]
                                       [--repeat 3] [--accel tcg]

Measures, each the median of ``--repeat`` runs (wall time, the guest already built and cached):

  cycle     one ``relocverify confirm`` of one site: a process that resolves the site and boots the guest
            twice at once (without and with the probe), the syscalls trigger in each
  one boot  a single boot with the probe alone (nothing beside it), split by the guest's own uptime at
            each phase: kernel up (/init starts), probe placed, trigger done, powered off

and the load average at the start, since the 2-core machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def cycle(args) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "relocverify", "confirm", "--package", args.package, "--tracer", "kprobes",
           "--site", args.site, "--accel", args.accel, "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-400:]}")
    return wall, json.loads(proc.stdout)[0]


def one_boot(args) -> tuple[float, dict]:
    from relocverify.confirm import initramfs, qemu
    from relocverify.confirm.console import read_console
    from relocverify.confirm.confirmation import BASE_CMDLINE
    from relocverify.confirm.guest import build_guest, run_initrd, scratch
    from relocverify.confirm.probe import Probe
    from relocverify.confirm.script import RunPlan, run_script
    from relocverify.confirm.sites import resolve_kernel_site

    guest = build_guest(args.package)
    site = resolve_kernel_site(args.site, guest.vmlinux, guest.system_map)
    plan = RunPlan((Probe("kprobes", site.probe_target),), ("/rv/bin/syscalls", "all", "3"), 20,
                   ((site.address, len(site.file_bytes)),))
    with scratch() as work:
        initrd = run_initrd(guest, [initramfs.file("rv/run.sh", run_script(plan).encode())], work)
        boot = qemu.boot(guest.kernel, initrd, BASE_CMDLINE, args.accel, 120.0)
    return boot.seconds, dict(read_console(boot.console).times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--package", default="debian-6.1-cloud")
    p.add_argument("--site", default="dcache_readdir+0x82")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--accel", default="tcg", choices=("tcg", "kvm"))
    args = p.parse_args()
    print(f"load average at the start: {os.getloadavg()[0]:.2f} (2 cores)")
    cycle(args)  # the guest built and the index warm
    cycles = [cycle(args) for _ in range(args.repeat)]
    walls = [w for w, _ in cycles]
    print(f"cycle (confirm, two boots at once): median {statistics.median(walls):.1f} s "
          f"({', '.join(f'{w:.1f}' for w in walls)}); outcome {cycles[-1][1]['outcome']}, "
          f"boots {cycles[-1][1]['boot_seconds']}")
    boots = [one_boot(args) for _ in range(args.repeat)]
    seconds = [s for s, _ in boots]
    phases = {k: statistics.median(t[k] for _, t in boots if k in t) for k in ("begin", "probe", "trigger", "after",
                                                                              "end")}
    print(f"one boot alone: median {statistics.median(seconds):.1f} s ({', '.join(f'{s:.1f}' for s in seconds)}); "
          f"guest uptime at begin {phases['begin']:.2f} s, probe {phases['probe']:.2f}, trigger "
          f"{phases['trigger']:.2f}, after {phases['after']:.2f}, end {phases['end']:.2f}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
