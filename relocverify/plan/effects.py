"""The declarative effect language of ``emulate`` plans.

An emulate plan does not run the instruction anywhere: the probe handler
performs a short, fixed program of effects on the trapped register frame
instead.  The program is data, so that the checker (``proof.py``) can give
it a semantics and prove it equal to the original instruction's VEX IR, and
a runtime can interpret the very same program concretely.

Values:   Const(v) | Reg(name) | Temp(name) | Load(Address, size)
Effects:  Let(name, value)       read a value now (e.g. the call target, before the push)
          Push(value)            rsp -= 8; mem64[rsp] = value
          AddRsp(delta)          rsp += delta
          Jump(value)            rip = value
          Branch(cond, taken, fallthrough)
                                 rip = taken if CONDITIONS[cond](flags) else fallthrough

Every program ends in exactly one Jump or Branch.  Addresses follow the
hardware: base + index*scale + disp, plus the fs/gs base under a segment
override, wrapped to 64 bits (or 32 under a 0x67 prefix).  A RIP-relative
operand is resolved when the plan is made, to Address(base=None, disp=A+len+disp).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from typing import Callable, Union

from ..errors import InputError
from ..inputs import parse_int
from ..x86.registers import MASK64


@dataclass(frozen=True)
class Const:
    value: int

    def describe(self) -> str:
        return hex(self.value)


@dataclass(frozen=True)
class Reg:
    name: str  # a 64-bit GPR name

    def describe(self) -> str:
        return f"%{self.name}"


@dataclass(frozen=True)
class Temp:
    name: str

    def describe(self) -> str:
        return self.name


@dataclass(frozen=True)
class Address:
    base: str | None = None
    index: str | None = None
    scale: int = 1
    disp: int = 0
    segment: str | None = None  # 'fs' | 'gs' | None
    address_size: int = 64

    def describe(self) -> str:
        seg = f"%{self.segment}:" if self.segment else ""
        parts = [f"%{self.base}" if self.base else "", f"%{self.index}*{self.scale}" if self.index else ""]
        inner = "+".join(p for p in parts if p)
        return f"{seg}[{inner}{'+' if inner else ''}{self.disp:#x}]" if self.disp >= 0 or not inner else f"{seg}[{inner}-{-self.disp:#x}]"


@dataclass(frozen=True)
class Load:
    address: Address
    size: int = 8

    def describe(self) -> str:
        return f"mem{self.size * 8}{self.address.describe()}"


Value = Union[Const, Reg, Temp, Load]


@dataclass(frozen=True)
class Let:
    name: str
    value: Value

    def describe(self) -> str:
        return f"{self.name} = {self.value.describe()}"


@dataclass(frozen=True)
class Push:
    value: Value

    def describe(self) -> str:
        return f"push {self.value.describe()}"


@dataclass(frozen=True)
class AddRsp:
    delta: int

    def describe(self) -> str:
        return f"rsp += {self.delta:#x}"


@dataclass(frozen=True)
class Jump:
    to: Value

    def describe(self) -> str:
        return f"jump {self.to.describe()}"


@dataclass(frozen=True)
class Branch:
    cond: str
    taken: int
    fallthrough: int

    def describe(self) -> str:
        text = f" ({CONDITIONS[self.cond].text})" if self.cond in CONDITIONS else ""
        return f"jump {self.taken:#x} if {self.cond}{text} else {self.fallthrough:#x}"


Effect = Union[Let, Push, AddRsp, Jump, Branch]


@dataclass(frozen=True)
class Condition:
    text: str
    test: Callable  # (cf, pf, zf, sf, of) -> bit; written with & | ^ so it works on ints and on bit-vectors


# The x86 condition codes (SDM Vol. 1, Appendix B), one row each.  The tests
# use only &, |, ^ and ~x & 1 so that the same row evaluates concrete flags
# (ints 0/1) and symbolic 1-bit vectors alike.
CONDITIONS: dict[str, Condition] = {
    "o": Condition("OF=1", lambda cf, pf, zf, sf, of: of),
    "no": Condition("OF=0", lambda cf, pf, zf, sf, of: of ^ 1),
    "b": Condition("CF=1", lambda cf, pf, zf, sf, of: cf),
    "ae": Condition("CF=0", lambda cf, pf, zf, sf, of: cf ^ 1),
    "e": Condition("ZF=1", lambda cf, pf, zf, sf, of: zf),
    "ne": Condition("ZF=0", lambda cf, pf, zf, sf, of: zf ^ 1),
    "be": Condition("CF=1 or ZF=1", lambda cf, pf, zf, sf, of: cf | zf),
    "a": Condition("CF=0 and ZF=0", lambda cf, pf, zf, sf, of: (cf | zf) ^ 1),
    "s": Condition("SF=1", lambda cf, pf, zf, sf, of: sf),
    "ns": Condition("SF=0", lambda cf, pf, zf, sf, of: sf ^ 1),
    "p": Condition("PF=1", lambda cf, pf, zf, sf, of: pf),
    "np": Condition("PF=0", lambda cf, pf, zf, sf, of: pf ^ 1),
    "l": Condition("SF!=OF", lambda cf, pf, zf, sf, of: sf ^ of),
    "ge": Condition("SF=OF", lambda cf, pf, zf, sf, of: sf ^ of ^ 1),
    "le": Condition("ZF=1 or SF!=OF", lambda cf, pf, zf, sf, of: zf | (sf ^ of)),
    "g": Condition("ZF=0 and SF=OF", lambda cf, pf, zf, sf, of: (zf | (sf ^ of)) ^ 1),
}


_FLAG_NAMES = ("cf", "pf", "zf", "sf", "of")


def condition_test(cond: str) -> Callable:
    """The test for a condition: a CONDITIONS name ('le'), or a formula over
    cf pf zf sf of with & | ^ ~ and parentheses (e.g. 'zf & (sf ^ of)'), so
    that foreign emulations, including wrong ones, can be written down."""
    if cond in CONDITIONS:
        return CONDITIONS[cond].test

    try:
        tree = ast.parse(cond, mode="eval").body
    except SyntaxError:
        raise ValueError(f"condition {cond!r} is neither a condition code nor a flag formula") from None

    def ev(node, flags):
        if isinstance(node, ast.Name) and node.id in _FLAG_NAMES:
            return flags[_FLAG_NAMES.index(node.id)]
        if isinstance(node, ast.Constant) and node.value in (0, 1):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert):
            return ev(node.operand, flags) ^ 1
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr, ast.BitXor)):
            a, b = ev(node.left, flags), ev(node.right, flags)
            return a & b if isinstance(node.op, ast.BitAnd) else a | b if isinstance(node.op, ast.BitOr) else a ^ b
        raise ValueError(f"condition {cond!r}: only cf pf zf sf of, 0, 1, &, |, ^, ~ are allowed")

    ev(tree, (0, 0, 0, 0, 0))  # validate now, not when the probe fires
    return lambda cf, pf, zf, sf, of: ev(tree, (cf, pf, zf, sf, of))


def value_json(v: Value) -> object:
    if isinstance(v, Const):
        return hex(v.value)
    if isinstance(v, Reg):
        return {"reg": v.name}
    if isinstance(v, Temp):
        return {"temp": v.name}
    a = v.address
    return {"load": {"base": a.base, "index": a.index, "scale": a.scale, "disp": a.disp,
                     "segment": a.segment, "address_size": a.address_size}, "size": v.size}


def effect_json(e: Effect) -> dict:
    if isinstance(e, Let):
        return {"op": "let", "name": e.name, "value": value_json(e.value), "text": e.describe()}
    if isinstance(e, Push):
        return {"op": "push", "value": value_json(e.value), "text": e.describe()}
    if isinstance(e, AddRsp):
        return {"op": "add_rsp", "delta": e.delta, "text": e.describe()}
    if isinstance(e, Jump):
        return {"op": "jump", "to": value_json(e.to), "text": e.describe()}
    return {"op": "branch", "cond": e.cond, "taken": hex(e.taken), "fallthrough": hex(e.fallthrough),
            "text": e.describe()}


def _value_from_json(doc: object) -> Value:
    if isinstance(doc, (str, int)) and not isinstance(doc, bool):
        return Const(parse_int(doc, "a constant") & MASK64)
    if isinstance(doc, dict) and "reg" in doc:
        return Reg(str(doc["reg"]))
    if isinstance(doc, dict) and "temp" in doc:
        return Temp(str(doc["temp"]))
    if isinstance(doc, dict) and isinstance(doc.get("load"), dict):
        a = doc["load"]
        address = Address(base=a.get("base"), index=a.get("index"), scale=parse_int(a.get("scale", 1), "scale"),
                             disp=parse_int(a.get("disp", 0), "disp"), segment=a.get("segment"),
                             address_size=parse_int(a.get("address_size", 64), "address_size"))
        return Load(address, parse_int(doc.get("size", 8), "load size"))
    raise InputError(f"not an effect value: {json.dumps(doc)} (expected '0x..', {{'reg': ..}}, "
                     f"{{'temp': ..}} or {{'load': {{..}}, 'size': n}})")


def _effect_from_json(doc: object) -> Effect:
    if not isinstance(doc, dict):
        raise InputError(f"an effect must be a JSON object, not {json.dumps(doc)}")
    op = doc.get("op")
    try:
        if op == "let":
            return Let(str(doc["name"]), _value_from_json(doc["value"]))
        if op == "push":
            return Push(_value_from_json(doc["value"]))
        if op == "add_rsp":
            return AddRsp(parse_int(doc["delta"], "add_rsp delta"))
        if op == "jump":
            return Jump(_value_from_json(doc["to"]))
        if op == "branch":
            cond = str(doc["cond"])
            if cond not in CONDITIONS:
                raise InputError(f"unknown branch condition {cond!r}; one of {', '.join(CONDITIONS)}")
            return Branch(cond, parse_int(doc["taken"], "taken") & MASK64,
                             parse_int(doc["fallthrough"], "fallthrough") & MASK64)
    except KeyError as e:
        raise InputError(f"effect {op!r} lacks the key {e.args[0]!r}") from None
    raise InputError(f"unknown effect op {op!r}; one of let, push, add_rsp, jump, branch")


def effects_from_json(doc: object) -> tuple[Effect, ...]:
    """The inverse of ``effects.effect_json`` over a list; the "text" keys are ignored."""
    if not isinstance(doc, list):
        raise InputError("effects must be a JSON list of effect objects, as in a plan's \"effects\"")
    return tuple(_effect_from_json(e) for e in doc)
