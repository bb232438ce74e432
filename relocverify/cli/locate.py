"""Where a command's address came from: ``--at`` (or an ADDRESS argument) as engineers write it, resolved
against ``--image`` when it names a function (``image.locations``, ``store.image_index``)."""

from __future__ import annotations

from ..errors import InputError
from ..inputs import code_address
from ..image.locations import LocationSpec, parse_location


def location(text: str) -> LocationSpec:
    """An argparse type: 0xADDR, FUNCTION, FUNCTION+0x1c, FUNCTION+28, kprobe:FUNCTION+28, NAME@0xADDR+OFF."""
    spec = parse_location(text)
    if not spec.symbolic:
        code_address(spec.absolute, "address")
    return spec


def image_index(args):
    """The indexed ``--image`` (cached on disk), or None."""
    if not getattr(args, "image", None):
        return None
    from ..store.image_index import indexed

    return indexed(args.image, getattr(args, "system_map", None))


def resolve(spec: LocationSpec | int | None, index, default: int, what: str = "--at"):
    """(address, Location or None): an absolute address as given, a symbolic one through the image index."""
    if spec is None:
        return default, None
    if isinstance(spec, int):
        return code_address(spec, what), None
    if not spec.symbolic:
        loc = index.functions.resolve(spec) if index is not None else None
        return code_address(spec.absolute, what), loc
    if index is None:
        raise InputError(f"{what} {spec.text}: a symbolic address needs --image (the kernel whose function it names)")
    loc = index.locate(spec)
    return code_address(loc.address, what), loc


def describe(loc) -> str:
    """``name+0x1c`` for a location inside a function, else ''."""
    if loc is None or loc.function is None:
        return ""
    return f"{loc.function.name}+{loc.offset:#x}" if loc.offset else loc.function.name
