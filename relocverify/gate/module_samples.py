"""The gate's samples from kernel modules (``.ko``, ``.ko.xz``, ``.ko.zst``).

Each module is laid out and relocated in module space as the kernel's
loader does (``image.module.load_modules``, without a vmlinux: a symbol the
module does not define resolves to a placeholder, which moves a call's or a
RIP-relative operand's target but none of the instruction's fields), and its
functions are swept as an image's are (``iced.sweep_into`` over
``functions.function_bytes``).  The modules of
one ``--module`` argument (a file, or a directory searched for them) are
merged by section name into one unit per section, ``PARENT/NAME/*.ko:.text``
for a directory (``debian-6.1-cloud/modules/*.ko:.text``), ``NAME.ko:.text``
for a file: the baseline keeps a digest per unit, and a thousand modules are
one input.
"""

from __future__ import annotations

import os

from ..errors import InputError
from .answers import remember
from .samples import Unit

MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst")


def module_paths(path: str) -> list[str]:
    """The modules ``path`` names: itself, or every module under it (a directory), sorted."""
    if os.path.isdir(path):
        found = sorted(os.path.join(d, n) for d, _, names in os.walk(path) for n in names
                       if n.endswith(MODULE_SUFFIXES))
        if not found:
            raise InputError(f"--module {path}: no .ko, .ko.xz or .ko.zst files under it")
        return found
    if not os.path.isfile(path):
        raise InputError(f"--module {path}: no such file or directory")
    return [path]


def module_units(path: str) -> list[Unit]:
    """One unit per executable section name over the modules ``path`` names (``module_paths``)."""
    from ..image.functions import find_functions, function_bytes
    from ..image.module import load_modules
    from ..x86.decoders.iced import IcedAdapter, sweep_into

    label = _label(path)
    units: dict[str, Unit] = {}
    facts: dict = {}  # iced-x86's answers from the sweep's own decode, as image_units keeps them
    for _, image in load_modules(module_paths(path), None):  # an ImageError (an InputError) names the module
        for function in find_functions(image):
            unit = units.get(function.section)
            if unit is None:
                unit = units[function.section] = Unit(f"{label}:{function.section}", path=path)
            # addresses differ between modules, so a string's first address is the first module's
            unit.instructions += sweep_into(function_bytes(image, function), function.start, unit.samples, facts)
    remember(IcedAdapter(), facts)
    return [units[k] for k in sorted(units)]


def _label(path: str) -> str:
    """The units' name: a directory with its parent (two kernels' ``modules`` stay apart), or the file's name."""
    path = os.path.normpath(os.path.abspath(path))
    if not os.path.isdir(path):
        return os.path.basename(path)
    parent = os.path.basename(os.path.dirname(path))
    return f"{parent}/{os.path.basename(path)}/*.ko" if parent else f"{os.path.basename(path)}/*.ko"
