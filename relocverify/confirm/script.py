"""The guest's scripts: ``/init`` (in the cached guest) and ``/rv/run.sh`` (one per boot).

``/init`` mounts proc, sys, devtmpfs, debugfs and tracefs, raises the console log level to 8 (so
an oops prints whole on the serial console under ``quiet``), reports the uptime, runs
``/rv/run.sh`` and powers off.  ``run_script(plan)`` writes ``/rv/run.sh`` for one boot, in phases
the console reader follows (``console.PHASES``):

  begin    modules loaded, the site's live bytes read from /proc/kcore (before any probe; a module's
           site at its function's address in /proc/kallsyms)
  probe    the probes placed and enabled (``probe.place_all``), the live bytes read again
  trigger  the trigger run by ``rvctl run`` with its time limit
  after    the probe's hit count

A boot without a probe runs the same phases with an empty ``probe`` phase, so both boots run the
trigger in the same state.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from .probe import RVCTL, Probe, place_all, report_all

INIT = """#!/bin/busybox sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t debugfs debugfs /sys/kernel/debug
mount -t tracefs tracefs /sys/kernel/tracing
dmesg -n 8
echo "RVC:up $(cat /proc/uptime)"
[ -f /rv/run.sh ] && sh /rv/run.sh
echo "RVC:phase end $(cat /proc/uptime)"
poweroff -f
"""


@dataclass(frozen=True)
class RunPlan:
    """What one boot does."""

    probes: tuple[Probe, ...]  # () for the boot without a probe
    trigger: tuple[str, ...]  # the guest path of the program, then its arguments
    trigger_timeout_s: int
    live: tuple[tuple[int | str, int], ...] = ()  # (kernel address or SYMBOL+OFF, length) read from /proc/kcore
    modules: tuple[str, ...] = ()  # /rv/modules/NAME.ko loaded first, in this order


def run_script(plan: RunPlan) -> str:
    lines = [_phase("begin")]
    for name in plan.modules:
        lines.append(f"insmod /rv/modules/{name}.ko && echo 'RVC:module loaded {name}' || "
                     f"echo 'RVC:module failed {name}'")
    lines += _peeks(plan)
    lines.append(_phase("probe"))
    if plan.probes:
        lines += place_all(plan.probes)
        lines += _peeks(plan)
    lines.append(_phase("trigger"))
    lines.append(f"{RVCTL} run {plan.trigger_timeout_s} {' '.join(shlex.quote(a) for a in plan.trigger)}")
    lines.append(_phase("after"))
    lines += report_all(plan.probes)
    return "\n".join(lines) + "\n"


def _phase(name: str) -> str:
    """A phase marker with the guest's uptime (seconds since boot, then idle seconds)."""
    return f'echo "RVC:phase {name} $(cat /proc/uptime)"'


def _peeks(plan: RunPlan) -> list[str]:
    out = []
    for where, length in plan.live:
        if isinstance(where, int):
            out.append(f"{RVCTL} peek {where:#x} {length}")
        else:
            symbol, _, offset = where.partition("+")
            out.append(f"{RVCTL} peeksym {symbol} {offset or 0} {length}")
    return out
