"""Values a user types: hex bytes, addresses, address ranges.

Each parser returns the value or raises ``InputError`` with one line that
says what is wrong and what a good value looks like.
"""

from __future__ import annotations

import json
import os
import stat

from .errors import InputError
from .x86.registers import MASK64

MAX_INSTRUCTION = 15


def parse_hex_bytes(text: str, what: str = "HEX") -> bytes:
    cleaned = "".join(text.split())
    if cleaned.lower().startswith("0x"):
        cleaned = cleaned[2:]
    if not cleaned:
        raise InputError(f"{what} is empty: give the instruction bytes in hex, e.g. 'f0 ff 05 00 00 00 00'")
    if len(cleaned) % 2:
        raise InputError(f"{what} has an odd number of hex digits: {text!r}")
    try:
        return bytes.fromhex(cleaned)
    except ValueError:
        raise InputError(f"{what} is not hex: {text!r}") from None


def parse_address(text: str) -> int:
    t = text.strip().lower()
    if not t.startswith("0x"):
        raise InputError(f"address {text!r} must be hex with a 0x prefix, e.g. 0xffffffff81000000")
    try:
        v = int(t, 16)
    except ValueError:
        raise InputError(f"address {text!r} is not hex") from None
    if not 0 <= v <= MASK64:
        raise InputError(f"address {text!r} does not fit in 64 bits")
    return v


def parse_range(text: str) -> tuple[int, int]:
    addr, sep, size = text.partition(":")
    if not sep:
        raise InputError(f"range {text!r} must be ADDR:SIZE, e.g. 0xffffffffc0002000:16")
    try:
        n = int(size, 0)
    except ValueError:
        raise InputError(f"range {text!r}: size is not a number") from None
    return parse_address(addr), n


def parse_int(text: object, what: str) -> int:
    if isinstance(text, bool):
        raise InputError(f"{what} must be a hex string like '0x1f' or an integer, not {text!r}")
    if isinstance(text, int):
        return text
    try:
        return int(str(text), 16) if str(text).lower().startswith("0x") else int(str(text), 10)
    except ValueError:
        raise InputError(f"{what} must be a hex string like '0x1f' or an integer, not {text!r}") from None


def load_json(text: str, what: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{what} is not valid JSON: {e}") from None
    except RecursionError:
        raise InputError(f"{what} is nested too deeply to be a state or an effect program") from None


# ---------------------------------------------------------------------------
# Addresses: one type, one validation, for every entry point
# ---------------------------------------------------------------------------

#: The longest trampoline the planner builds, plus its slot.
TRAMPOLINE_SPAN = 72


def is_canonical(address: int) -> bool:
    """Bits 63..47 all equal (48-bit virtual addresses)."""
    top = (address & MASK64) >> 47
    return top == 0 or top == (1 << 17) - 1


def code_address(value, what: str = "address", room: int = MAX_INSTRUCTION) -> int:
    """An address code can run at (a string or an int): canonical, with ``room`` bytes before 2^64 and before
    the non-canonical hole."""
    v = parse_address(value) if isinstance(value, str) else parse_int(value, what)
    if not 0 <= v <= MASK64:
        raise InputError(f"{what} {value!r} does not fit in 64 bits")
    if not is_canonical(v):
        raise InputError(f"{what} {v:#x} is not canonical (bits 63..47 must be all 0 or all 1): the CPU faults on "
                         f"it; e.g. 0xffffffff81000000")
    if v > MASK64 - room or not is_canonical(v + room - 1):
        raise InputError(f"{what} {v:#x}: {room} bytes there would wrap past 2^64 or run into the non-canonical hole")
    return v


def trampoline_address(value, what: str = "trampoline") -> int:
    """A trampoline address: canonical, with room for the longest trampoline."""
    return code_address(value, what, TRAMPOLINE_SPAN)


def memory_range(value, what: str = "range") -> tuple[int, int]:
    """ADDR:SIZE (or an (address, size) pair): at least one byte, canonical from start to end, not wrapping."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        addr, size = parse_int(value[0], what), parse_int(value[1], what)
    else:
        addr, size = parse_range(str(value))
    if size < 1:
        raise InputError(f"{what} {value!r}: the size must be at least 1 byte")
    if addr + size > MASK64 + 1:
        raise InputError(f"{what} {value!r} runs past 2^64")
    if not is_canonical(addr) or not is_canonical(addr + size - 1) or (addr >> 47) != ((addr + size - 1) >> 47):
        raise InputError(f"{what} {addr:#x}:{size:#x} is not canonical memory (it starts, ends or runs through the "
                         f"non-canonical hole)")
    return addr, size


def count(value, what: str = "count", limit: int = 1 << 31) -> int:
    """A whole number from 1 to ``limit``."""
    try:
        v = int(str(value), 10)
    except ValueError:
        raise InputError(f"{what} {value!r} is not a whole number") from None
    if not 1 <= v <= limit:
        raise InputError(f"{what} must be from 1 to {limit:,}, not {value}")
    return v


# ---------------------------------------------------------------------------
# Input files: every path a command reads is checked here, once
# ---------------------------------------------------------------------------

#: The most a command reads whole, by kind of input (an unpacked Debian -dbg vmlinux is about 900 MB).
MAX_READ = {"kernel image": 4 << 30, "kernel module": 1 << 30, "System.map": 1 << 30, "corpus": 64 << 20,
            "baseline": 1 << 30, "state": 64 << 20, "store": None, "file": 4 << 30, "ELF file": 8 << 30,
            "package": 8 << 30}


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def input_file(path: str, what: str = "file") -> str:
    """``path`` if it names a readable regular file (after symlinks) no larger than ``MAX_READ[what]``.

    A FIFO (reading it blocks), a device (``/dev/zero`` never ends), a directory or a socket is refused
    with one line naming it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file (expected a {what})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path}: is {_kind(st.st_mode)}, not a regular file (expected a {what})")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: not readable (the {what})")
    limit = MAX_READ.get(what, MAX_READ["file"])
    if limit is not None and st.st_size > limit:
        raise InputError(f"{path}: {st.st_size:,} bytes, more than a {what} can be ({limit:,})")
    return path


def open_input(path: str, what: str = "file"):
    """``open(path, 'rb')`` for an input file, checked by ``input_file`` on the descriptor it opens (so a FIFO
    swapped in after the check cannot block: it is opened non-blocking and refused)."""
    input_file(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"{path}: cannot open the {what}: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InputError(f"{path}: is {_kind(st.st_mode)}, not a regular file (expected a {what})")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_input(path: str, what: str = "file") -> bytes:
    with open_input(path, what) as handle:
        return handle.read()
