"""Whole images verified into a store, as the batch commands ask: a kernel image (``verify_vmlinux``),
kernel modules laid out in module space (``verify_module``), a kernel's vmlinux and every module
(``verify_package``), user-space executables and libraries (``verify_elf``).

Each finds and loads its images, runs ``engine.run.run`` on each (several images on one ``Session``
where the command always did: one pool whose workers keep what they learn from image to image), adds
the summaries up (``summary.totals_over``) and returns a ``summary.RunSummary``.  Nothing here writes
to the command's output: progress lines go to ``say`` (None: none, and no progress bars), and a caller
that shows each image as it is done passes ``on_image``.  The command line parses its arguments, calls
one of these and renders what it returns (``cli.vmlinux``, ``cli.module``, ``cli.package``,
``cli.elf``).

Only light modules are imported here at first: the command line imports this module (for
``user_trampoline``) before it parses its arguments; the engine is imported when an image is verified.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Callable, Optional

from ..errors import InputError
from ..x86.registers import KERNEL_HALF

if TYPE_CHECKING:
    from ..image.debian import KernelParts
    from ..image.image import Image
    from .run import RunOptions
    from .summary import RunSummary

#: What ``verify_vmlinux`` verifies when given no path: a named kernel (``image.fetch.KERNELS``),
#: downloaded on first use.
DEFAULT_KERNEL = "debian-6.1-cloud"

#: Where a user-space tracer's trampolines live relative to the code: a page 1 MiB past the
#: image's end, as uprobes maps its execute-out-of-line page into the process.
TRAMPOLINE_GAP = 1 << 20

#: Files between two progress lines of a batch of user-space files or modules.
PROGRESS_EVERY = 50

#: Where progress lines go (the command line: stderr), or None for none.
Say = Optional[Callable[[str], None]]

#: Called with each image's name (a module's path, a package's module name, an ELF file's path) and
#: its summary as soon as it is verified.
OnImage = Optional[Callable[[str, dict], None]]


def default_store(path: str, image: Image) -> str:
    """The store a kernel image's results go to when none is named: ``relocverify-<sha>.sqlite`` beside it."""
    return _store_path(path, image.identity)


def store_path(path: str, identity: str) -> str:
    """``default_store`` for an image known by its path and content hash (an image index's ``identity``)."""
    return _store_path(path, identity)


def _store_path(path: str, identity: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(path)), f"relocverify-{identity[:12]}.sqlite")


def user_trampoline(image: Image, base: int | None = None) -> int:
    """A user-space image's slot: ``base`` if given, else the page ``TRAMPOLINE_GAP`` past the image's
    end (where uprobes maps its execute-out-of-line page, near enough for rel32)."""
    if base is not None:
        return base
    end = max((s.end for s in image.sections if s.alloc), default=0)
    return (end + TRAMPOLINE_GAP) & ~0xFFF


def _user_slot(image: Image, base: int | None) -> int:
    """``user_trampoline``, for an image with code, none of it in the kernel half."""
    code = list(image.iter_executable_sections())
    if not code:
        raise InputError(f"{image.path}: no executable section")
    if any(s.address >= KERNEL_HALF for s in code):
        raise InputError(f"{image.path}: a kernel image (code in the kernel half): use relocverify vmlinux")
    return user_trampoline(image, base)


def elf_files(paths: list[str]) -> tuple[list[str], dict[str, str]]:
    """The ELF files ``paths`` name (a directory: the regular files directly inside, sorted, each real
    file once), and the files skipped with why."""
    files: list[str] = []
    skipped: dict[str, str] = {}
    seen: set[str] = set()
    for p in paths:
        names = [os.path.join(p, n) for n in sorted(os.listdir(p))] if os.path.isdir(p) else [p]
        for name in names:
            real = os.path.realpath(name)
            if real in seen:
                continue
            seen.add(real)
            if not os.path.isfile(real):
                if not os.path.isdir(p):
                    skipped[name] = "not a regular file"
                continue
            why = _not_x86_64_elf(real)
            if why is None:
                files.append(name)
            else:
                skipped[name] = why
    return files, skipped


def _not_x86_64_elf(path: str) -> str | None:
    """Why the file at ``path`` is not an x86-64 ELF file, or None when it is one."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(20)
    except OSError as exc:
        return f"cannot read: {exc.strerror}"
    if head[:4] != b"\x7fELF":
        return "not an ELF file (a script or data)"
    if head[18:20] != b"\x3e\x00":
        return "not x86-64"
    return None


def kernel_parts(source: str, dbg: str | None, progress: Say = None) -> KernelParts:
    """The vmlinux and modules ``source`` names (``image.debian.KernelParts``): a named kernel
    (``image.fetch.KERNELS``), a Debian kernel image ``.deb`` (with its ``-dbg`` package), or a directory."""
    from ..image.debian import from_debs, from_directory
    from ..image.fetch import KERNELS, named_parts

    if dbg is not None and (source in KERNELS or os.path.isdir(source)):
        raise InputError(f"--dbg goes with a linux-image .deb; {source} is a "
                         f"{'named kernel' if source in KERNELS else 'directory'}")
    if source in KERNELS:
        return named_parts(source, progress=progress)
    if os.path.isdir(source):
        return from_directory(source)
    if os.path.isfile(source):
        with open(source, "rb") as handle:
            if handle.read(8) == b"!<arch>\n":
                return from_debs(source, dbg, progress=progress)
    raise InputError(f"{source}: not a named kernel ({', '.join(sorted(KERNELS))}), a Debian package (.deb) "
                     f"or a directory")


def _complete(summary: dict) -> bool:
    """One image's run completed and its totals add up."""
    return summary["totals_add_up"] and summary["run"]["status"] == "complete"


def verify_vmlinux(path: str | None, options: RunOptions, db: str | None = None, system_map: str | None = None,
                   say: Say = None, check_store: Callable[[str], object] | None = None) -> RunSummary:
    """Every instruction of the kernel image at ``path`` (None: ``DEFAULT_KERNEL``) into the store ``db``
    (None: ``default_store``, given to ``check_store`` first, which refuses a path it cannot write).
    ``complete``: the run completed and its instruction totals add up."""
    from ..image.loader import load_image, remembered_identity, require_kernel
    from ..schedule.progress import Progress
    from .run import again, run
    from .summary import RunSummary

    if path is None:
        from ..image.fetch import fetch

        path = str(fetch(DEFAULT_KERNEL, None, progress=say).vmlinux)
    # The same command again, answered from the store without loading the image when its identity is
    # remembered (a debug vmlinux: 600 MB read and 200 k symbols parsed for nothing).  With a System.map
    # the image is loaded: its symbols are the map's.
    identity = remembered_identity(path) if system_map is None else None
    summary = None
    if identity is not None:
        store_path = db or _store_path(path, identity)
        if os.path.exists(store_path):
            if not db and check_store is not None:
                check_store(store_path)
            summary = again(identity, store_path, options)
            db = store_path if summary is not None else db
    if summary is None:
        image = load_image(path, system_map)
        require_kernel(image)
        if not db:
            db = default_store(path, image)
            if check_store is not None:
                check_store(db)
        summary = run(image, db, options, Progress(enabled=say is not None))
    return RunSummary(summary, db, summary["by_verdict"], summary["totals_add_up"], _complete(summary),
                      wall_s=summary["wall_s"], tramp=options.tramp)


def verify_elf(paths: list[str], options: RunOptions, db: str | None = None, trampoline_base: int | None = None,
               say: Say = None) -> RunSummary:
    """Every instruction of user-space ELF files, by the user-space policy table (``plan.policy.USER_RULES``),
    each with its slot ``user_trampoline(image, trampoline_base)`` (``options.tramp`` is not used).

    One file (not a directory): its summary, into ``db`` (None: ``relocverify-<sha>.sqlite`` in the
    current directory).  Several, or a directory: every ELF file they name (``elf_files``) into ``db``
    (None: ``relocverify-user.sqlite`` in the current directory), on one session's workers; a file that
    does not load, or is a kernel, is skipped with its reason, not the run.  ``complete``: every total
    adds up, the jump probes' too when asked for."""
    from dataclasses import replace

    options = replace(options, policy="user", with_sites=False)
    if len(paths) == 1 and not os.path.isdir(paths[0]):
        return _one_elf(paths[0], options, db, trampoline_base, say)
    return _many_elf(paths, options, db, trampoline_base, say)


def _one_elf(path: str, options: RunOptions, db: str | None, base: int | None, say: Say) -> RunSummary:
    from dataclasses import replace

    from ..image.loader import load_image
    from ..schedule.progress import Progress
    from .run import run
    from .summary import RunSummary

    image = load_image(path)
    tramp = _user_slot(image, base)
    db = db or os.path.abspath(f"relocverify-{image.identity[:12]}.sqlite")
    summary = run(image, db, replace(options, tramp=tramp), Progress(enabled=say is not None))
    complete = _complete(summary)
    if options.jump_probes:
        complete = complete and summary["jump_probe"]["totals_add_up"]
    return RunSummary(summary, db, summary["by_verdict"], summary["totals_add_up"], complete, wall_s=summary["wall_s"],
                      tramp=tramp)


def _many_elf(paths: list[str], options: RunOptions, db: str | None, base: int | None, say: Say) -> RunSummary:
    from dataclasses import replace

    from ..errors import RelocverifyError
    from ..image.functions import find_functions
    from ..image.loader import load_image
    from ..schedule.progress import Progress
    from .run import Session, run
    from .summary import RunSummary, empty_summary

    files, skipped = elf_files(paths)
    if not files:
        raise InputError(f"no x86-64 ELF file in {', '.join(paths)}")
    db = db or os.path.abspath("relocverify-user.sqlite")
    quiet = Progress(enabled=False)
    images: dict[str, dict] = {}
    t0 = time.monotonic()
    with Session(options) as session:
        for k, path in enumerate(files):
            try:
                image = load_image(path)
                tramp = _user_slot(image, base)
            except RelocverifyError as exc:  # one bad file is skipped with its reason, not the run
                skipped[path] = str(exc).split(": ", 1)[-1]
                continue
            if not find_functions(image):
                images[path] = empty_summary(image, options.jump_probes)
                continue
            images[path] = run(image, db, replace(options, tramp=tramp), quiet, session)
            if say is not None and (k + 1) % PROGRESS_EVERY == 0:
                say(f"files: {k + 1:,}/{len(files):,}, {time.monotonic() - t0:.0f} s")
    totals, adds_up, jumps = _add_up(images, options.jump_probes)
    report, complete = _document({"images": images, "skipped": skipped}, totals, adds_up, jumps)
    return RunSummary(report, db, totals, adds_up, complete, batch=True, images=len(images),
                      wall_s=time.monotonic() - t0, skipped=_reasons(skipped))


def _reasons(skipped: dict[str, str]) -> tuple[tuple[str, int], ...]:
    """Why files were skipped, with how many, the most first (ties in the order first seen)."""
    counts: dict[str, int] = {}
    for why in skipped.values():
        counts[why] = counts.get(why, 0) + 1
    return tuple(sorted(counts.items(), key=lambda kv: -kv[1]))


def _add_up(summaries: dict[str, dict], jump_probes: bool) -> tuple[dict[str, int], bool, dict | None]:
    """Over a batch's images: the verdict totals, whether each image's totals add up, and with jump probes
    their totals (``jumps.jump_totals``), else None."""
    from .jumps import jump_totals
    from .summary import totals_over

    totals, adds_up = totals_over(summaries.values())
    jumps = jump_totals(s["jump_probe"] for s in summaries.values()) if jump_probes else None
    return totals, adds_up, jumps


def _document(head: dict, totals: dict[str, int], adds_up: bool, jumps: dict | None) -> tuple[dict, bool]:
    """A batch's document: ``head`` (the images' summaries, and what else the command names first), the
    totals, and the jump probes' totals when asked for; and whether every total adds up."""
    report = head | {"totals": totals, "totals_add_up": adds_up}
    if jumps is not None:
        report["jump_probe"] = jumps
        adds_up = adds_up and jumps["totals_add_up"]
    return report, adds_up


def verify_module(modules: list[str], kernel: str, options: RunOptions, db: str, system_map: str | None = None,
                  base: int | None = None, say: Say = None, on_image: OnImage = None) -> RunSummary:
    """Every instruction of kernel ``modules``, laid out in module space from ``base`` (None:
    ``image.module.MODULE_BASE``; page-aligned) and relocated against the vmlinux ``kernel``'s symbols
    (``image.module``), into the store ``db``; a module with no function counts zero instructions.
    ``complete``: every total adds up, the jump probes' too when asked for."""
    from ..image.functions import find_functions
    from ..image.loader import load_image, require_kernel
    from ..image.module import MODULE_BASE, MODULES_END, MODULES_VADDR, load_modules
    from ..schedule.progress import Progress
    from .run import run
    from .summary import RunSummary, empty_summary

    vmlinux = load_image(kernel, system_map)
    require_kernel(vmlinux)
    base = MODULE_BASE if base is None else base
    if base & 0xFFF:
        raise InputError(f"--base {base:#x} is not page-aligned: module_alloc() gives pages; e.g. {MODULE_BASE:#x}")
    if not MODULES_VADDR <= base < MODULES_END:
        # outside module space the first module would not fit, and load_modules would start over at
        # MODULE_BASE: the base given would be replaced in silence (issue 44)
        raise InputError(f"--base {base:#x} is outside module space ({MODULES_VADDR:#x}..{MODULES_END:#x}), where "
                         f"module_alloc() places modules; e.g. {MODULE_BASE:#x}")
    t0 = time.monotonic()
    results: dict[str, dict] = {}
    for path, image in load_modules(modules, vmlinux, base):
        summary = run(image, db, options, Progress(enabled=say is not None)) if find_functions(image) \
            else empty_summary(image, options.jump_probes)
        results[path] = summary
        if on_image is not None:
            on_image(path, summary)
    totals, adds_up, jumps = _add_up(results, options.jump_probes)
    report, complete = _document({"modules": results}, totals, adds_up, jumps)
    return RunSummary(report, db, totals, adds_up, complete, batch=True, images=len(results),
                      wall_s=time.monotonic() - t0)


def verify_package(source: str, options: RunOptions, db: str, dbg: str | None = None,
                   limit_modules: int | None = None, say: Say = None,
                   on_parts: Callable[[str], None] | None = None) -> RunSummary:
    """A whole kernel: the vmlinux and every module (the first ``limit_modules``) that ``source`` names
    (``kernel_parts``; ``dbg``: a ``.deb``'s -dbg package), into the store ``db``, on one session's
    workers.  ``on_parts`` is given the line saying which parts were found (``KernelParts.used``) before
    any is verified.  The document holds the source, every image's summary (the vmlinux's first), the
    totals and the wall time of each half; ``complete``: every total adds up, the jump probes' too when
    asked for."""
    import contextlib

    from ..image.functions import find_functions
    from ..image.loader import load_image, require_kernel
    from ..image.module import load_modules
    from ..store.store import Store
    from ..schedule.progress import Progress
    from .run import Session, run
    from .summary import RunSummary, empty_summary

    parts = kernel_parts(source, dbg, say)
    if on_parts is not None:
        on_parts(parts.used)
    modules = parts.modules[:limit_modules]
    quiet = Progress(enabled=False)
    t0 = time.monotonic()
    vmlinux = load_image(parts.vmlinux, parts.system_map)
    require_kernel(vmlinux)
    timing: dict[str, float] = {}
    # The store stays open from the first image to the last: one writer for the whole command, which the
    # session's workers (forked during the first image's run) belong to.
    with contextlib.closing(Store(db)), Session(options) as session:  # one pool: workers keep what they learn
        images = {"vmlinux": run(vmlinux, db, options, Progress(enabled=say is not None), session)}
        timing["vmlinux_s"] = time.monotonic() - t0
        session.fresh_workers()  # the modules need little of what the vmlinux's proofs left in memory
        for k, ((name, path), (_, image)) in enumerate(zip(modules, load_modules([p for _, p in modules], vmlinux))):
            if not find_functions(image):  # a module of data alone (tables, firmware glue): nothing to verify
                images[name] = empty_summary(image, options.jump_probes)
                continue
            images[name] = summary = run(image, db, options, quiet, session)
            if say is not None and (k + 1) % PROGRESS_EVERY == 0:
                say(f"modules: {k + 1:,}/{len(modules):,}, {time.monotonic() - t0:.0f} s")
            if say is not None and not summary["totals_add_up"]:
                say(f"{path}: totals do not add up")
    timing["modules_s"] = time.monotonic() - t0 - timing["vmlinux_s"]
    totals, adds_up, jumps = _add_up(images, options.jump_probes)
    source_doc = {"argument": source, "dbg": dbg, "release": parts.release, "vmlinux": parts.vmlinux,
                  "system_map": parts.system_map, "used": parts.used}
    report, complete = _document({"source": source_doc, "images": images}, totals, adds_up, jumps)
    report["wall_s"] = {k: round(v, 1) for k, v in timing.items()}
    mods = [s for name, s in images.items() if name != "vmlinux"]
    label = source if parts.used.startswith(source + ":") else os.path.basename(os.path.normpath(source))
    return RunSummary(report, db, totals, adds_up, complete, batch=True, images=len(images), wall_s=time.monotonic() - t0,
                      label=label, modules=len(modules),
                      module_by_verdict={v: sum(s["by_verdict"][v] for s in mods) for v in totals} if mods else None,
                      module_instructions=sum(s["instructions"] for s in mods))


__all__ = ["DEFAULT_KERNEL", "TRAMPOLINE_GAP", "default_store", "elf_files", "kernel_parts", "user_trampoline",
           "verify_elf", "verify_module", "verify_package", "verify_vmlinux"]
