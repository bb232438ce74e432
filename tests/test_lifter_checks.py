"""``proof.lifter_checks``: the reasons VEX's model of an instruction is loose do not depend on where the
instruction is, which is what lets ``loose_reasons`` remember them by the bytes alone."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relocverify.image.functions import find_functions
from relocverify.image.loader import load_image
from relocverify.proof.lifter_checks import _loose, loose_reasons
from relocverify.x86.decode import decode
from relocverify.x86.instruction import Instruction

#: Instructions with loose reasons of every sort: undefined flags, FP, a helper's scratch store, a REX
#: prefix before a legacy one, RIP-relative and branching forms.
LOOSE = ["480fafc1", "48d3e0", "480fbcc1", "f20f58c1", "f20f5905f0ffffff", "0fa3c8", "480fa3c8", "40660f1f00",
         "e800000000", "0f8410000000", "f30fb8c1", "660f3a0bc100", "d9c0", "480fc7f0"]


def _elsewhere(rng: random.Random, address: int) -> list[int]:
    """Other addresses: another low 12 bits, another region, the last bytes of a page."""
    page_end = (rng.getrandbits(52) << 12) | (0x1000 - rng.randrange(1, 16))
    return [address ^ rng.randrange(1, 0x1000), 0xFFFFFFFFA0000000 + rng.getrandbits(24), page_end,
            rng.getrandbits(47)]


@pytest.fixture(scope="module")
def kernel_instructions(debian_kernels) -> list[Instruction]:
    kernel, _ = debian_kernels("debian-6.1-cloud")
    image = load_image(kernel.vmlinux)
    seen: dict[bytes, Instruction] = {}
    for fn in find_functions(image)[::97]:
        section = image.get_section(fn.section)
        data = section.data[fn.start - section.address:fn.start - section.address + fn.size]
        off = 0
        while off < len(data):
            d = decode(data[off:off + 15], fn.start + off)
            if isinstance(d, Instruction):
                seen.setdefault(d.raw, d)
            off += max(d.length, 1)
    return list(seen.values())


def test_loose_reasons_are_the_same_anywhere_on_the_kernels_instructions(kernel_instructions):
    rng = random.Random(11)
    sample = kernel_instructions + [d for h in LOOSE for d in [decode(bytes.fromhex(h), 0xFFFFFFFF81000100)]
                                    if isinstance(d, Instruction)]
    loose = 0
    for d in sample:
        here = _loose(d.raw, d.address, d.opname)
        loose += bool(here)
        for there in _elsewhere(rng, d.address):
            assert _loose(d.raw, there, d.opname) == here, (d.raw.hex(), hex(d.address), hex(there))
        assert loose_reasons(d) == here
    assert len(sample) > 3000 and loose > 100, (len(sample), loose)  # the comparison covers loose ones


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=1, max_size=15), st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 64) - 1))
def test_loose_reasons_are_the_same_anywhere_on_any_bytes(raw, a, b):
    d = decode(raw, a)
    if isinstance(d, Instruction):
        assert _loose(d.raw, a, d.opname) == _loose(d.raw, b, d.opname)
