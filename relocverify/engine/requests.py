"""What the engine is asked to verify: one frozen request per kind of input, each carrying the ``RunOptions``
it is verified with and the store it goes into.

    KernelRequest   a kernel image, vmlinux or bzImage (None: the default kernel)      ``relocverify vmlinux``
    ElfRequest      user-space ELF files, or directories of them                       ``relocverify elf``
    ModuleRequest   kernel modules, laid out in module space against their vmlinux     ``relocverify module``
    PackageRequest  a kernel's vmlinux and every module: a named kernel, .deb or dir   ``relocverify package``
    ImageRequest    one image already loaded, a kernel's or a user-space file's, with  ``relocverify audit IMAGE``
                    its options settled (``engine.verify.image_request`` makes it)

``engine.verify.verify`` takes any of them and returns a ``summary.RunSummary`` (its table ``WAYS`` says how
each kind is verified); the tracer audit takes the same values (``tracers.run.audit``: the request verified,
each image audited as it is handed over).  Nothing here loads, reads or runs anything: the command line
builds a request before any engine module that does is imported.  Two requests hold a hook the command line
gives (``check_store``, ``on_parts``); a hook is not part of a request's value (it is left out of ``==``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Union

if TYPE_CHECKING:
    from ..image.image import Image
    from .run import RunOptions

#: What a ``KernelRequest`` (or ``engine.verify.image_request``) verifies when given no path: a named kernel
#: (``image.fetch.KERNELS``), downloaded on first use.
DEFAULT_KERNEL = "debian-6.1-cloud"


@dataclass(frozen=True)
class KernelRequest:
    """A kernel image verified into one store, as ``relocverify vmlinux`` asks."""

    path: str | None  # a vmlinux ELF or a bzImage; None: ``DEFAULT_KERNEL``, downloaded on first use
    options: RunOptions
    db: str | None = None  # None: ``relocverify-<sha>.sqlite`` beside the image (``engine.verify.default_store``)
    system_map: str | None = None  # System.map or kallsyms, for a stripped vmlinux or a bzImage
    # given the default store's path before it is used; refuses (raises) a path it cannot write
    check_store: Callable[[str], object] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ElfRequest:
    """User-space ELF files verified by the user-space policy, each with its own slot, as ``relocverify elf``
    asks (``options.policy``, ``with_sites`` and ``tramp`` are the engine's to set)."""

    paths: tuple[str, ...]  # files, or directories whose regular files directly inside are verified
    options: RunOptions
    db: str | None = None  # None: in the current directory (one file: by its hash; several: relocverify-user.sqlite)
    trampoline_base: int | None = None  # every file's slot; None: a page 1 MiB past each file's end

    def __post_init__(self) -> None:
        object.__setattr__(self, "paths", tuple(self.paths))


@dataclass(frozen=True)
class ModuleRequest:
    """Kernel modules laid out in module space and relocated against a vmlinux's symbols, into one store, as
    ``relocverify module`` asks."""

    modules: tuple[str, ...]  # .ko, .ko.xz or .ko.zst files, laid out in this order
    kernel: str  # the vmlinux the modules were built for
    options: RunOptions
    db: str
    system_map: str | None = None  # System.map for a stripped ``kernel``
    base: int | None = None  # where the first module is laid out (page-aligned); None: ``image.module.MODULE_BASE``

    def __post_init__(self) -> None:
        object.__setattr__(self, "modules", tuple(self.modules))


@dataclass(frozen=True)
class PackageRequest:
    """A whole kernel, its vmlinux and every module, into one store, as ``relocverify package`` asks."""

    source: str  # a named kernel (``image.fetch.KERNELS``), a linux-image .deb, or a directory
    options: RunOptions
    db: str
    dbg: str | None = None  # with a .deb: its -dbg package, for the unstripped vmlinux
    limit_modules: int | None = None  # only the first N modules (by path); None: all
    # given the line saying which parts were found (``image.debian.KernelParts.used``) before any is verified
    on_parts: Callable[[str], None] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ImageRequest:
    """One image already loaded, a kernel's or a user-space file's, with what it is verified with and where
    (``engine.verify.image_request``): the audit's IMAGE, whose slot the auditor needs before it is verified."""

    image: Image
    options: RunOptions  # a kernel's as given; a user-space file's: the user-space policy, no sites, its own slot
    db: str  # the store's path


#: Any request ``engine.verify.verify`` takes.
Request = Union[KernelRequest, ElfRequest, ModuleRequest, PackageRequest, ImageRequest]

#: Every kind of request, in the order the module docstring lists them.
REQUESTS: tuple[type, ...] = (KernelRequest, ElfRequest, ModuleRequest, PackageRequest, ImageRequest)

__all__ = ["DEFAULT_KERNEL", "REQUESTS", "ElfRequest", "ImageRequest", "KernelRequest", "ModuleRequest",
           "PackageRequest", "Request"]
