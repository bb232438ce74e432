"""Leaf functions of the Debian 6.1 cloud vmlinux run by the differential check, with their
argument SPECs (``args``).  Each is a leaf in the boot-patched text (no call, no jump out:
``differential.is_leaf``) and every one of its instructions is proved for every context's
trampoline; ``tests/test_runtime.py`` checks both against the real image.
"""

from __future__ import annotations

from typing import NamedTuple


class LeafFunction(NamedTuple):
    name: str
    spec: str
    note: str


LEAF_FUNCTIONS: tuple[LeafFunction, ...] = (
    LeafFunction("strlen", "str:64", "lib/string.c"),
    LeafFunction("strnlen", "str:64,u64:0-80", "count may cut the string"),
    LeafFunction("strcmp", "str:8,str:8", "a three-letter alphabet, so strings often share prefixes"),
    LeafFunction("strncmp", "str:8,str:8,u64:0-10", ""),
    LeafFunction("strcasecmp", "str:8,str:8", "reads _ctype in .rodata"),
    LeafFunction("strncasecmp", "str:8,str:8,u64:0-10", ""),
    LeafFunction("strchr", "str:32,u64:96-100", "'a'..'c' found, '`' and 'd' not"),
    LeafFunction("strrchr", "str:32,u64:96-100", ""),
    LeafFunction("strnchr", "str:32,u64:0-40,u64:96-100", ""),
    LeafFunction("strspn", "str:32,str:3", ""),
    LeafFunction("strcspn", "str:32,str:3", ""),
    LeafFunction("strpbrk", "str:32,str:3", ""),
    LeafFunction("strcpy", "buf:64,str:32", "writes the destination"),
    LeafFunction("strncpy", "buf:64,str:32,u64:0-64", "writes the destination, NUL-padded"),
    LeafFunction("skip_spaces", "str:32", ""),
    LeafFunction("memcmp", "buf:16,buf:16,u64:0-16", ""),
    LeafFunction("memchr", "buf:64,u64:0-255,u64:0-64", ""),
    LeafFunction("memchr_inv", "buf:64,u64:0-255,u64:0-64", "8-byte words, then a byte tail"),
    LeafFunction("memscan", "buf:64,u64:0-255,u64:0-64", ""),
    LeafFunction("int_sqrt", "u64", "a loop over bit pairs"),
    LeafFunction("int_pow", "u64,u64:0-64", ""),
    LeafFunction("gcd", "u64:1-1000000,u64:1-1000000", "binary GCD: tzcnt/bsf, cmov"),
    LeafFunction("__sw_hweight64", "u64", ""),
    LeafFunction("__sw_hweight32", "u64", ""),
    LeafFunction("hex_to_bin", "u64:0-255", ""),
    LeafFunction("hex2bin", "buf:32,str:32,u64:0-16", "'a'..'c' are hex digits"),
    LeafFunction("__bitmap_and", "buf:64,buf:64,buf:64,u64:0-512", "writes the destination"),
    LeafFunction("__bitmap_or", "buf:64,buf:64,buf:64,u64:0-512", "writes the destination"),
    LeafFunction("__bitmap_equal", "buf:64,buf:64,u64:0-512", ""),
    LeafFunction("_find_first_bit", "buf:64,u64:0-512", ""),
    LeafFunction("_find_last_bit", "buf:64,u64:0-512", ""),
    LeafFunction("_find_next_bit", "buf:64,buf:64,u64:0-512,u64:0-512,u64:0-1,u64:0-1",
                 "6.1: (addr1, addr2, nbits, start, invert, le)"),
    LeafFunction("xxh32", "buf:64,u64:0-64,u64:0-0xffffffff", ""),
    LeafFunction("xxh64", "buf:64,u64:0-64,u64", ""),
    LeafFunction("siphash_1u64", "u64,buf:16", "the key is 16 bytes"),
    LeafFunction("siphash_2u64", "u64,u64,buf:16", ""),
)
