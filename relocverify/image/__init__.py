"""The image stage: a kernel image, its functions, and the named Debian kernels.

    loader.load_image   ELF vmlinux / bzImage (+ System.map)  -> image.Image
    functions           Image                                 -> function bounds, instruction spans
    fetch               a named Debian kernel                 -> its extracted files
"""
