"""What placing a tracer's probe at a site did, decided from two boots: one without the probe, one with it.

Outcomes, ordered from the weakest evidence to the strongest (``Outcome``):

  not-executed     the probe was placed and the trigger ran, but the probe was never hit
  not-reproduced   the probe was hit, and the trigger's output, exit and the kernel's log were those
                   of the boot without the probe
  refused          the kernel would not place the probe: its errno and message
  patched-at-boot  the site's live bytes (read from /proc/kcore before any probe) are not the file's:
                   the audit judged bytes that never run here; which boot variant of the model
                   (``kernel.variants``) is live, or that none is
  reproduced       with the probe, the kernel faulted (an oops, a BUG, a panic, a user fault), the
                   guest stopped, or the trigger's exit or output differs

``decide`` is pure: the two consoles read (``console.read_console``), how each boot ended, the
site's bytes in the file and the variants the model allows, in; the outcome with its evidence
(one sentence), the console excerpt that shows it, the hit count and the live bytes, out.  The
boot without the probe must itself have finished with a trigger report (the caller checks that
first: a trigger that hangs or floods the console is the user's input, not a finding).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .console import Console, message
from .probe import Probe, hits as profile_hits, optimized as listed_optimized


class Outcome(enum.IntEnum):
    NOT_EXECUTED = 0
    NOT_REPRODUCED = 1
    REFUSED = 2
    PATCHED_AT_BOOT = 3
    REPRODUCED = 4

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")


@dataclass(frozen=True)
class Site:
    """A probed site: where it is, its bytes in the file, and what the boot-variant model allows there."""

    text: str  # as the user wrote it
    address: int
    where: str  # FUNCTION+0xOFF
    file_bytes: bytes  # the instruction in the file
    variants: tuple[tuple[str, bytes], ...] = ()  # (name, bytes) the model says may be live; () outside sites
    variants_note: str = ""  # why the model names no variants, when it cannot
    probe_target: str = ""  # what the tracer's interface is given
    module: str | None = None  # a module's site: its name (the address is where ``image.module`` lays it out)
    symbol: str = ""  # a module's site: the function the guest looks up in /proc/kallsyms, and the offset
    offset: int = 0
    live_comparable: bool = True  # False: the module loader relocates bytes of this instruction
    init_text: bool = False  # in .init.text: freed after boot, its bytes then the 0xcc poison


@dataclass(frozen=True)
class Run:
    """One boot, as decided on."""

    accel: str
    cmdline: str
    seconds: float  # QEMU's wall time
    ended: str  # qemu.Boot.ended
    console: Console


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    evidence: str
    excerpt: tuple[str, ...]
    hits: int | None
    missed: int | None
    live: bytes | None  # the site's bytes before any probe, as the guest read them (as many as the longest variant)
    live_variant: str | None  # the model's variant the live bytes are, or None
    optimized: bool | None  # what kprobes/list showed


def decide(site: Site, probe: Probe, baseline: Run, probed: Run) -> Decision:
    """See the module doc.  ``probe``: the one placed at ``site`` (of the probes the boot placed)."""
    read = _live(baseline.console, site)  # as many bytes as the longest variant
    variant = _variant(site, read)
    live = None if read is None else read[:len(site.file_bytes)]
    freed = site.init_text and live is not None and set(live) == {0xCC}  # free_initmem's poison, not a patch
    patched = live is not None and live != site.file_bytes and not freed
    hits, missed = profile_hits(probed.console.listed("profile"), probe.tracer, probe.event)
    opt = None
    if probe.tracer == "kprobes":  # a module's site is listed at the address its live bytes were read from
        at = site.address if site.module is None else (probed.console.live_in("begin") or (None, ""))[0]
        opt = listed_optimized(probed.console.listed("list"), at) if at else None

    def made(outcome: Outcome, evidence: str, excerpt: tuple[str, ...] = ()) -> Decision:
        if patched and outcome is not Outcome.PATCHED_AT_BOOT:
            evidence += f"; the live bytes are not the file's ({_patched_words(site, read, variant)})"
        if freed:
            evidence += f"; the site is init text, freed after boot (live {live.hex()}: the poison)"
        return Decision(outcome, evidence, excerpt, hits, missed, read, variant, opt)

    reproduced = divergence(baseline, probed)
    if reproduced is not None:
        return made(Outcome.REPRODUCED, *reproduced)
    refusal = _refusal(probed.console, probe)
    if patched:
        more = f"; the kernel refused the probe: {refusal[0]}" if refusal else ""
        return made(Outcome.PATCHED_AT_BOOT, _patched_words(site, read, variant) + more,
                    refusal[1] if refusal else ())
    if refusal is not None:
        return made(Outcome.REFUSED, *refusal)
    if not hits:
        return made(Outcome.NOT_EXECUTED, "the probe was placed but never hit by the trigger" if hits == 0 else
                    "the probe's hit count is missing from the profile")
    return made(Outcome.NOT_REPRODUCED, f"the probe was hit {hits:,} times; the trigger {probed.console.trigger.describe()} "
                f"with the probe as without it, and the kernel reported no fault")


def divergence(baseline: Run, probed: Run) -> tuple[str, tuple[str, ...]] | None:
    """(evidence, excerpt) when the probes changed what happened (a fault, a stop, other output), else None."""
    con = probed.console
    faults = con.faults_from("probe")
    before = baseline.console.faults_from("probe")
    trigger_words = _trigger_words(baseline.console, con)
    if faults and len(faults) > len(before):
        first = faults[len(before)] if before else faults[0]
        excerpt = con.excerpt(first)
        rip = next((message(line) for line in excerpt if "RIP: 0010:" in line), "")
        what = message(con.lines[first]).strip()
        phase = next((p for p, i in con.faults if i == first), "")
        when = {"probe": "while the probe was placed", "trigger": "while the trigger ran",
                "after": "after the trigger"}.get(phase, "")
        return (f"the kernel reported a fault {when}: '{what}'" + (f" at {rip.split('RIP: 0010:')[1]}" if rip else "")
                + (f"; {trigger_words}" if trigger_words else ""), excerpt)
    if not con.reached("end"):
        stopped = {"timeout": "stopped responding (the boot's time limit passed)",
                   "flood": "flooded the console"}.get(probed.ended, "ended before finishing its script")
        return (f"with the probe placed, the guest {stopped} (without the probe it finished)",
                tuple(con.lines[-30:]))
    if trigger_words:
        return trigger_words, _output_pairs(baseline.console, con)
    return None


def _output_pairs(baseline: Console, probed: Console, most: int = 8) -> tuple[str, ...]:
    """The trigger's first differing output lines, each without and with the probe."""
    if baseline.trigger is None or probed.trigger is None:
        return ()
    base, mine = baseline.trigger.output, probed.trigger.output
    out = []
    for k in range(max(len(base), len(mine))):
        b = base[k] if k < len(base) else "(no line)"
        m = mine[k] if k < len(mine) else "(no line)"
        if b != m and len(out) < 2 * most:
            out += [f"without the probe: {b}", f"with the probe:    {m}"]
    return tuple(out)


def _trigger_words(baseline: Console, probed: Console) -> str:
    """What differs in the trigger's report, or ''."""
    base, mine = baseline.trigger, probed.trigger
    if base is None:
        return ""
    if mine is None:
        return "the trigger's report is missing with the probe placed"
    if mine.same_as(base):
        return ""
    line = next((f"first differing line: '{b}' without the probe, '{m}' with it"
                 for b, m in zip(base.output, mine.output) if b != m), "")
    return f"with the probe the trigger {mine.describe()}, without it the trigger {base.describe()}" + \
        (f"; {line}" if line else "")


def _refusal(con: Console, probe: Probe) -> tuple[str, tuple[str, ...]] | None:
    write = next((w for phase, w in con.writes if phase == "probe" and w.file == probe.placement_file
                  and w.probe == probe.event), None)
    if write is None or write.errno == 0:
        return None
    log = con.listed("errlog", probe.event)
    said = next((message(line).strip() for line in log if "error:" in line), "")
    return (f"{write.name or 'errno ' + str(write.errno)} ({write.message})" + (f": {said}" if said else ""), log)


def _live(con: Console, site: Site) -> bytes | None:
    if not site.live_comparable:
        return None
    if site.module is None:
        found = con.live_at("begin", site.address)
    else:  # at the address the module loader chose: the one site of its boot
        found = (con.live_in("begin") or (0, None))[1]
    if found is None:
        return None
    try:
        return bytes.fromhex(found)
    except ValueError:
        return None


def _variant(site: Site, live: bytes | None) -> str | None:
    """The model's variant the live bytes start with (an instruction longer than the file's: stac where the
    file has a one-byte nop), the one on disk first."""
    if live is None:
        return None
    for name, raw in site.variants:
        if live[:len(raw)] == raw:
            return name
    return None


def _patched_words(site: Site, live: bytes | None, variant: str | None) -> str:
    said = f"live {live.hex()} where the file has {site.file_bytes.hex()}"
    if variant is not None:
        return f"{said}: the model's variant '{variant}'"
    if site.variants:
        return f"{said}: none of the model's variants ({', '.join(n for n, _ in site.variants)}) predicts them"
    return f"{said}: the model names no boot variant here ({site.variants_note or 'not a patch site it knows'})"
