"""Whole images verified into a store, as the batch commands and the tracer audit ask, through one entry
point: ``verify(request)``, for any request of ``engine.requests`` (a kernel image, user-space files, kernel
modules laid out in module space, a kernel's vmlinux and every module, one image already loaded: the audit's
IMAGE, which ``image_request`` loads).  The table ``WAYS`` says, per kind of request, how it is verified.

Each way finds and loads its images, runs ``engine.run.run`` on each (several images on one ``Session``
where the command always did: one pool whose workers keep what they learn from image to image), adds
the summaries up (``summary.totals_over``) and returns a ``summary.RunSummary``.  Nothing here writes
to the command's output: progress lines go to ``say`` (None: none, and no progress bars), and a caller
that wants each image as it is done passes ``on_image``, which is given a ``VerifiedImage`` (its name
and summary, which ``cli.module`` shows; the loaded image and its id in the store, which the tracer
audit reads: ``tracers.run.audit`` audits each image as it is handed over).  The command line parses its
arguments, builds a request, calls ``verify`` and renders what it returns (``cli.vmlinux``, ``cli.module``,
``cli.package``, ``cli.elf``).

The engine's heavy modules (the loader, ``engine.run``, the module layout) are imported when an image is
verified; the command line does not import this module before it runs a command (it takes ``DEFAULT_KERNEL``
from ``engine.requests``).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Optional

from ..errors import InputError, RelocverifyError
from ..image.debian import KernelParts, from_debs, from_directory
from ..image.fetch import KERNELS, fetch, named_parts
from ..schedule.progress import Progress
from ..store.store import Results, Store
from ..x86.registers import KERNEL_HALF
from .requests import DEFAULT_KERNEL, ElfRequest, ImageRequest, KernelRequest, ModuleRequest, PackageRequest, Request
from .summary import RunSummary, empty_summary, totals_over

if TYPE_CHECKING:
    from ..image.image import Image
    from .run import RunOptions

#: Where a user-space tracer's trampolines live relative to the code: a page 1 MiB past the
#: image's end, as uprobes maps its execute-out-of-line page into the process.
TRAMPOLINE_GAP = 1 << 20

#: Files between two progress lines of a batch of user-space files or modules.
PROGRESS_EVERY = 50

#: Where progress lines go (the command line: stderr), or None for none.
Say = Optional[Callable[[str], None]]


@dataclass(frozen=True)
class VerifiedImage:
    """One image as ``verify`` hands it over (``on_image``) as soon as it is verified: its name and
    summary, which the command line shows, and the loaded image, the store and the image's id there, which
    a caller that reads the store afterwards needs (the tracer audit, ``tracers.run``)."""

    name: str  # a module's path, a package's module name ("vmlinux" for its kernel), a file's path
    summary: dict  # its summary (``run.run``; ``summary.empty_summary`` for an image with no function)
    image: Image  # as loaded (a module: laid out in module space and relocated)
    store: str  # the store's path
    image_id: int | None  # the image's id in the store (None: it has no function, nothing was stored)
    options: RunOptions  # what it was verified with (a user-space file: the user policy and its own slot)
    number: int = 1  # its place among the images the request verifies, from 1
    images: int = 1  # how many images the request verifies (a package: its vmlinux and its modules)
    kernel: Image | None = None  # a module: the vmlinux whose symbols it was relocated against


#: Given each image (``VerifiedImage``) as soon as it is verified, or None.
OnImage = Optional[Callable[[VerifiedImage], None]]


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


def is_kernel(image: Image) -> bool:
    """Whether ``image`` is a kernel's: some of its code is in the kernel half of the address space."""
    return any(s.address >= KERNEL_HALF for s in image.iter_executable_sections())


def _hand_over(on_image: OnImage, name: str, summary: dict, image: Image, db: str, options: RunOptions,
               stored: bool = True, **place) -> None:
    """``on_image``, when there is one, given the image just verified as a ``VerifiedImage``; ``stored``: it
    was run (not given an empty summary), so the store has its id; ``place``: its number, how many images,
    its kernel."""
    if on_image is not None:
        image_id = _stored_id(db, image) if stored else None
        on_image(VerifiedImage(name, summary, image, db, image_id, options, **place))


def _stored_id(db: str, image: Image) -> int | None:
    """The id of ``image`` in the store ``db`` (None: not there)."""
    results = Results(db)
    try:
        return results.find_image(image.identity)
    finally:
        results.close()


def _verify_one(image: Image, db: str, options: RunOptions, say: Say, on_image: OnImage) -> dict:
    """``image`` verified into ``db`` (``run.run``, with progress bars when ``say`` is given), then handed
    to ``on_image`` by its path; its summary."""
    from .run import run

    summary = run(image, db, options, Progress(enabled=say is not None))
    _hand_over(on_image, image.path, summary, image, db, options)
    return summary


def _one_summary(summary: dict, db: str, options: RunOptions, jumps: bool = False) -> RunSummary:
    """The ``RunSummary`` of one image's run; ``jumps``: complete only if the jump probes' totals add up too."""
    complete = _complete(summary) and (not jumps or summary["jump_probe"]["totals_add_up"])
    return RunSummary(summary, db, summary["by_verdict"], summary["totals_add_up"], complete,
                      wall_s=summary["wall_s"], tramp=options.tramp)


def _verify_kernel(request: KernelRequest, say: Say, on_image: OnImage) -> RunSummary:
    """Every instruction of the kernel image at ``request.path`` (None: ``DEFAULT_KERNEL``) into the store
    ``request.db`` (None: ``default_store``, given to ``request.check_store`` first, which refuses a path it
    cannot write).  ``complete``: the run completed and its instruction totals add up.  With ``on_image``
    the image is always loaded (``on_image`` is given it), even for the same command again."""
    from ..image.loader import load_image, remembered_identity, require_kernel
    from .run import again

    options, db, system_map, check_store = request.options, request.db, request.system_map, request.check_store
    path = _default_kernel(request.path, say)
    # The same command again, answered from the store without loading the image when its identity is
    # remembered (a debug vmlinux: 600 MB read and 200 k symbols parsed for nothing).  With a System.map
    # the image is loaded: its symbols are the map's.
    identity = remembered_identity(path) if system_map is None and on_image is None else None
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
        summary = _verify_one(image, db, options, say, on_image)
    return _one_summary(summary, db, options)


def _default_kernel(path: str | None, say: Say) -> str:
    """``path``, or when None the vmlinux of ``DEFAULT_KERNEL`` (downloaded on first use)."""
    if path is not None:
        return path
    return str(fetch(DEFAULT_KERNEL, None, progress=say).vmlinux)


def image_request(path: str | None, options: RunOptions, db: str | None = None, system_map: str | None = None,
                  trampoline_base: int | None = None, say: Say = None) -> ImageRequest:
    """The image at ``path`` (None: ``DEFAULT_KERNEL``) loaded, a kernel's or a user-space ELF file's by where
    its code is (``is_kernel``; a kernel with usable symbols, ``require_kernel``): what the tracer audit's IMAGE
    is.  A kernel is to be verified with ``options``, as a ``KernelRequest`` is; a user-space file as an
    ``ElfRequest``'s file is, by the user-space policy, without sites, with its slot
    ``user_trampoline(image, trampoline_base)``; into ``db`` (None: ``default_store``, beside the image)."""
    from ..image.loader import load_image, require_kernel

    path = _default_kernel(path, say)
    image = load_image(path, system_map)
    if is_kernel(image):
        require_kernel(image)
    else:
        options = replace(options, policy="user", with_sites=False, tramp=user_trampoline(image, trampoline_base))
    return ImageRequest(image, options, db or default_store(path, image))


def _verify_image(request: ImageRequest, say: Say, on_image: OnImage) -> RunSummary:
    """Every instruction of ``request``'s image into its store, with its options (a complete earlier run is
    reused), then handed to ``on_image``.  ``complete``: the run completed and its totals add up."""
    summary = _verify_one(request.image, request.db, request.options, say, on_image)
    return _one_summary(summary, request.db, request.options)


def _verify_elf(request: ElfRequest, say: Say, on_image: OnImage) -> RunSummary:
    """Every instruction of user-space ELF files, by the user-space policy table (``plan.policy.USER_RULES``),
    each with its slot ``user_trampoline(image, request.trampoline_base)`` (``options.tramp`` is not used).

    One file (not a directory): its summary, into ``request.db`` (None: ``relocverify-<sha>.sqlite`` in the
    current directory).  Several, or a directory: every ELF file they name (``elf_files``) into ``request.db``
    (None: ``relocverify-user.sqlite`` in the current directory), on one session's workers; a file that
    does not load, or is a kernel, is skipped with its reason, not the run.  ``complete``: every total
    adds up, the jump probes' too when asked for.  Each file verified is handed to ``on_image``."""
    paths, db, base = list(request.paths), request.db, request.trampoline_base
    options = replace(request.options, policy="user", with_sites=False)
    if len(paths) == 1 and not os.path.isdir(paths[0]):
        return _one_elf(paths[0], options, db, base, say, on_image)
    return _many_elf(paths, options, db, base, say, on_image)


def _one_elf(path: str, options: RunOptions, db: str | None, base: int | None, say: Say,
             on_image: OnImage) -> RunSummary:
    from ..image.loader import load_image

    image = load_image(path)
    options = replace(options, tramp=_user_slot(image, base))
    db = db or os.path.abspath(f"relocverify-{image.identity[:12]}.sqlite")
    return _one_summary(_verify_one(image, db, options, say, on_image), db, options, options.jump_probes)


def _many_elf(paths: list[str], options: RunOptions, db: str | None, base: int | None, say: Say,
              on_image: OnImage) -> RunSummary:
    from ..image.functions import find_functions
    from ..image.loader import load_image
    from .run import Session, run

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
            one = replace(options, tramp=tramp)
            stored = bool(find_functions(image))
            images[path] = run(image, db, one, quiet, session) if stored else empty_summary(image, options.jump_probes)
            _hand_over(on_image, path, images[path], image, db, one, stored, number=k + 1, images=len(files))
            if stored and say is not None and (k + 1) % PROGRESS_EVERY == 0:
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


def _verify_modules(request: ModuleRequest, say: Say, on_image: OnImage) -> RunSummary:
    """Every instruction of kernel modules, laid out in module space from ``request.base`` (None:
    ``image.module.MODULE_BASE``; page-aligned) and relocated against the symbols of the vmlinux
    ``request.kernel`` (``image.module``), into the store ``request.db``; a module with no function counts
    zero instructions.  Each module is handed to ``on_image`` as soon as it is verified.  ``complete``: every
    total adds up, the jump probes' too when asked for."""
    from ..image.functions import find_functions
    from ..image.loader import load_image, require_kernel
    from ..image.module import MODULE_BASE, MODULES_END, MODULES_VADDR, load_modules
    from .run import run

    modules, options, db = list(request.modules), request.options, request.db
    vmlinux = load_image(request.kernel, request.system_map)
    require_kernel(vmlinux)
    base = MODULE_BASE if request.base is None else request.base
    if base & 0xFFF:
        raise InputError(f"--base {base:#x} is not page-aligned: module_alloc() gives pages; e.g. {MODULE_BASE:#x}")
    if not MODULES_VADDR <= base < MODULES_END:
        # outside module space the first module would not fit, and load_modules would start over at
        # MODULE_BASE: the base given would be replaced in silence (issue 44)
        raise InputError(f"--base {base:#x} is outside module space ({MODULES_VADDR:#x}..{MODULES_END:#x}), where "
                         f"module_alloc() places modules; e.g. {MODULE_BASE:#x}")
    t0 = time.monotonic()
    results: dict[str, dict] = {}
    for k, (path, image) in enumerate(load_modules(modules, vmlinux, base)):
        stored = bool(find_functions(image))
        summary = run(image, db, options, Progress(enabled=say is not None)) if stored \
            else empty_summary(image, options.jump_probes)
        results[path] = summary
        _hand_over(on_image, path, summary, image, db, options, stored, number=k + 1, images=len(modules),
                   kernel=vmlinux)
    totals, adds_up, jumps = _add_up(results, options.jump_probes)
    report, complete = _document({"modules": results}, totals, adds_up, jumps)
    return RunSummary(report, db, totals, adds_up, complete, batch=True, images=len(results),
                      wall_s=time.monotonic() - t0)


def _verify_package(request: PackageRequest, say: Say, on_image: OnImage) -> RunSummary:
    """A whole kernel: the vmlinux and every module (the first ``limit_modules``) that ``request.source``
    names (``kernel_parts``; ``dbg``: a ``.deb``'s -dbg package), into the store ``request.db``, on one
    session's workers.  ``request.on_parts`` is given the line saying which parts were found
    (``KernelParts.used``) before any is verified; ``on_image`` each image as soon as it is verified, the
    vmlinux first.  The document holds the source, every image's summary (the vmlinux's first), the totals
    and the wall time of each half; ``complete``: every total adds up, the jump probes' too when asked for."""
    from ..image.loader import load_image, require_kernel
    from .run import Session, run

    source, options, db, dbg = request.source, request.options, request.db, request.dbg
    parts = kernel_parts(source, dbg, say)
    if request.on_parts is not None:
        request.on_parts(parts.used)
    modules = parts.modules[:request.limit_modules]
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
        _hand_over(on_image, "vmlinux", images["vmlinux"], vmlinux, db, options, images=len(modules) + 1)
        _package_modules(modules, vmlinux, db, options, session, images, say, on_image, t0)
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


def _package_modules(modules: tuple[tuple[str, str], ...], vmlinux: Image, db: str, options: RunOptions, session,
                     images: dict[str, dict], say: Say, on_image: OnImage, t0: float) -> None:
    """A package's ``modules`` (name, path) verified into ``images`` by name, after its vmlinux, on
    ``session``'s workers, each handed to ``on_image``; a progress line every ``PROGRESS_EVERY`` modules
    and one for a module whose totals do not add up."""
    from ..image.functions import find_functions
    from ..image.module import load_modules
    from .run import run

    quiet = Progress(enabled=False)
    for k, ((name, path), (_, image)) in enumerate(zip(modules, load_modules([p for _, p in modules], vmlinux))):
        stored = bool(find_functions(image))  # false: a module of data alone (tables, firmware glue)
        images[name] = summary = run(image, db, options, quiet, session) if stored \
            else empty_summary(image, options.jump_probes)
        _hand_over(on_image, name, summary, image, db, options, stored, number=k + 2, images=len(modules) + 1,
                   kernel=vmlinux)
        if not stored:
            continue
        if say is not None and (k + 1) % PROGRESS_EVERY == 0:
            say(f"modules: {k + 1:,}/{len(modules):,}, {time.monotonic() - t0:.0f} s")
        if say is not None and not summary["totals_add_up"]:
            say(f"{path}: totals do not add up")


@dataclass(frozen=True)
class Way:
    """How ``verify`` verifies one kind of request: the function that does it, and what it does."""

    verify: Callable[[Request, Say, OnImage], RunSummary]
    does: str


#: Per kind of request (``engine.requests``), how it is verified.
WAYS: dict[type, Way] = {
    KernelRequest: Way(_verify_kernel, "one kernel image into one store; the same command again is answered from "
                                       "the store by the image's remembered identity, without loading it"),
    ElfRequest: Way(_verify_elf, "user-space files by the user policy, each with its own slot; several (or a "
                                 "directory) on one session's workers, a file that does not load skipped with why"),
    ModuleRequest: Way(_verify_modules, "modules laid out in module space and relocated against their vmlinux, "
                                        "each run in turn into one store; a module of data alone counts zero"),
    PackageRequest: Way(_verify_package, "a kernel's vmlinux, then every module, on one session's workers and one "
                                         "store writer; the parts found are told before any is verified"),
    ImageRequest: Way(_verify_image, "an image image_request loaded and settled the options of (the audit's IMAGE, "
                                     "a kernel's or a user-space file's): run at once, nothing left to find"),
}


def way_of(request: Request) -> Way:
    """How ``request`` is verified (its row of ``WAYS``); an object that is not a request is a caller's mistake."""
    way = WAYS.get(type(request))
    if way is None:
        raise InputError(f"engine.verify takes a request of engine.requests ({', '.join(t.__name__ for t in WAYS)}); "
                         f"{type(request).__name__} is not one")
    return way


def verify(request: Request, say: Say = None, on_image: OnImage = None) -> RunSummary:
    """Every instruction of what ``request`` names, verified into its store the way ``WAYS`` says for its kind;
    progress lines to ``say`` (None: none, and no progress bars), each image to ``on_image`` (a
    ``VerifiedImage``) as soon as it is verified.  A complete earlier run of an image is reused."""
    return way_of(request).verify(request, say, on_image)


__all__ = ["DEFAULT_KERNEL", "TRAMPOLINE_GAP", "WAYS", "VerifiedImage", "Way", "default_store", "elf_files",
           "image_request", "is_kernel", "kernel_parts", "store_path", "user_trampoline", "verify", "way_of"]
