"""Which CPU the judge is, as data: the record the form table keeps per CPU, and the feature mask.

``CpuIdentity`` is what ``concrete.cpu.identity()`` reports of this machine
and what ``proof/validated_forms.json`` keeps in its top-level ``cpus``
list: the CPUID vendor string, display family, model and stepping, the
feature flags that decide what the judge can load, run and compare (every
``avx*`` flag, ``fma``, ``f16c``, ``fsgsbase``, spelled as in
/proc/cpuinfo) and XCR0 (the XSAVE state components the judge loads and
stores).  A field recorded as None was not known when the record was made.

``FeatureMask`` hides features this CPU has, so that the judge behaves as on
a CPU without them: it is read from ``RELOCVERIFY_CPU_FEATURES``
(``current_mask``), e.g. ``-avx512`` or ``-avx512,-avx2``.  Each name a mask
may hide is a row of ``MASKABLE``: the flags it removes (and so the
instructions the judge refuses to run) and the XCR0 components it clears (so
that xsave/xrstor are given a requested-feature bitmap without them and the
CPU neither loads nor stores that state).  A masked identity lists what was
hidden in ``masked``: it is a simulated CPU, not another machine.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from ..errors import InputError

FEATURE_MASK_ENV = "RELOCVERIFY_CPU_FEATURES"

#: XCR0 state components (SDM Vol. 1 §13.1).
X87_STATE, SSE_STATE, AVX_STATE = 0x1, 0x2, 0x4
OPMASK_STATE, ZMM_HI256_STATE, HI16_ZMM_STATE = 0x20, 0x40, 0x80
AVX512_STATE = OPMASK_STATE | ZMM_HI256_STATE | HI16_ZMM_STATE

_VEX_ONLY = frozenset({"fma", "f16c", "vaes", "vpclmulqdq"})  # no legacy-SSE encoding: they need the AVX state


def judge_flag(name: str) -> bool:
    """A /proc/cpuinfo flag that decides what the judge can load, run or compare (recorded in an identity)."""
    return name.startswith("avx") or name in _VEX_ONLY or name == "fsgsbase"


@dataclass(frozen=True)
class Maskable:
    """One name a feature mask may hide: which flags go with it, which XCR0 components, and what the judge
    then neither loads, compares nor runs."""

    name: str
    hides_flag: Callable[[str], bool]
    xcr0: int
    what: str


MASKABLE: dict[str, Maskable] = {m.name: m for m in (
    Maskable("avx512", lambda f: f.startswith("avx512"), AVX512_STATE,
             "AVX-512: zmm16-31, zmm0-15 bits 511:256 and k0-7 are neither loaded nor compared; EVEX "
             "instructions are not run"),
    Maskable("avx2", lambda f: f.startswith(("avx512", "avx2", "avx_")), AVX512_STATE,
             "AVX2 (and AVX-512, which no CPU has without it): AVX2 and EVEX instructions are not run"),
    Maskable("avx", lambda f: f.startswith("avx") or f in _VEX_ONLY, AVX512_STATE | AVX_STATE,
             "AVX (and AVX2, AVX-512): ymm bits 255:128 and up are neither loaded nor compared; VEX and EVEX "
             "instructions are not run"),
)}


@dataclass(frozen=True)
class FeatureMask:
    """The features hidden from the judge (names of ``MASKABLE``), sorted; empty: none."""

    hidden: tuple[str, ...] = ()

    def flags(self, flags: frozenset[str]) -> frozenset[str]:
        """``flags`` without the hidden ones."""
        if not self.hidden:
            return flags
        rows = [MASKABLE[n] for n in self.hidden]
        return frozenset(f for f in flags if not any(r.hides_flag(f) for r in rows))

    def xcr0(self, xcr0: int) -> int:
        """``xcr0`` without the hidden state components."""
        for n in self.hidden:
            xcr0 &= ~MASKABLE[n].xcr0
        return xcr0

    def describe(self) -> str:
        return ",".join(f"-{n}" for n in self.hidden)


NO_MASK = FeatureMask()


@lru_cache(maxsize=16)
def parse_mask(text: str) -> FeatureMask:
    """``"-avx512"``, ``"-avx512,-avx2"`` (commas or spaces) -> a ``FeatureMask``; raises ``InputError``."""
    hidden = set()
    for item in re.split(r"[,\s]+", text.strip()):
        if not item:
            continue
        if not item.startswith("-") or item[1:] not in MASKABLE:
            raise InputError(f"{FEATURE_MASK_ENV}={text!r}: {item!r} is not a feature the judge can hide; write "
                             f"-NAME for NAME in {', '.join(MASKABLE)} (a mask hides features, it cannot add any), "
                             f"e.g. {FEATURE_MASK_ENV}=-avx512")
        hidden.add(item[1:])
    return FeatureMask(tuple(sorted(hidden)))


def current_mask() -> FeatureMask:
    """The mask ``RELOCVERIFY_CPU_FEATURES`` names now (read at every call: a test may set it)."""
    return parse_mask(os.environ.get(FEATURE_MASK_ENV, ""))


def unseen_state(xcr0: int) -> tuple[str, ...]:
    """The register state a judge with this XCR0 neither loads nor compares (beyond what no judge sees)."""
    out = []
    if not xcr0 & AVX_STATE:
        out.append("ymm0-15 bits 255:128")
    if xcr0 & AVX512_STATE != AVX512_STATE:
        out += ["zmm0-15 bits 511:256", "zmm16-31", "k0-7"]
    return tuple(out)


@dataclass(frozen=True)
class CpuIdentity:
    """One CPU a judgement was made on; see the module doc."""

    vendor: str  # CPUID leaf 0: "AuthenticAMD", "GenuineIntel", ...
    family: int | None
    model: int | None
    stepping: int | None
    features: tuple[str, ...] | None  # the judge's flags (``judge_flag``) it has, after the mask; sorted
    xcr0: int  # the state components the judge loads and stores, after the mask
    masked: tuple[str, ...] = ()  # what a feature mask hid: a simulated CPU
    note: str = ""

    @property
    def avx512(self) -> bool:
        return self.xcr0 & AVX512_STATE == AVX512_STATE

    def unseen(self) -> tuple[str, ...]:
        return unseen_state(self.xcr0)

    def covers(self, other: CpuIdentity) -> bool:
        """Every field recorded here (not None) is ``other``'s: ``other`` may be the CPU this record meant."""
        return self.vendor == other.vendor and self.xcr0 == other.xcr0 and self.masked == other.masked and all(
            mine is None or mine == theirs for mine, theirs in ((self.family, other.family), (self.model, other.model),
                                                               (self.stepping, other.stepping),
                                                               (self.features, other.features)))

    def describe(self) -> str:
        """``AuthenticAMD family 0x1a model 0x2 stepping 1, xcr0 0xe7 (masked -avx512)``."""
        parts = [self.vendor]
        parts += [f"{k} {v:#x}" if k != "stepping" else f"{k} {v}" for k, v in
                  (("family", self.family), ("model", self.model), ("stepping", self.stepping)) if v is not None]
        text = " ".join(parts) + f", xcr0 {self.xcr0:#x}"
        if self.masked:
            text += " (masked " + ",".join(f"-{n}" for n in self.masked) + ")"
        return text

    def as_json(self) -> dict:
        doc = {"vendor": self.vendor, "family": self.family, "model": self.model, "stepping": self.stepping,
               "features": list(self.features) if self.features is not None else None, "xcr0": hex(self.xcr0),
               "not_compared": list(self.unseen())}
        if self.masked:
            doc["masked"] = list(self.masked)
        if self.note:
            doc["note"] = self.note
        return doc

    @classmethod
    def from_json(cls, doc: dict) -> CpuIdentity:
        features = doc.get("features")
        return cls(doc["vendor"], doc.get("family"), doc.get("model"), doc.get("stepping"),
                   tuple(features) if features is not None else None, int(doc["xcr0"], 16),
                   tuple(doc.get("masked", ())), doc.get("note", ""))
