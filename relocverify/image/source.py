"""How to load an image again, elsewhere: what a distributed worker is given instead of the image.

A Dask worker (``engine.dask_pool``) gets an ``ImageSource``, not the image's
bytes: it loads the image itself, from the same path, and checks that what
it loaded is what the run began with (the sha256 identity), so a file
changed or missing on a worker is a clear error, never a silently different
verdict.  Kernel modules carry their kernel's source and the base they were
laid out at, so their relocations resolve the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ImageError


@dataclass(frozen=True)
class ImageSource:
    kind: str  # "image" (vmlinux, bzImage or user-space ELF) | "module"
    path: str
    identity: str  # the sha256 the loaded image must have
    system_map: str | None = None
    kernel: "ImageSource | None" = None  # a module's kernel
    base: int = 0  # where a module is laid out

    def load(self):
        """The image, loaded from ``path`` and checked against ``identity``."""
        if self.kind == "module":
            from .module import load_module

            kernel = None if self.kernel is None else self.kernel.load()
            image = load_module(self.path, kernel, self.base)
        else:
            from .loader import load_image

            image = load_image(self.path, self.system_map)
        if image.identity != self.identity:
            raise ImageError(f"{self.path}: this worker loaded an image with sha256 {image.identity[:12]}, "
                             f"not the {self.identity[:12]} the run began with; give every worker the same files")
        return image
