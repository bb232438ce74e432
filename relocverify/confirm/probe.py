"""A tracer's probe as the guest places it: the shell lines that place, enable and report it.

Three ways, each the real tracer's own interface:

* ``kprobe_events``: ``p:rv/site FUNCTION+OFF`` (or the address, for a name several functions
  share) written to ``/sys/kernel/tracing/kprobe_events``, enabled through its event; the kernel's
  refusal is the write's errno and the line it adds to ``error_log``.  Whether the kprobe is
  optimized (a jump rather than an int3) is set first through ``/proc/sys/debug/kprobes-optimization``
  and read back from ``/sys/kernel/debug/kprobes/list`` (``[OPTIMIZED]``).  The hits are the
  event's line of ``kprobe_profile``.  Debian's 6.1 config lacks ``KPROBE_EVENTS_ON_NOTRACE``, so
  this refuses functions the kernel marks notrace (asm functions among them): those need
* a module's ``register_kprobe`` (``programs/rvkprobe.c``, built against the package's headers):
  the same kprobe, without the tracing layer's check; its hits are the module's ``hits`` parameter;
* ``uprobe_events``: ``p:rv/site /rv/bin/PROGRAM:0xOFFSET`` (the instruction's file offset) for a
  uprobe in a user program of the guest; hits from ``uprobe_profile``.

Every line the guest reports starts ``RVC:`` (``console.py`` reads them).
"""

from __future__ import annotations

from dataclasses import dataclass

TRACING = "/sys/kernel/tracing"
RVCTL = "/rv/bin/rvctl"
OPTIMIZATION = "/proc/sys/debug/kprobes-optimization"
KPROBE_LIST = "/sys/kernel/debug/kprobes/list"
VIAS = ("events", "module")


@dataclass(frozen=True)
class Probe:
    tracer: str  # 'kprobes' | 'uprobes'
    target: str  # kprobes: FUNCTION+0xOFF or 0xADDRESS; uprobes: /rv/bin/PROGRAM:0xOFFSET
    optimized: bool = False  # kprobes: debug.kprobes-optimization
    via: str = "events"  # kprobes: 'events' (kprobe_events) | 'module' (register_kprobe)
    event: str = "site"  # the event's name in group rv (several probes in one boot: site0, site1, ...)

    @property
    def events_file(self) -> str:
        return f"{TRACING}/{'uprobe_events' if self.tracer == 'uprobes' else 'kprobe_events'}"

    @property
    def placement_file(self) -> str:
        """The file whose write places the probe: its errno is the tracer's refusal."""
        return self.events_file if self.via == "events" else "/proc/rv-module"

    def place(self) -> list[str]:
        """Shell lines: place the probe and enable it; what they report is labelled with the event."""
        lines = [f"echo 'RVC:probe {self.event}'"]
        if self.via == "module":
            symbol, _, offset = self.target.partition("+")
            lines += [f"insmod /rv/modules/rvkprobe.ko symbol={symbol} offset={int(offset or '0', 0)} || "
                      f"echo 'RVC:note insmod rvkprobe.ko failed'",
                      "e=$(cat /sys/module/rvkprobe/parameters/error 2>/dev/null || echo 1)",
                      "if [ \"$e\" = 0 ]; then echo 'RVC:write /proc/rv-module 0'; "
                      "else echo \"RVC:write /proc/rv-module $e -: register_kprobe refused\"; fi"]
        else:
            lines.append(f"{RVCTL} write {self.events_file} 'p:rv/{self.event} {self.target}'")
            lines.append(_each_line(f"{TRACING}/error_log", "errlog"))
            lines.append(f": > {TRACING}/error_log")  # cleared: the next probe's refusal is its own
            lines.append(f"{RVCTL} write {TRACING}/events/rv/{self.event}/enable 1")
        return lines

    def report(self) -> str:
        """A shell line: the probe's hit count after the trigger (one line serves every probe of a file)."""
        if self.via == "module":
            return (f"echo \"RVC:profile {self.event} $(cat /sys/module/rvkprobe/parameters/hits) "
                    f"$(cat /sys/module/rvkprobe/parameters/missed)\"")
        profile = "uprobe_profile" if self.tracer == "uprobes" else "kprobe_profile"
        return _each_line(f"{TRACING}/{profile}", "profile")


def place_all(probes: tuple[Probe, ...]) -> list[str]:
    """Shell lines placing every probe: kprobes' optimization set first, and after them the optimizer's
    delayed work (OPTIMIZE_DELAY) let run before ``kprobes/list`` is read."""
    kprobes = [p for p in probes if p.tracer == "kprobes"]
    lines = [f"{RVCTL} write {OPTIMIZATION} {1 if kprobes[0].optimized else 0}"] if kprobes else []
    for probe in probes:
        lines += probe.place()
    if kprobes:
        lines += ["sleep 0.3", _each_line(KPROBE_LIST, "list")]
    return lines


def report_all(probes: tuple[Probe, ...]) -> list[str]:
    return list(dict.fromkeys(p.report() for p in probes))


def hits(profile: tuple[str, ...], tracer: str, event: str = "site") -> tuple[int | None, int | None]:
    """(hits, misses) from the probe's profile line: ``EVENT HITS MISSES`` (kprobe_profile, the module),
    ``FILE EVENT HITS`` (uprobe_profile); (None, None) when the line is not there."""
    for line in profile:
        words = line.split()
        if tracer == "uprobes" and len(words) >= 3 and words[1] == event and words[2].isdigit():
            return int(words[2]), None
        if len(words) >= 3 and words[0] == event and words[1].isdigit() and words[2].isdigit():
            return int(words[1]), int(words[2])
    return None, None


def optimized(listing: tuple[str, ...], address: int | None = None) -> bool | None:
    """Whether ``kprobes/list`` shows the probe at ``address`` (None: any probe) optimized; None when it lists
    no such probe.  A line reads ``ffffffff81381a42  k  dcache_readdir+0x82  [OPTIMIZED]`` (its name is
    kallsyms' nearest symbol, a local label in asm: the address is what identifies it)."""
    probes = [line for line in listing
              if line.split() and (address is None or line.split()[0] == f"{address:016x}")]
    if not probes:
        return None
    return any("[OPTIMIZED]" in line for line in probes)


def _each_line(path: str, kind: str) -> str:
    return f"while read -r l; do echo \"RVC:{kind} $l\"; done < {path}"
