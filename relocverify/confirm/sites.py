"""Probed sites resolved: an address in the kernel's text (or a user program's), its bytes in the file,
the boot variants the model allows there, and what the tracer's interface is told.

``resolve_kernel_site(text, vmlinux, system_map)`` reads the location as the other commands do
(``image.locations``: FUNCTION+OFF, 0xADDR, kprobe:FUNCTION+28 ...) against the image's index
(``store.image_index``), at an instruction boundary of our decoders' walk, inside a function of an
executable section; a site elsewhere (data, a name the image does not have) is an ``InputError``.
The variants are ``kernel.variants``' for every patch site holding the address: what the live
bytes may be.  The probe target is ``FUNCTION+0xOFF`` (``kprobe_events`` resolves it through
kallsyms, as a user would write it), or the bare address when several functions share the name.

``resolve_user_site(text, elf, guest_path)`` does the same in a static user program and gives
uprobes' ``PATH:0xOFFSET``, the file offset of the instruction (``uprobe_events`` takes offsets).
"""

from __future__ import annotations

import struct

import iced_x86

from ..errors import InputError
from ..image.functions import find_functions, iter_instruction_spans
from ..image.locations import FunctionIndex, parse_location
from ..kernel.variants import NoVariants, VariantFinder
from .outcome import Site


def resolve_kernel_site(text: str, vmlinux: str, system_map: str | None) -> Site:
    from ..store.image_index import indexed

    index = indexed(vmlinux, system_map)
    loc = _locate(index, text, "the kernel")
    raw = _instruction(index.image.read(loc.address, 15), loc.address, text)
    variants: list[tuple[str, bytes]] = []
    note = ""
    finder = VariantFinder(index.image)
    patches = index.sites.sites_at(loc.address, len(raw)) if index.sites is not None else []
    for patch in patches:
        found = finder.variants_at(patch, loc.address, raw)
        if isinstance(found, NoVariants):
            note = f"{patch.kind}: {found.reason}"
            continue
        variants += [(f"{patch.kind}: {v.name}", v.raw) for v in found if (v.name, v.raw) not in variants]
    name = loc.function.name
    unique = len(index.functions.by_name.get(name, [])) == 1
    target = f"{name}+{loc.offset:#x}" if unique else f"{loc.address:#x}"
    return Site(text, loc.address, f"{name}+{loc.offset:#x}", raw, tuple(variants), note, target,
                init_text=any(p.kind == "init_text" for p in patches))


#: Prefixes ``image.locations`` reads itself (bpftrace's, DTrace's); any other ``NAME:`` names a module.
_NOT_MODULES = ("kprobe", "kretprobe", "fentry", "kfunc", "kinst", "fbt", "")


def module_of(text: str) -> tuple[str | None, str]:
    """(module, the rest) of ``MODULE:FUNCTION+OFF`` (kprobe_events' own syntax); (None, text) otherwise."""
    head, colon, rest = text.partition(":")
    if colon and head not in _NOT_MODULES and not head.startswith("0x"):
        return head.replace("-", "_"), rest
    return None, text


def resolve_module_site(text: str, module: str, path: str) -> Site:
    """A site in the module at ``path`` (``MODULE:FUNCTION+OFF``): its bytes as ``image.module`` lays the
    module out, compared with the live ones only when no relocation touches the instruction (laid out at
    two bases, its bytes are the same)."""
    from ..image.module import MODULE_BASE, load_module

    image = load_module(path, None)
    functions = FunctionIndex(find_functions(image))
    loc = functions.resolve(parse_location(text),
                            lambda f: [a - f.start for a, _ in iter_instruction_spans(image, f)])
    if loc.function is None:
        raise InputError(f"{module}:{text}: not in a function of {module}'s text")
    raw = _instruction(image.read(loc.address, 15), loc.address, text)
    moved = load_module(path, None, MODULE_BASE + 0x1000000).read(loc.address + 0x1000000, len(raw))
    name = loc.function.name
    unique = len(functions.by_name.get(name, [])) == 1
    return Site(f"{module}:{text}", loc.address, f"{module}:{name}+{loc.offset:#x}", raw, (), "",
                f"{module}:{name}+{loc.offset:#x}" if unique else "", module, name, loc.offset, moved == raw)


def resolve_user_site(text: str, elf: str, guest_path: str) -> Site:
    from ..store.image_index import indexed

    index = indexed(elf, None, kernel=False)
    loc = _locate(index, text, elf)
    raw = _instruction(index.image.read(loc.address, 15), loc.address, text)
    offset = file_offset(elf, loc.address)
    return Site(text, loc.address, f"{loc.function.name}+{loc.offset:#x}", raw, (), "",
                f"{guest_path}:{offset:#x}")


def file_offset(elf: str, address: int) -> int:
    """The file offset of a virtual address in ``elf``'s loadable segments."""
    with open(elf, "rb") as handle:
        head = handle.read(64)
        phoff, = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        handle.seek(phoff)
        table = handle.read(phentsize * phnum)
    for i in range(phnum):
        kind, _, offset, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
        if kind == 1 and vaddr <= address < vaddr + filesz:
            return offset + address - vaddr
    raise InputError(f"{elf}: no loadable segment holds {address:#x}")


def _locate(index, text: str, what: str):
    loc = index.locate(parse_location(text))
    if loc.function is None:
        raise InputError(f"{text}: {loc.address:#x} is not in a function of {what}'s text: probe an instruction "
                         f"of a function (FUNCTION+0xOFF)")
    return loc


def _instruction(stream: bytes, address: int, text: str) -> bytes:
    insn = iced_x86.Decoder(64, stream, ip=address).decode()
    if insn.is_invalid:
        raise InputError(f"{text}: the bytes at {address:#x} ({stream[:8].hex()}) do not decode as an instruction")
    return stream[:insn.len]
