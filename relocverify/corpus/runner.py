"""Corpora: instructions, historical bugs and decoder facts, as data with expected outcomes.

A corpus is a TOML file with an optional ``[defaults]`` table (``at``,
``tramp``) and an array of ``[[entry]]`` tables.  Every entry names one
instruction (``hex``) at an address A (``at``) relocated to T (``tramp``),
the outcomes it must have, and ``why``.  ``ENTRY_KEYS`` is the schema, one
row per key; ``load`` rejects an entry with a missing, unknown or malformed
key as an ``InputError`` naming the file and the entry.

What an entry can expect, checked in this order by ``run_entry``:

* the decode (``decode``, ``length``, ``disp``, ``imm``, ``prefixes``,
  ``opname``, the resolved known decoder bug ``note``, and what capstone
  alone said: ``capstone_length`` (0: capstone cannot decode) and
  ``capstone_disp``);
* the project's own plan (``plan`` kind, ``rule``, ``reason_contains``),
  and with ``random_placements = N`` the same kind and rule for N pairs
  (A, T) drawn from a generator seeded with the entry's id: A in
  ``random_at`` (default ``KERNEL_TEXT``), T in ``random_tramp`` (default:
  within ``NEAR_TRAMP`` bytes of A, i.e. rel32 reach less a margin);
* a vacuous precondition (``precondition = "vacuous"``): the foreign
  relocation's ``tracer_memory`` must be refused before any proof
  (``proof.precondition``); an entry whose ranges are refused without this
  key is an input error naming the entry;
* a verdict (``verdict``: one name, or a list of acceptable names).
  Without ``reloc`` or ``effects`` it is the verdict on the project's own
  plan.  With ``reloc`` (the bytes another tracer put at T) or ``effects``
  (another tracer's emulation, in the ``effects.effect_json`` format) it is
  the verdict on that *foreign relocation*, and ``own_verdict`` is then the
  verdict on the project's own plan for the same instruction.

Entry ids are the explicit ``id``, else ``<file stem>:<index>``.
The pure part (``load``, ``run_entry``, ``summarize``) does no printing;
the CLI edge of ``relocverify corpus run|fetch`` is ``relocverify.cli.corpus``.
"""

from __future__ import annotations

import random
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from ..errors import InputError
from ..inputs import code_address, memory_range, read_input, trampoline_address
from ..plan.effects import Branch, Effect, Jump, effects_from_json
from ..plan.plan import DEFAULT_AT, DEFAULT_TRAMP, make_plan
from ..plan.policy import RULES
from ..proof import prove as proof
from ..proof.verdict import Verdict
from ..x86.decode import decode
from ..x86.instruction import Instruction
from ..x86.registers import MASK64
KERNEL_TEXT = (0xFFFFFFFF81000000, 0xFFFFFFFF83000000)  # [lo, hi): where random A is drawn
# Random T stays this close to A: rel32 reach less 16 MiB, so that the small
# displacements and branch offsets of corpus entries stay in reach from T.
NEAR_TRAMP = (1 << 31) - (1 << 24)
DEFAULT_TIMEOUT_S = 10.0
BUNDLED = Path(__file__).resolve().parent.parent.parent / "corpora"

PLAN_KINDS = ("reject", "copy", "rewrite", "emulate")
DECODE_KINDS = {"instruction": "Instruction", "disagreement": "Disagreement", "undecodable": "Undecodable"}
VERDICTS = tuple(v.value for v in Verdict)
# Rule names made by plan.py itself rather than by a policy.RULES row.
PLAN_RULES = ("rip-scratch", "rip-out-of-range", "undecodable", "decoder-disagreement")


# ---------------------------------------------------------------------------
# Parsing entry values
# ---------------------------------------------------------------------------


def parse_hex(v: object) -> bytes:
    if not isinstance(v, str):
        raise ValueError("must be a string of hex bytes, e.g. \"f0 ff 05 00 00 00 00\"")
    raw = bytes.fromhex(v)  # ValueError names the bad position
    if not raw:
        raise ValueError("is empty")
    return raw


def parse_address(v: object) -> int:
    """A TOML int, or a string "0x..." (a kernel address does not fit TOML's signed 64-bit ints)."""
    if isinstance(v, bool):
        raise ValueError("must be an address")
    if isinstance(v, int):
        n = v
    elif isinstance(v, str) and v.lower().startswith("0x"):
        n = int(v, 16)
    else:
        raise ValueError("must be a hex string with a 0x prefix, e.g. \"0xffffffff81234560\"")
    if not 0 <= n <= MASK64:
        raise ValueError("does not fit in 64 bits")
    return n


def parse_range(v: object) -> tuple[int, int]:
    if not (isinstance(v, list) and len(v) == 2):
        raise ValueError("must be [lo, hi], two addresses")
    lo, hi = parse_address(v[0]), parse_address(v[1])
    if lo >= hi:
        raise ValueError("must have lo < hi")
    return lo, hi


def parse_pair(v: object) -> tuple[int, int]:
    if not (isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and 0 <= x <= 15 for x in v)):
        raise ValueError("must be [offset, size], two small integers")
    return v[0], v[1]


def parse_small(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 15:
        raise ValueError("must be an integer from 0 to 15")
    return v


def parse_count(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 100_000:
        raise ValueError("must be an integer from 0 to 100000")
    return v


def parse_text(v: object) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError("must be a non-empty string")
    return v


def _one_of(names: Sequence[str]) -> Callable[[object], str]:
    def parse(v: object) -> str:
        if v not in names:
            raise ValueError(f"must be one of {', '.join(names)}")
        return v
    return parse


def parse_verdicts(v: object) -> frozenset[str]:
    items = v if isinstance(v, list) else [v]
    if not items:
        raise ValueError("must name at least one verdict")
    return frozenset(_one_of(VERDICTS)(x) for x in items)


def parse_rule(v: object) -> str:
    return _one_of(tuple(r.name for r in RULES) + PLAN_RULES)(v)


def parse_effects(v: object) -> tuple[Effect, ...]:
    """A list of effect tables, as ``effects.effect_json`` writes them (``text`` is ignored)."""
    effects = effects_from_json(v)
    if not effects or not isinstance(effects[-1], (Jump, Branch)) \
            or any(isinstance(x, (Jump, Branch)) for x in effects[:-1]):
        raise ValueError("must end in exactly one jump or branch")
    return effects


# ---------------------------------------------------------------------------
# The entry schema: one row per key
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    parse: Callable[[object], object]
    required: bool = False


ENTRY_KEYS: dict[str, Key] = {
    "id": Key(parse_text),
    "hex": Key(parse_hex, required=True),
    "why": Key(parse_text, required=True),
    "at": Key(lambda v: code_address(v, "at")),
    "tramp": Key(lambda v: trampoline_address(v, "tramp")),
    "source": Key(parse_text),
    "tracer": Key(parse_text),
    # decode facts
    "decode": Key(_one_of(tuple(DECODE_KINDS))),
    "length": Key(parse_small),
    "disp": Key(parse_pair),
    "imm": Key(parse_pair),
    "prefixes": Key(lambda v: parse_hex(v) if v else b""),
    "opname": Key(parse_text),
    "note": Key(parse_text),
    "capstone_length": Key(parse_small),
    "capstone_disp": Key(parse_pair),
    # the project's own plan
    "plan": Key(_one_of(PLAN_KINDS)),
    "rule": Key(parse_rule),
    "reason_contains": Key(parse_text),
    "random_placements": Key(parse_count),
    "random_at": Key(parse_range),
    "random_tramp": Key(parse_range),
    # verdicts, and foreign relocations
    "verdict": Key(parse_verdicts),
    "reloc": Key(parse_hex),
    "tracer_memory": Key(lambda v: tuple(memory_range(x, "tracer_memory") for x in v)),
    "effects": Key(parse_effects),
    "own_verdict": Key(parse_verdicts),
    # a foreign relocation whose tracer_memory must be refused before any proof (proof.precondition)
    "precondition": Key(_one_of(("vacuous",))),
}
FILE_KEYS = ("title", "description", "defaults", "entry", "unreachable")


@dataclass(frozen=True)
class Entry:
    id: str
    path: str
    raw: bytes
    at: int
    tramp: int
    why: str
    facts: dict = field(default_factory=dict, compare=False)  # every other key, parsed

    def get(self, key: str, default=None):
        return self.facts.get(key, default)

    @property
    def foreign(self) -> bool:
        return "reloc" in self.facts or "effects" in self.facts


def _bad(path: str, where: str, message: str) -> InputError:
    return InputError(f"{path}: {where}: {message}")


def _entry(path: str, index: int, table: object, defaults: dict) -> Entry:
    where = f"entry {index}"
    if not isinstance(table, dict):
        raise _bad(path, where, "is not a table")
    if isinstance(table.get("id"), str):
        where += f" ({table['id']})"
    unknown = sorted(set(table) - set(ENTRY_KEYS))
    if unknown:
        raise _bad(path, where, f"unknown key(s) {', '.join(unknown)}; known: {', '.join(ENTRY_KEYS)}")
    missing = [k for k, spec in ENTRY_KEYS.items() if spec.required and k not in table]
    if missing:
        raise _bad(path, where, f"missing required key(s) {', '.join(missing)}")
    if "reloc" in table and "effects" in table:
        raise _bad(path, where, "give reloc or effects, not both")
    if "own_verdict" in table and not ("reloc" in table or "effects" in table):
        raise _bad(path, where, "own_verdict is only for foreign relocations (reloc or effects)")
    facts = {}
    for key, value in {**defaults, **table}.items():
        try:
            facts[key] = ENTRY_KEYS[key].parse(value)
        except (ValueError, TypeError, KeyError, InputError) as e:
            raise _bad(path, where, f"{key} = {value!r}: {e}") from None
    stem = Path(path).stem
    return Entry(id=facts.pop("id", f"{stem}:{index}"), path=path, raw=facts.pop("hex"),
                 at=facts.pop("at", DEFAULT_AT), tramp=facts.pop("tramp", DEFAULT_TRAMP),
                 why=facts.pop("why"), facts=facts)


def load_file(path: str | Path) -> list[Entry]:
    """Every entry of one corpus file, validated."""
    path = str(path)
    try:
        doc = tomllib.loads(read_input(path, "corpus").decode("utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{path}: not valid TOML: {e}") from None
    except (ValueError, RecursionError):  # bytes that are not UTF-8 text, or nesting past the parser's depth
        raise InputError(f"{path}: not a corpus: a corpus is a UTF-8 TOML text file") from None
    unknown = sorted(set(doc) - set(FILE_KEYS))
    if unknown:
        raise InputError(f"{path}: unknown top-level key(s) {', '.join(unknown)}; entries go in [[entry]] tables")
    defaults = doc.get("defaults", {})
    if not isinstance(defaults, dict) or set(defaults) - {"at", "tramp"}:
        raise InputError(f"{path}: [defaults] may only set at and tramp")
    entries = doc.get("entry", [])
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{path}: no [[entry]] tables")
    return [_entry(path, i, t, defaults) for i, t in enumerate(entries)]


def unreachable_rules(path: str | Path) -> dict[str, str]:
    """The ``[[unreachable]]`` tables of a corpus: rule name -> why no instruction reaches it."""
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    out = {}
    for k, t in enumerate(doc.get("unreachable", [])):
        if not isinstance(t, dict) or set(t) != {"rule", "why"}:
            raise InputError(f"{path}: unreachable {k}: needs exactly rule and why")
        out[parse_rule(t["rule"])] = parse_text(t["why"])
    return out


def bundled_paths() -> list[Path]:
    return sorted(BUNDLED.glob("*.toml"))


def load(paths: Iterable[str | Path] = ()) -> list[Entry]:
    """Entries of the given files (default: the bundled corpora), ids unique across them."""
    paths = list(paths) or bundled_paths()
    if not paths:
        raise InputError(f"no corpora found in {BUNDLED}: give corpus files")
    entries = [e for p in paths for e in load_file(p)]
    seen: dict[str, str] = {}
    for e in entries:
        if e.id in seen:
            raise InputError(f"{e.path}: entry id {e.id!r} is also used in {seen[e.id]}")
        seen[e.id] = e.path
    return entries


# ---------------------------------------------------------------------------
# Running entries
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One expectation of an entry, and what was found."""

    what: str
    expected: str
    got: str
    ok: bool


@dataclass(frozen=True)
class EntryResult:
    entry: Entry
    checks: tuple[Check, ...]
    verdicts: tuple[str, ...] = ()  # every verdict obtained, for the summary counts

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def as_json(self) -> dict:
        return {"id": self.entry.id, "file": self.entry.path, "hex": self.entry.raw.hex(" "),
                "ok": self.ok, "verdicts": list(self.verdicts),
                "checks": [{"what": c.what, "expected": c.expected, "got": c.got, "ok": c.ok} for c in self.checks]}


def _check(what: str, expected: object, got: object) -> Check:
    return Check(what, str(expected), str(got), expected == got)


def _fmt_pair(p) -> str:
    return f"[{p[0]}, {p[1]}]"


def decode_checks(entry: Entry, decoded) -> list[Check]:
    checks = []
    kind = type(decoded).__name__
    if "decode" in entry.facts:
        checks.append(_check("decode", entry.get("decode"), {v: k for k, v in DECODE_KINDS.items()}[kind]))
    if "length" in entry.facts:
        checks.append(_check("length", entry.get("length"), decoded.length))
    ins = decoded if isinstance(decoded, Instruction) else None
    for key, got in (("disp", ins and (ins.disp_offset, ins.disp_size)),
                     ("imm", ins and (ins.imm_offset, ins.imm_size))):
        if key in entry.facts:
            checks.append(_check(key, _fmt_pair(entry.get(key)), _fmt_pair(got) if got else kind))
    if "prefixes" in entry.facts:
        checks.append(_check("prefixes", entry.get("prefixes").hex(), ins.prefixes.hex() if ins else kind))
    if "opname" in entry.facts:
        checks.append(_check("opname", entry.get("opname"), ins.opname if ins else kind))
    if "note" in entry.facts:
        names = [n.split(":")[0] for n in ins.notes] if ins else []
        checks.append(Check("note", entry.get("note"), ", ".join(names) or "(none)", entry.get("note") in names))
    cs = next((a for a in decoded.answers if a.decoder == "capstone"), None)
    if "capstone_length" in entry.facts:
        checks.append(_check("capstone length", entry.get("capstone_length"), (cs and cs.length) or 0))
    if "capstone_disp" in entry.facts:
        checks.append(_check("capstone disp", _fmt_pair(entry.get("capstone_disp")),
                             _fmt_pair((cs.disp_offset, cs.disp_size)) if cs else "(no answer)"))
    return checks


def plan_checks(entry: Entry, plan) -> list[Check]:
    checks = []
    if "plan" in entry.facts:
        checks.append(_check("plan", entry.get("plan"), plan.kind.value))
    if "rule" in entry.facts:
        checks.append(_check("rule", entry.get("rule"), plan.rule))
    if "reason_contains" in entry.facts:
        want = entry.get("reason_contains")
        checks.append(Check("reason", f"contains {want!r}", plan.reason, want in plan.reason))
    return checks


def placements(entry: Entry, n: int) -> list[tuple[int, int]]:
    """N (A, T) pairs drawn by a generator seeded with the entry id: the same pairs every run."""
    rng = random.Random(f"relocverify-corpus:{entry.id}")
    lo, hi = entry.get("random_at", KERNEL_TEXT)
    pairs = []
    for _ in range(n):
        a = rng.randrange(lo, hi)
        tlo, thi = entry.get("random_tramp") or (max(a - NEAR_TRAMP, 0), min(a + NEAR_TRAMP, MASK64 - 0xFFFF))
        pairs.append((a, rng.randrange(tlo, thi)))
    return pairs


def placement_check(entry: Entry) -> Check | None:
    n = entry.get("random_placements", 0)
    if not n:
        return None
    want = (entry.get("plan"), entry.get("rule"))
    for a, t in placements(entry, n):
        plan = make_plan(decode(entry.raw, a), t)
        got = (plan.kind.value, plan.rule)
        if any(w is not None and w != g for w, g in zip(want, got)):
            return Check("placements", f"{n} x {'/'.join(w for w in want if w)}",
                         f"{'/'.join(got)} at A={a:#x} T={t:#x}", False)
    return Check("placements", f"{n} x {'/'.join(w for w in want if w)}", f"{n} ok", True)


def _verdict_check(what: str, expected: frozenset[str], result) -> Check:
    got = result.verdict.value
    text = got if got in expected else f"{got} ({result.reason})"
    return Check(what, "|".join(sorted(expected)), text, got in expected)


def run_entry(entry: Entry, timeout_ms: int = int(DEFAULT_TIMEOUT_S * 1000), prove: bool = True) -> EntryResult:
    """Decode, plan and (with ``prove``) prove one entry; compare with its expectations."""
    decoded = decode(entry.raw, entry.at)
    plan = make_plan(decoded, entry.tramp)
    checks = decode_checks(entry, decoded) + plan_checks(entry, plan)
    placed = placement_check(entry)
    if placed is not None:
        checks.append(placed)
    verdicts: list[str] = []
    if prove and ("verdict" in entry.facts or "own_verdict" in entry.facts):
        if entry.foreign and "verdict" in entry.facts:
            if "reloc" in entry.facts:
                try:
                    result = proof.prove_relocation(decoded, entry.get("reloc"), entry.tramp, timeout_ms=timeout_ms,
                                                    tracer_memory=entry.get("tracer_memory", ()))
                except InputError as exc:
                    if entry.get("precondition") != "vacuous":
                        raise _bad(entry.path, f"entry {entry.id}", str(exc)) from None
                    checks.append(Check("precondition", "vacuous: refused", "refused", True))
                    return EntryResult(entry, tuple(checks), tuple(verdicts))
                if entry.get("precondition") == "vacuous":
                    checks.append(Check("precondition", "vacuous: refused", f"accepted ({result.verdict.value})",
                                        False))
            else:
                result = proof.prove_effects(decoded, entry.get("effects"), entry.tramp, timeout_ms=timeout_ms)
            checks.append(_verdict_check("foreign verdict", entry.get("verdict"), result))
            verdicts.append(result.verdict.value)
        own = entry.get("own_verdict") if entry.foreign else entry.get("verdict")
        if own is not None:
            result = proof.prove_plan(decoded, plan, timeout_ms=timeout_ms)
            checks.append(_verdict_check("verdict", own, result))
            verdicts.append(result.verdict.value)
    return EntryResult(entry, tuple(checks), tuple(verdicts))


@dataclass(frozen=True)
class Summary:
    entries: int
    ok: int
    verdicts: tuple[tuple[str, int], ...]  # every Verdict name, in Verdict order, with its count

    @property
    def missed(self) -> int:
        return self.entries - self.ok

    def as_json(self) -> dict:
        return {"entries": self.entries, "ok": self.ok, "missed": self.missed, "verdicts": dict(self.verdicts)}

    def render(self) -> str:
        counts = ", ".join(f"{name} {n}" for name, n in self.verdicts)
        return f"{self.entries} entries: {self.ok} ok, {self.missed} missed; verdicts: {counts}\n"


def summarize(results: Sequence[EntryResult]) -> Summary:
    got = [v for r in results for v in r.verdicts]
    return Summary(len(results), sum(r.ok for r in results), tuple((v, got.count(v)) for v in VERDICTS))


def render_result(r: EntryResult) -> str:
    shown = [c for c in r.checks if not c.ok] or [c for c in r.checks if "verdict" in c.what or c.what == "plan"]
    details = "; ".join(f"{c.what}: expected {c.expected}, got {c.got}" if not c.ok else f"{c.what} {c.got}"
                        for c in shown)
    return f"{'ok  ' if r.ok else 'MISS'} {_printable(r.entry.id)}  {_printable(details)}\n"


def _printable(text: str) -> str:
    """Text from a corpus file, safe for a terminal: control characters as \\xNN."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
