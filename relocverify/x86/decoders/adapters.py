"""The registry of decoders (``protocol.Decoder``), by the names ``relocverify gate --decoder`` takes."""

from __future__ import annotations

from ...errors import InputError
from .external import ExternalAdapter
from .linux_insn import cached_adapter
from .objdump import ObjdumpAdapter
from .protocol import Decoder

NAMES = ("capstone", "iced", "vex", "objdump")


def get_adapter(name: str) -> Decoder:
    """The adapter called ``name`` (one of ``NAMES``, or ``linux-insn@SPEC``)."""
    if name == "capstone":
        from .capstone import CapstoneAdapter
        return CapstoneAdapter()
    if name == "iced":
        from .iced import IcedAdapter
        return IcedAdapter()
    if name == "vex":
        from .vex import VexAdapter
        return VexAdapter()
    if name == "objdump":
        return ObjdumpAdapter()
    if name.startswith("linux-insn@"):
        return cached_adapter(name)
    raise InputError(f"unknown decoder {name!r}: choose one of {', '.join(NAMES)}, linux-insn@VERSION "
                     f"or linux-insn@/path/to/linux, or give --decoder-cmd")


def external_adapter(command: str) -> Decoder:
    return ExternalAdapter(command)
