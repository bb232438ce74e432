"""Values a user types: hex bytes, addresses, address ranges.

Each parser returns the value or raises ``InputError`` with one line that
says what is wrong and what a good value looks like.
"""

from __future__ import annotations

import json

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
