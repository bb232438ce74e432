"""Confirmations: a tracer's probe placed at a site of the running kernel, and what it did.

``confirm(request, guest)`` resolves every site (``sites.py``), chooses the accelerator once
(``qemu.accel``: KVM only where a short boot ran a kernel-mode int3 under it), and per site boots
the guest twice at once: without the probe and with it (``qemu.boot_all``), each running the same
script (``script.RunPlan``) and trigger.  The boot without the probe is checked first: one that did
not boot, a trigger that did not finish or that floods the console, a trigger that cannot run,
is the user's input (``InputError``, exit 2), never a finding.  Then ``outcome.decide`` says what
the probe did.  Both QEMUs are gone when ``confirm`` returns or raises.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace

from ..errors import InputError
from . import initramfs, qemu
from .console import read_console, shows_fault
from .guest import PROGRAM_DIR, Guest, confirm_cache, is_static, module_depends, module_name, run_initrd, scratch
from .kbuild import build_module
from .outcome import Decision, Outcome, Run, Site, decide, divergence
from .prediction import optprobes_predictions
from .probe import Probe, hits
from .script import RunPlan, run_script
from .triggers import BY_NAME, TRIGGERS, Trigger, for_group

#: Every boot's command line; the user's words (``--cmdline``) follow.
BASE_CMDLINE = "console=ttyS0 panic=-1 quiet nokaslr"
TRACERS = ("kprobes", "optprobes", "uprobes")


@dataclass(frozen=True)
class Request:
    tracer: str  # kprobes | optprobes | uprobes
    sites: tuple[str, ...]
    cmdline: str = ""
    trigger: tuple[str, ...] = ()  # () the shipped trigger; NAME [ARGS] a shipped one; PROGRAM [ARGS]
    elf: str | None = None  # uprobes: the static program holding the sites (default: the shipped trigger's)
    optimized: bool | None = None  # None: off for kprobes, on for optprobes
    via: str = "events"
    trigger_timeout_s: int = 20
    boot_timeout_s: float = 90.0
    accel: str = "auto"
    causes: tuple[str | None, ...] = ()  # per site, the audit group's cause (chooses the shipped trigger)
    cpus: int = 1  # the guest's CPUs (QEMU -smp)
    module_trigger: str | None = None  # a user's test module (.ko for this kernel), loaded before the probe


@dataclass(frozen=True)
class Confirmation:
    site: Site
    tracer: str
    via: str
    optimized: bool
    trigger: tuple[str, ...]
    decision: Decision
    baseline: Run
    probed: Run
    accel_why: str
    predictions: tuple = ()  # an optimized kernel probe: what each optprobes model predicts (``prediction``)

    @property
    def outcome(self) -> Outcome:
        return self.decision.outcome

    def as_json(self) -> dict:
        d = self.decision
        return {"site": self.site.text, "address": hex(self.site.address), "where": self.site.where,
                "tracer": self.tracer, "via": self.via, "optimized": self.optimized,
                "probe": self.site.probe_target, "outcome": d.outcome.label, "evidence": d.evidence,
                "console": list(d.excerpt), "hits": d.hits, "missed": d.missed,
                "listed_optimized": d.optimized,
                "file_bytes": self.site.file_bytes.hex(),
                "live_bytes": None if d.live is None else d.live[:len(self.site.file_bytes)].hex(),
                "live_read": None if d.live is None else d.live.hex(),
                "live_variant": d.live_variant, "variants": [[n, b.hex()] for n, b in self.site.variants],
                "trigger": list(self.trigger),
                "trigger_report": {name: None if run.console.trigger is None else {
                    "status": run.console.trigger.status, "code": run.console.trigger.code,
                    "digest": run.console.trigger.digest, "bytes": run.console.trigger.bytes}
                    for name, run in (("without_probe", self.baseline), ("with_probe", self.probed))},
                "predictions": [p.as_json(d.optimized) for p in self.predictions],
                "accel": self.probed.accel, "accel_why": self.accel_why, "cmdline": self.probed.cmdline,
                "boot_seconds": {"without_probe": self.baseline.seconds, "with_probe": self.probed.seconds},
                "guest_phase_uptimes": {"without_probe": dict(self.baseline.console.times),
                                        "with_probe": dict(self.probed.console.times)}}


def confirm(request: Request, guest: Guest, cache_dir: str | None = None, say=None,
            together: bool = False) -> list[Confirmation]:
    """See the module doc.  ``together``: every site's probe in one pair of boots (controls: each its own
    event), and each site alone again only if that boot diverged."""
    binary = qemu.find_qemu()
    check_request(request)
    prepared = [_prepare(request, guest, k, text, cache_dir, say) for k, text in enumerate(request.sites)]
    accel, why = qemu.accel(request.accel, str(confirm_cache(cache_dir)),
                            lambda: _try_kvm(guest, binary, cache_dir), binary)
    if say:
        say(f"accelerator: {accel} ({why})")
    context = _Context(guest, request, binary, accel, why, cache_dir, say)
    done = _together(prepared, context) if together and len(prepared) > 1 else None
    if done is None:
        done = [one for p in prepared for one in _run(context, (p,))]
    if context.optimized and request.tracer != "uprobes":  # which optprobes model predicts what the kernel listed
        version = ".".join(guest.release.split(".")[:2])
        done = [replace(c, predictions=optprobes_predictions(c.site, guest, version)) for c in done]
    return done


@dataclass(frozen=True)
class _Prepared:
    """One site ready to boot: its probe, trigger, modules, live reads and the run's own initramfs files."""

    site: Site
    probe: Probe
    trigger: "_Chosen"
    extra: tuple
    modules: tuple[str, ...]
    live: tuple


@dataclass(frozen=True)
class _Context:
    guest: Guest
    request: Request
    binary: str
    accel: str
    why: str
    cache_dir: str | None
    say: object

    @property
    def cmdline(self) -> str:
        return " ".join([BASE_CMDLINE] + self.request.cmdline.split())

    @property
    def optimized(self) -> bool:
        r = self.request
        return r.optimized if r.optimized is not None else r.tracer == "optprobes"


def _prepare(request: Request, guest: Guest, k: int, text: str, cache_dir: str | None, say,
             event: str = "site") -> _Prepared:
    from .sites import module_of, resolve_user_site

    kind = "uprobes" if request.tracer == "uprobes" else "kprobes"
    cause = request.causes[k] if k < len(request.causes) else None
    trigger, extra = _trigger(request, guest, kind, cause, module_of(text)[0] if kind == "kprobes" else None)
    if kind == "uprobes":
        elf_host, elf_guest, extra_elf = _elf(request, guest, trigger, extra)
        site = resolve_user_site(text, elf_host, elf_guest)
        extra = extra + extra_elf
    else:
        site = _kernel_site(text, guest, cache_dir, say, request.module_trigger)
    if not site.probe_target:
        raise InputError(f"{text}: several functions of {site.module} have that name: kprobes cannot tell them "
                         f"apart by name")
    optimized = request.optimized if request.optimized is not None else request.tracer == "optprobes"
    probe = Probe(kind, site.probe_target, optimized, request.via)
    if request.via == "module":
        extra = extra + [_built(guest, "rvkprobe", cache_dir, say)]
    if trigger.row is not None and trigger.row.test_module:
        extra = extra + [_built(guest, trigger.row.test_module, cache_dir, say)]
    length = max([len(site.file_bytes)] + [len(raw) for _, raw in site.variants])  # the longest a variant may be
    live = ((site.address if site.module is None else f"{site.symbol}+{site.offset:#x}", length),) \
        if kind == "kprobes" else ()
    modules = _modules(guest, trigger, site, request.module_trigger)
    if request.module_trigger:
        with open(request.module_trigger, "rb") as handle:
            extra = extra + [initramfs.file(f"rv/modules/{module_name(request.module_trigger)}.ko", handle.read(),
                                            0o644)]
    return _Prepared(site, probe, trigger, tuple(extra), modules, live)


def _run(context: _Context, prepared: tuple[_Prepared, ...]) -> list[Confirmation]:
    """One pair of boots: without the probes and with them (all of ``prepared``, sharing the first's trigger)."""
    first = prepared[0]
    request = context.request
    live = tuple(x for p in prepared for x in p.live)
    modules = tuple(dict.fromkeys(m for p in prepared for m in p.modules))
    extra = list({e.path: e for p in prepared for e in p.extra}.values())
    base = RunPlan((), first.trigger.argv, request.trigger_timeout_s, live, modules)
    mine = RunPlan(tuple(p.probe for p in prepared), first.trigger.argv, request.trigger_timeout_s, live, modules)
    if context.say:
        what = first.site.where if len(prepared) == 1 else f"{len(prepared)} sites at once"
        context.say(f"{what}: booting without and with the probe ({context.accel}) ...")
    baseline, probed = _boot_pair(context.guest, base, mine, extra, context.cmdline, context.accel, request,
                                  context.binary, context.cache_dir)
    _check_baseline(baseline, request, first.trigger)
    return [Confirmation(p.site, request.tracer, request.via, context.optimized, first.trigger.argv,
                         decide(p.site, p.probe, baseline, probed), baseline, probed, context.why)
            for p in prepared]


def _together(prepared: list[_Prepared], context: _Context) -> list[Confirmation] | None:
    """Every probe in one pair of boots, each its own event; None when that boot diverged (a crash or a
    different output cannot be laid at one probe's door: the caller confirms each site alone)."""
    if any(p.site.module is not None or p.probe.via != "events" or p.trigger != prepared[0].trigger
           for p in prepared):
        return None
    renamed = tuple(replace(p, probe=replace(p.probe, event=f"site{k}")) for k, p in enumerate(prepared))
    results = _run(context, renamed)
    if divergence(results[0].baseline, results[0].probed) is not None:
        if context.say:
            context.say(f"the boot with {len(prepared)} probes diverged: each site alone")
        return None
    return results


def check_request(request: Request) -> None:
    """InputError for a request no boot can answer: an unknown tracer, a trigger or program that is not a
    static ELF, options that do not go together.  Nothing is built or booted first."""
    if request.tracer not in TRACERS:
        raise InputError(f"--tracer {request.tracer}: choose one of {', '.join(TRACERS)}")
    if not request.sites:
        raise InputError("name at least one --site (e.g. --site dcache_readdir+0x8f)")
    if not 1 <= request.cpus <= 8:
        raise InputError(f"--smp {request.cpus}: give 1 to 8 CPUs")
    if request.tracer == "uprobes" and request.optimized:
        raise InputError("--optimized on is for kprobes: uprobes are never optimized")
    if request.tracer == "uprobes" and request.via != "events":
        raise InputError("--via module is for kprobes (register_kprobe); uprobes go through uprobe_events")
    if request.tracer != "uprobes" and request.elf:
        raise InputError("--elf names the user program of a uprobes site: give --tracer uprobes")
    if request.tracer == "uprobes" and request.trigger and request.trigger[0] not in BY_NAME and not request.elf:
        raise InputError("--tracer uprobes with a --trigger of your own needs --elf PROGRAM: the static program "
                         "the site is in")
    if request.trigger and request.trigger[0] not in BY_NAME:
        _static_file(request.trigger[0], "--trigger", f"neither a shipped trigger ({', '.join(sorted(BY_NAME))}) "
                                                      f"nor a file")
    if request.elf:
        _static_file(request.elf, "--elf", "not a file")
    if request.module_trigger:
        _module_file(request.module_trigger)


def _module_file(path: str) -> None:
    """InputError unless ``path`` is a kernel module (an ELF relocatable object with a ``.modinfo``)."""
    if not os.path.isfile(path) or not path.endswith(".ko"):
        raise InputError(f"--module-trigger {path}: not a kernel module file (.ko)")
    try:
        module_depends(path)
    except Exception as exc:  # pyelftools' errors: not an ELF at all
        raise InputError(f"--module-trigger {path}: not a kernel module ({exc})") from None


def _static_file(path: str, option: str, missing: str) -> None:
    if not os.path.isfile(path):
        raise InputError(f"{option} {path}: {missing}")
    if not is_static(path):
        raise InputError(f"{option} {path}: not a statically linked x86-64 ELF (the guest has no libc: build it "
                         f"with gcc -static)")


@dataclass(frozen=True)
class _Chosen:
    argv: tuple[str, ...]  # in the guest
    row: Trigger | None  # a shipped trigger, or None for the user's program


def _trigger(request: Request, guest: Guest, kind: str, cause: str | None,
             module: str | None = None) -> tuple[_Chosen, list]:
    """The trigger's argv in the guest, and the entries a user's program adds to the run's initramfs; by
    default the shipped trigger of the site's audit group, or of the module the site is in."""
    if not request.trigger and kind == "uprobes" and request.elf:  # the program the site is in runs itself
        return _user_program(request.elf, ())
    if not request.trigger:
        row = next((t for t in TRIGGERS if module in t.modules or module == t.test_module), None) if module else None
        row = row or for_group(kind, cause)
        return _Chosen(_argv(row, ()), row), []
    name, args = request.trigger[0], tuple(request.trigger[1:])
    if name in BY_NAME:
        row = BY_NAME[name]
        return _Chosen(_argv(row, args), row), []
    return _user_program(name, args)


def _user_program(path: str, args: tuple[str, ...]) -> tuple[_Chosen, list]:
    """A user's static program as the trigger: /rv/bin/user-NAME in the run's own initramfs."""
    guest_path = f"/rv/bin/user-{os.path.basename(path)}"
    with open(path, "rb") as handle:
        data = handle.read()
    return _Chosen((guest_path,) + args, None), [initramfs.file(guest_path.lstrip("/"), data)]


def _argv(row: Trigger, args: tuple[str, ...]) -> tuple[str, ...]:
    if row.command:
        return row.command + args
    return (f"/rv/bin/{row.program}",) + (args or row.args)


def _elf(request: Request, guest: Guest, trigger: _Chosen, extra: list) -> tuple[str, str, list]:
    """uprobes: (host path, guest path, initramfs entries) of the program holding the site."""
    if request.elf is None:
        return os.path.join(guest.directory, trigger.row.program), f"/rv/bin/{trigger.row.program}", []
    for entry in extra:  # the trigger is the ELF itself
        if os.path.basename(entry.path) == f"user-{os.path.basename(request.elf)}":
            return request.elf, "/" + entry.path, []
    guest_path = f"/rv/bin/user-{os.path.basename(request.elf)}"
    with open(request.elf, "rb") as handle:
        return request.elf, guest_path, [initramfs.file(guest_path.lstrip("/"), handle.read())]


def _modules(guest: Guest, trigger: _Chosen, site: Site, module_trigger: str | None = None) -> tuple[str, ...]:
    """The guest's modules loaded before the probe: those the trigger needs, its test module (or the user's),
    and the site's own."""
    test = (trigger.row.test_module,) if trigger.row is not None and trigger.row.test_module else ()
    test += (module_name(module_trigger),) if module_trigger else ()
    if (trigger.row is None or not trigger.row.modules) and (site.module is None or site.module in test):
        return test
    if site.module is not None and site.module not in guest.modules + test:
        raise InputError(f"{site.text}: the guest does not carry module {site.module} (it carries "
                         f"{', '.join(guest.modules) or 'none'}: the shipped triggers' modules)")
    return tuple(guest.modules) + test  # in load order; the guest carries exactly what the shipped triggers need


def _kernel_site(text: str, guest: Guest, cache_dir: str | None, say, module_trigger: str | None = None) -> Site:
    from .sites import module_of, resolve_kernel_site, resolve_module_site

    module, rest = module_of(text)
    if module is None:
        return resolve_kernel_site(text, guest.vmlinux, guest.system_map)
    if module_trigger and module == module_name(module_trigger):
        path = module_trigger
    elif any(t.test_module == module for t in TRIGGERS):
        path = str(build_module(guest, PROGRAM_DIR / f"{module}.c", confirm_cache(cache_dir), say))
    else:
        path = dict(guest.module_paths).get(module)
    if path is None:
        raise InputError(f"{text}: the package has no module {module}")
    return resolve_module_site(rest, module, path)


def _built(guest: Guest, name: str, cache_dir: str | None, say) -> initramfs.Entry:
    """``programs/NAME.c`` built as a module against the package's headers (rvkprobe, a trigger's test
    module), as /rv/modules/NAME.ko."""
    path = build_module(guest, PROGRAM_DIR / f"{name}.c", confirm_cache(cache_dir), say)
    with open(path, "rb") as handle:
        return initramfs.file(f"rv/modules/{name}.ko", handle.read(), 0o644)


def _boot_pair(guest: Guest, base: RunPlan, mine: RunPlan, extra: list, cmdline: str, accel: str,
               request: Request, binary: str, cache_dir: str | None) -> tuple[Run, Run]:
    with scratch(cache_dir) as work:
        specs = []
        for name, plan in (("without", base), ("with", mine)):
            directory = os.path.join(work, name)
            os.mkdir(directory)
            entries = extra + [initramfs.file("rv/run.sh", run_script(plan).encode())]
            specs.append(qemu.BootSpec(guest.kernel, run_initrd(guest, entries, directory), cmdline, request.cpus))
        limit = request.boot_timeout_s + request.trigger_timeout_s
        boots = qemu.boot_all(specs, accel, limit, qemu=binary, fault=shows_fault)
    return tuple(Run(b.accel, b.cmdline, b.seconds, b.ended, read_console(b.console)) for b in boots)


def _check_baseline(run: Run, request: Request, trigger: _Chosen) -> None:
    """InputError when the boot without the probe did not give a trigger report to compare with."""
    con = run.console
    last = next((line.strip() for line in reversed(con.lines) if line.strip()), "(nothing)")
    if run.ended == "flood":
        raise InputError(f"without the probe the console passed {qemu.CONSOLE_CAP >> 20} MiB: the trigger "
                         f"({' '.join(trigger.argv)}) floods the console")
    if con.trigger is not None and con.trigger.status == "timeout":
        raise InputError(f"without the probe the trigger ({' '.join(trigger.argv)}) did not finish in "
                         f"{request.trigger_timeout_s} s: give one that ends, or a longer --trigger-timeout")
    if con.trigger is not None and con.trigger.status == "exit" and con.trigger.code == 127 and \
            any(line.startswith("cannot run") for line in con.trigger.output):
        raise InputError(f"the guest cannot run the trigger: {con.trigger.output[0]}")
    if not con.reached("end") or con.trigger is None:
        how = {"timeout": f"did not finish within {request.boot_timeout_s + request.trigger_timeout_s:.0f} s",
               "exit": "ended early"}.get(run.ended, run.ended)
        raise InputError(f"the guest without the probe {how} ({run.accel}, {run.seconds:.1f} s); its console's "
                         f"last line: {last[:200]}")


def _try_kvm(guest: Guest, binary: str, cache_dir: str | None) -> tuple[bool, str]:
    """One short KVM boot that places a kprobe (an int3 in kernel mode), hits it and runs user programs
    (xrstor): (whether it finished with hits, why)."""
    from .sites import resolve_kernel_site

    site = resolve_kernel_site("iterate_dir+0x5", guest.vmlinux, guest.system_map)
    plan = RunPlan((Probe("kprobes", site.probe_target),), ("/rv/bin/syscalls", "readdir"), 10)
    with scratch(cache_dir) as work:
        initrd = run_initrd(guest, [initramfs.file("rv/run.sh", run_script(plan).encode())], work)
        t0 = time.monotonic()
        boot = qemu.boot(guest.kernel, initrd, BASE_CMDLINE, "kvm", 30.0, qemu=binary)
    con = read_console(boot.console)

    count, _ = hits(con.listed("profile"), "kprobes")
    if con.reached("end") and count and not con.faults:
        return True, f"a KVM boot ran a kernel-mode int3 ({count} hits) in {time.monotonic() - t0:.1f} s"
    return False, (f"a KVM boot did not run a kernel-mode int3 and user programs to the end "
                   f"({boot.ended} after {boot.seconds:.1f} s): TCG")
