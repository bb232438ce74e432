"""Load an image again from its ``ImageSource``: what a distributed worker does instead of
receiving the image's bytes.

A Dask worker (``schedule.dask_pool``) is given the image's source: its path,
its sha256 identity, and for a kernel module the kernel's source and the
base the module was laid out at, so that its relocations resolve the same
way.  It loads the image itself and checks that what it loaded is what the
run began with, so a file changed or missing on a worker is a clear error,
never a silently different verdict.
"""

from __future__ import annotations

from ..errors import ImageError
from .image import Image, ImageSource
from .loader import load_image
from .module import load_module


def load_source(source: ImageSource, kernels: dict[str, Image] | None = None) -> Image:
    """The image ``source`` describes, checked against its identity.  ``kernels`` (identity ->
    image) keeps a module's kernel loaded from one call to the next."""
    if source.kind == "module":
        kernel = None
        if source.kernel is not None:
            kernels = {} if kernels is None else kernels
            kernel = kernels.get(source.kernel.identity)
            if kernel is None:
                kernel = kernels[source.kernel.identity] = load_source(source.kernel)
        image = load_module(source.path, kernel, source.base)
    else:
        image = load_image(source.path, source.system_map)
    if image.identity != source.identity:
        raise ImageError(f"{source.path}: this worker loaded an image with sha256 {image.identity[:12]}, "
                         f"not the {source.identity[:12]} the run began with; give every worker the same files")
    return image
