"""The tracer audit: every instruction of an image in exactly one bucket per tracer.

Buckets (``BUCKETS``), from the tracer's answer (``model.Answer``) and relocverify's own
verdict for the same instruction (the store's row, plans and kernel sites included):

  agree                    the tracer relocates or emulates, and its relocation is proved
  tracer-wrong             the tracer relocates or emulates, and its relocation is refuted
                           (a counterexample unicorn replays, and a replay command)
  tracer-refuses-provable  the tracer refuses, and relocverify proves a plan for it
  both-refuse              the tracer refuses, and relocverify has no proof either
                           (its plan is rejected, unknown or opaque)
  unknown                  the tracer relocates, and there is no verdict on it (solver unknown,
                           opaque semantics, an answer the effects language cannot express,
                           or an original our decoders do not agree on)

How it scales: an instance key (``engine.keys``) determines the instruction's bytes (with the
displacement and operand immediate zeroed only for instructions that fall through) and where
every address it refers to lies from T.  A tracer model's answer depends on exactly those
facts (its decisions read opcode, ModRM, SIB, prefixes and whether a target is in rel32 reach;
the displacement and immediate values they do read only appear in branch and RIP-relative
instructions, whose keys keep them as roles), so the answer's verdict is computed once per
(tracer, key) and stands for every instance.  Three things are per instance and applied first:
address blacklists (kernel sites), kprobes' ``can_probe`` walk, and a key whose target is A or
A+len (``keys.per_instance``).  An instance whose kernel decoder length differs from ours is
answered on its own too.  The proofs themselves are filed under ``proof.cache_key`` keys
(``judge``): shared between tracers and with the engine's own plans.

Outcomes per (tracer, key) are kept in ``tracers/`` in the proof-cache directory (``OutcomeMemo``), under
the tools' cache tag and a digest of the tracer models' source, so a warm audit proves nothing.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..concrete.cpu import identity
from ..engine.keys import KeyMaker, per_instance
from ..outputs import write_atomic
from ..proof.cache_key import cache_tag, reusable
from ..proof.verdict import ProofResult, Verdict
from ..store.cache import CachedProof, ProofCache
from ..store.store import Results, site_kinds
from ..x86.decode import decode
from ..x86.instruction import Instruction
from ..x86.registers import MASK64
from . import linux_facts
from .judge import CPU_METHODS, UNCONFIRMED, proof_key, prove_answer, replay_unconfirmed, reusable_here
from .model import Context, Refuse, RelocateBlock, machine_of

BUCKETS = ("agree", "tracer-wrong", "tracer-refuses-provable", "both-refuse", "unknown")
EXAMPLES = 3  # instances kept per group
_HEX = re.compile(r"0x[0-9a-f]+|\b[0-9a-f]{6,}\b")


@dataclass(frozen=True)
class TracerOutcome:
    """A tracer's answer for one instruction (or one key), judged."""

    kind: str  # 'refuse' | 'relocate' | 'emulate' | 'unmodelled' | 'undecodable'
    verdict: str  # the proof's verdict for a relocating answer; '' for a refusal
    reason: str
    method: str
    group: str  # what instances are grouped by in the summary
    detail: str  # JSON: the answer, the source it cites, and a counterexample if refuted

    def bucket(self, own: str) -> str:
        return bucket_of(self.kind, self.verdict, own)

    def row(self) -> tuple:
        return (self.kind, self.verdict, self.reason, self.method, self.group, self.detail)


def bucket_of(kind: str, verdict: str, own: str) -> str:
    """The bucket of a tracer's outcome (its ``kind`` and ``verdict``) for an instruction relocverify's own verdict
    on is ``own``."""
    if kind == "refuse":
        return "tracer-refuses-provable" if own == "proved" else "both-refuse"
    if verdict == "proved":
        return "agree"
    if verdict == "refuted":
        return "tracer-wrong"
    return "unknown"


#: Bucketing (one process, or a pass of the run) and the registry: no outcome depends on them.
_NOT_MODELS = frozenset({"audit.py", "audit_pass.py", "__init__.py"})


def models_digest() -> str:
    """The tracer models' source: a change to any model invalidates its remembered outcomes."""
    h = hashlib.sha256()
    for p in sorted(Path(__file__).parent.glob("*.py")):
        if p.name not in _NOT_MODELS:
            h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


class OutcomeMemo:
    """``<cache>/tracers/``: one file per (tag, tracer) holding {instance key: outcome row} as a marshal
    blob, written whole and atomically (``os.replace``); a file that does not load is ignored (its
    outcomes are judged again).  Only ever read from the user's own cache directory.

    Every change to a model or to relocverify's source makes a new tag, so the memos of old versions
    are never read again: after each save the directory is held under ``limit`` bytes by removing
    the least recently used memos (a load marks its file used), never the one just saved."""

    LIMIT = 1 << 30  # 1 GiB: one whole kernel's memos for every tracer are ~0.1-0.8 GB

    def __init__(self, directory: str | None, limit: int | None = None):
        self.limit = self.LIMIT if limit is None else limit
        self.directory = None if directory is None else os.path.join(directory, "tracers")
        if self.directory is not None:
            os.makedirs(self.directory, exist_ok=True)

    def _path(self, tag: bytes, tracer: str) -> str:
        return os.path.join(self.directory, hashlib.blake2b(tag + b"|" + tracer.encode(),
                                                            digest_size=16).hexdigest() + ".marshal")

    def load(self, tag: bytes, tracer: str) -> dict[bytes, tuple]:
        if self.directory is None:
            return {}
        try:
            with open(self._path(tag, tracer), "rb") as fh:
                doc = marshal.load(fh)
        except (OSError, ValueError, EOFError, TypeError):
            return {}
        try:
            os.utime(self._path(tag, tracer))  # used: the last to be evicted
        except OSError:
            pass
        return doc if isinstance(doc, dict) else {}

    def save(self, tag: bytes, tracer: str, memo: dict[bytes, tuple]) -> None:
        if self.directory is None:
            return
        path = self._path(tag, tracer)
        partial = f"{path}.{os.getpid()}"
        with open(partial, "wb") as fh:
            marshal.dump(memo, fh)
        os.replace(partial, path)
        self._evict(keep=path)

    def _evict(self, keep: str) -> None:
        """Least recently used memos removed until the directory holds at most ``limit`` bytes."""
        files = []
        for entry in os.scandir(self.directory):
            if entry.name.endswith(".marshal") and entry.path != keep:
                try:
                    st = entry.stat()
                except OSError:
                    continue
                files.append((st.st_mtime, st.st_size, entry.path))
        try:
            total = os.path.getsize(keep) + sum(size for _, size, _ in files)
        except OSError:
            return
        for _, size, path in sorted(files):
            if total <= self.limit:
                break
            try:
                os.unlink(path)
                total -= size
            except OSError:
                pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class ImageFacts:
    """What a per-function model (optprobes) reads from the image beyond the store's rows:
    ``thunks``, the ``__indirect_thunk_start..end`` range; ``entries(address, length)``, the
    image's transfers strictly inside a range (``optprobes.entries_of``), or None when unknown."""

    thunks: tuple[int, int] | None = None
    entries: Callable | None = None
    entries_digest: Callable | None = None  # (start, size) -> bytes: what ``entries`` says about a function


@dataclass
class Tally:
    """One tracer's counts: per bucket, per group within it, with a few instances each."""

    instructions: int = 0
    buckets: dict = field(default_factory=lambda: {b: 0 for b in BUCKETS})
    groups: dict = field(default_factory=dict)  # (bucket, group) -> [count, detail, examples]
    cpu: dict = field(default_factory=lambda: {m: 0 for m in CPU_METHODS})  # instructions the CPU judged, by method

    def add(self, bucket: str, outcome: TracerOutcome, count: int, examples: list) -> None:
        self.instructions += count
        self.buckets[bucket] += count
        if outcome.method in self.cpu:
            self.cpu[outcome.method] += count
        g = self.groups.get((bucket, outcome.group))
        if g is None:
            g = self.groups[(bucket, outcome.group)] = [0, outcome.detail, []]
        g[0] += count
        g[2].extend(examples[:EXAMPLES - len(g[2])])

    def add_remembered(self, found: tuple, details: dict, start: int, name: str, data: bytes, rows: list) -> None:
        """``add_rows`` of a function's outcomes as a per-function model's memo holds them (``found``: (kind, verdict,
        reason, method, group) per row; each group's detail in ``details``), one instruction each, without making
        each outcome, and an instance's bytes only while its group keeps instances."""
        buckets, groups, cpu = self.buckets, self.groups, self.cpu
        for (off, n, own, _), (kind, verdict, _, method, group) in zip(rows, found):
            bucket = bucket_of(kind, verdict, own)
            self.instructions += 1
            buckets[bucket] += 1
            if method in cpu:
                cpu[method] += 1
            g = groups.get((bucket, group))
            if g is None:
                g = groups[(bucket, group)] = [0, details.get(group, "{}"), []]
            g[0] += 1
            if len(g[2]) < EXAMPLES:
                g[2].append(((start + off) & MASK64, name, off, data[off:off + n].hex()))

    def merge(self, other: Tally) -> None:
        """``other``'s adds made here after this tally's own, as if one by one: counts summed, a group first seen
        in ``other`` placed after this tally's groups, each group's first instances kept."""
        self.instructions += other.instructions
        for b, n in other.buckets.items():
            self.buckets[b] += n
        for m, n in other.cpu.items():
            self.cpu[m] += n
        for k, (n, detail, examples) in other.groups.items():
            g = self.groups.get(k)
            if g is None:
                self.groups[k] = [n, detail, list(examples)]
            else:
                g[0] += n
                g[2].extend(examples[:EXAMPLES - len(g[2])])

    def as_json(self) -> dict:
        groups: dict[str, list] = {b: [] for b in BUCKETS}
        for (bucket, group), (n, detail, examples) in sorted(self.groups.items(), key=lambda kv: -kv[1][0]):
            groups[bucket].append({"group": group, "count": n, "detail": json.loads(detail),
                                   "examples": [{"address": hex(a), "function": f"{fn}+{off:#x}", "bytes": raw or None}
                                                for a, fn, off, raw in examples]})
        return {"instructions": self.instructions, "buckets": dict(self.buckets),
                "totals_add_up": sum(self.buckets.values()) == self.instructions, "groups": groups,
                "cpu_replay": cpu_replay(self.cpu)}


def cpu_replay(by_method: dict) -> dict:
    """The summary's account of the counterexamples unicorn did not confirm and the CPU judged
    (``judge.replay_unconfirmed``), in instructions: ``confirmed`` moved from unknown to tracer-wrong,
    the rest stayed unknown (the CPU saw no difference, the instruction needs the guest, or was not run)."""
    return {"confirmed": by_method.get("cpu", 0), "no_difference": by_method.get("cpu-same", 0),
            "needs_guest": by_method.get("cpu-guest", 0), "not_run": by_method.get("cpu-not-run", 0)}


@dataclass(frozen=True, slots=True)
class Told:
    """What one ``Auditor.verdict`` found, as a worker of the audit pass keeps it for the parent to replay
    (``audit_pass``): the proof key and the obligation looked up (None: none, or not looked up); where the
    answer came from (``source``: 'proof', 'obligation', or 'made' here); the answer (verdict, reason, method,
    counterexample).  For 'made': the (piece key, answer) pairs composing the block read or learned, in order
    (None: not a composable block), whether it was composed, whether the CPU replayed a counterexample, the proof
    filed under the key (None: none) and the obligation's entry filed (None: none)."""

    key: bytes | None
    same: bytes | None
    source: str
    value: tuple
    pieces: tuple | None = None
    composed: bool = False
    replayed: bool = False
    proof: CachedProof | None = None
    filed: tuple | None = None


def unfiled(seen: tuple) -> tuple:
    """An obligation's entry (verdict, reason, method, counterexample as JSON) as ``verdict`` answers it."""
    verdict, reason, method, cex_json = seen
    return verdict, reason, method, json.loads(cex_json) if cex_json else None


class _Reading:
    """The pieces' answers as ``proof.block.composed`` reads and extends them, with every (key, answer) it read or
    learned, in order (``read``)."""

    def __init__(self, known: dict):
        self.known, self.read = known, []

    def get(self, key):
        ok = self.known.get(key)
        if ok is not None:
            self.read.append((key, ok))
        return ok

    def __setitem__(self, key, ok) -> None:
        self.known[key] = ok
        self.read.append((key, ok))


class Auditor:
    """Judges instructions for a set of tracer models at one trampoline address."""

    def __init__(self, models: list, tramp: int, timeout_s: float = 10.0, cache_dir: str | None = None,
                 rules=None):
        self.models = models
        self.tramp = tramp & MASK64
        self.timeout_s = timeout_s
        self.rules = rules
        self.tag = cache_tag()
        self.cache = ProofCache(cache_dir)
        self.proofs: dict[bytes, CachedProof] = self.cache.proofs(self.tag)
        self.new_proofs: dict[bytes, CachedProof] = {}
        self.memo = OutcomeMemo(cache_dir)
        digest = models_digest()
        here = _judge_tag()  # outcomes the CPU decided hold for this CPU and feature mask only
        self.memo_tags = {m.name: self.tag + here + f"|{m.name}|{getattr(m, 'version_tag', digest)}".encode()
                          for m in models}
        self.outcomes = {m.name: self.memo.load(self.memo_tags[m.name], m.name) for m in models}
        self.obligations_tag = self.tag + here + b"|obligations"
        self.verdicts: dict[bytes, tuple] = self.memo.load(self.obligations_tag, "obligations")
        self.verdicts_known = len(self.verdicts)
        self.walks: dict[str, dict] = {}
        self.walks_changed: set[str] = set()
        self.counts = {"keys_judged": 0, "proofs_made": 0, "proofs_shared": 0, "per_instance": 0,
                       "pieces_proved": 0, "blocks_composed": 0, "cpu_replays": 0}
        self.pieces: dict[bytes, bool] = {}  # proof.block.piece_key -> piece_proved, for this audit's blocks
        # Kept only in a worker of the audit pass (``audit_pass``), for the parent to replay: what each ``verdict``
        # found (``Told``), and each walk computed here ((spec, key, offsets not reached)).  None: not kept.
        self.trace: list | None = None
        self.walked: list | None = None

    def walk(self, spec: str, data: bytes, start: int, offsets: list[int]) -> frozenset[int]:
        """The offsets of a function that kprobes' can_probe walk (``linux_facts.boundaries``) does not
        reach, remembered by the function's bytes and start (a warm audit decodes nothing)."""
        memo = self._walks(spec)
        k = hashlib.blake2b(data, digest_size=12).digest() + start.to_bytes(8, "little")
        hit = memo.get(k)
        if hit is None:
            reached = linux_facts.boundaries(spec, data, offsets)
            hit = memo[k] = tuple(o for o in offsets if o not in reached)
            self.walks_changed.add(spec)
            if self.walked is not None:
                self.walked.append((spec, k, hit))
        return frozenset(hit)

    def learn_walk(self, spec: str, k: bytes, hit: tuple) -> None:
        """A walk another process made (``walk``'s memo entry ``k``), kept here as if made here."""
        memo = self._walks(spec)
        if k not in memo:
            memo[k] = hit
            self.walks_changed.add(spec)

    def _walks(self, spec: str) -> dict:
        memo = self.walks.get(spec)
        if memo is None:
            memo = self.walks[spec] = self.memo.load(self.tag + b"|walk|" + spec.encode(), "walks")
        return memo

    def close(self) -> None:
        if len(self.verdicts) != self.verdicts_known:
            self.memo.save(self.obligations_tag, "obligations", self.verdicts)
        for spec in self.walks_changed:
            self.memo.save(self.tag + b"|walk|" + spec.encode(), "walks", self.walks[spec])
        for m in self.models:
            self.memo.save(self.memo_tags[m.name], m.name, self.outcomes[m.name])
        if self.new_proofs:
            self.cache.add(self.tag, {}, self.new_proofs)
        self.memo.close()
        self.cache.close()

    # -- one instruction -----------------------------------------------------------------
    def judge(self, model, stream: bytes, address: int, context: Context) -> TracerOutcome:
        """The outcome of ``model`` for the instruction at the start of ``stream``."""
        insn = decode(stream, address)
        if not isinstance(insn, Instruction):
            return TracerOutcome("undecodable", "unknown", f"relocverify's decoders: {insn.reason}", "",
                                 "our decoders do not agree on the original", json.dumps({"reason": insn.reason}))
        answer = model.answer(insn, self.tramp, Context(context.boundary, context.sites, context.function,
                                                        stream[:15]))
        return self.judged(insn, answer, machine_of(model))

    def judged(self, insn: Instruction | None, answer, where=None) -> TracerOutcome:
        """An answer for the instruction ``insn`` judged: a refusal as it is; a relocation, an
        emulation or a block (whose first instruction stands for ``insn``) by its proof (``verdict``);
        an unmodelled answer with no instruction our decoders agree on, ``unknown``.  ``where``: the
        machine the tracer's relocations run in (``tracers.model.machine_of``)."""
        if isinstance(answer, Refuse):
            return TracerOutcome("refuse", "", answer.reason, "", _HEX.sub("N", answer.reason),
                                 json.dumps({"answer": answer.as_json()}))
        block = answer.block if isinstance(answer, RelocateBlock) else None
        if block is not None:
            insn = block.instructions[0]
        if insn is None:
            return TracerOutcome(answer.kind, "unknown", answer.reason, "", f"{answer.kind}: {answer.reason}",
                                 json.dumps({"answer": answer.as_json()}))
        verdict, reason, method, cex = self.verdict(insn, answer, where)
        group = _group(insn, answer, verdict, reason, cex, method)
        run = block.instructions if block is not None else (insn,)
        detail = {"answer": answer.as_json(), "original": "; ".join(i.text for i in run),
                  "bytes": b"".join(i.raw for i in run).hex(), "address": hex(insn.address),
                  "tramp": hex(self.tramp), "reason": reason}
        if cex is not None:
            detail["counterexample"] = cex
        return TracerOutcome(answer.kind, verdict, reason, method, group, json.dumps(detail))

    def verdict(self, insn: Instruction, answer, where=None) -> tuple[str, str, str, dict | None]:
        """(verdict, reason, method, counterexample) of a relocating answer: the proof stored under its
        proof key (shared with other tracers and the engine's plans), else the same obligation judged
        before (single instructions: blocks are remembered per function instead), else proved now."""
        key = proof_key(insn, answer, self.tramp, self.rules, where)
        hit = self.proof_hit(key)
        if hit is not None:
            self.counts["proofs_shared"] += 1
            return self._told(Told(key, None, "proof", (hit.verdict, hit.reason, hit.method, None)))
        same = None if isinstance(answer, RelocateBlock) else _obligation(insn, answer, self.tramp, where)
        seen = None if same is None else self.verdicts.get(same)
        if seen is not None:  # this very obligation was judged before (another tracer, another model version)
            self.counts["proofs_shared"] += 1
            return self._told(Told(key, same, "obligation", unfiled(seen)))
        return self._prove(insn, answer, where, key, same)

    def proof_hit(self, key: bytes | None) -> CachedProof | None:
        """The proof filed under ``key`` (the cache's, or this audit's), unless it is an unconfirmed
        counterexample's (proved again: its counterexample goes to the CPU)."""
        hit = None if key is None else self.proofs.get(key) or self.new_proofs.get(key)
        return None if hit is not None and hit.reason.startswith(UNCONFIRMED) else hit

    def _prove(self, insn: Instruction, answer, where, key: bytes | None, same: bytes | None) -> tuple:
        """``verdict`` of an answer no proof and no obligation stands for: composed, or proved (and the CPU asked
        about an unconfirmed counterexample), then filed under its proof key and its obligation."""
        t0 = time.perf_counter()
        result, read = self._composed(answer)
        composed, replayed = result is not None, False
        if result is None:
            result = prove_answer(insn, answer, self.tramp, self.timeout_s, where)
            self.counts["proofs_made"] += 1
            decided = replay_unconfirmed(insn, answer, result)
            if decided is not result:
                self.counts["cpu_replays"] += 1
                result, replayed = decided, True
        verdict, reason, method = result.verdict.value, result.reason, result.method
        proof = filed = None
        if key is not None and reusable(key, result) and reusable_here(method):
            proof = self.new_proofs[key] = CachedProof(verdict, reason, method,
                                                       max(1, int((time.perf_counter() - t0) * 1e6)))
        cex = result.counterexample.as_json() if result.counterexample is not None \
            and result.verdict is Verdict.REFUTED else None
        if same is not None and result.method not in ("timeout", "error"):
            filed = self.verdicts[same] = (verdict, reason, method, json.dumps(cex) if cex else "")
        return self._told(Told(key, same, "made", (verdict, reason, method, cex), read, composed, replayed, proof,
                               filed))

    def _told(self, told: Told) -> tuple:
        """``told``'s answer, ``told`` kept for the parent when a worker keeps them (``trace``)."""
        if self.trace is not None:
            self.trace.append(told)
        return told.value

    def _composed(self, answer) -> tuple[ProofResult | None, tuple | None]:
        """A block's proof by composition (``proof.block.composed``: the pieces' answers kept for the
        audit's run, so a piece seen in many blocks is proved once), or None: ``prove_answer`` decides.
        Exactly the result ``prove_block`` gives such a block (its fast path's).  With it, when a worker keeps
        what it finds (``trace``), the (piece key, answer) pairs composing read or learned, in order; None for
        an answer not composed."""
        if not isinstance(answer, RelocateBlock) or answer.entries:
            return None, None
        from ..proof.block import FAST_PATH_REASON, composed

        before = len(self.pieces)
        known = self.pieces if self.trace is None else _Reading(self.pieces)
        ok = composed(answer.block, known)
        self.counts["pieces_proved"] += len(self.pieces) - before
        read = None if self.trace is None else tuple(known.read)
        if not ok:
            return None, read
        self.counts["blocks_composed"] += 1
        return ProofResult(Verdict.PROVED, FAST_PATH_REASON, "fast-path"), read

    def outcome(self, model, key: bytes, stream: bytes, address: int, context: Context, length: int) -> TracerOutcome:
        """``judge`` through the per-key memo (instances that cannot share a key are judged alone)."""
        site = model.site_refusal(context)
        if site is not None:
            return TracerOutcome("refuse", "", site.reason, "", site.reason, json.dumps({"answer": site.as_json()}))
        memo = self.outcomes[model.name]
        if context.boundary is False:  # judged alone: the walk's answer is the instance's
            key = b"B" + address.to_bytes(8, "little") + key
        elif per_instance(key):  # a target at A or A+len: no key stands for its instances
            key = b"I" + address.to_bytes(8, "little") + key
        elif linux_facts.emulate_prefixed(stream) and self._length_differs(model, stream, address):
            key = b"L" + stream + key  # a ud2 the tracer's decoder reads with the bytes after it: judged by them
        row = memo.get(key)
        if row is not None:
            return TracerOutcome(*row)
        reads_past = getattr(model, "reads_past", None)
        if key[:1] not in (b"B", b"I", b"L") and reads_past is not None and reads_past(stream[:length]):
            key = b"P" + address.to_bytes(8, "little") + stream + key  # an answer from the bytes after it
            row = memo.get(key)
            if row is not None:
                return TracerOutcome(*row)
        elif key[:1] not in (b"B", b"I", b"L") and self._length_differs(model, stream, address):
            # the tracer's decoder reads another length: its answer may depend on the bytes after ours
            key = b"L" + stream + key
            row = memo.get(key)
            if row is not None:
                return TracerOutcome(*row)
        out = self.judge(model, stream, address, context)
        self.counts["per_instance" if key[:1] in (b"B", b"I", b"L", b"P") else "keys_judged"] += 1
        memo[key] = out.row()
        return out

    # -- a per-function model ---------------------------------------------------------------
    def function_outcomes(self, model, data: bytes, start: int, name: str, rows: list, masks: dict,
                          gaps: frozenset[int], image: ImageFacts) -> list[TracerOutcome]:
        """A per-function model's outcome for every row of one function, remembered whole under
        what they depend on (``function_key``)."""
        k = self.function_key(model, data, start, rows, masks, gaps, image)
        hit = self.remembered(model, k)
        if hit is not None:
            return hit
        return self.remember_function(model, k, self.judge_function(model, data, start, name, rows, masks, gaps,
                                                                    image))

    def function_key(self, model, data: bytes, start: int, rows: list, masks: dict, gaps: frozenset[int],
                     image: ImageFacts) -> bytes:
        """What a per-function model's outcomes for a function depend on: the model, the function's bytes and
        address, the slot, its site masks, the offsets kprobes' ``can_probe`` walk does not reach (``gaps``),
        and the image's transfers into it."""
        entries = b"" if image.entries_digest is None else image.entries_digest(start, len(data))
        return hashlib.blake2b(b"F" + data + start.to_bytes(8, "little") + self.tramp.to_bytes(8, "little") + repr(
            (sorted(masks.items()), sorted(gaps), image.thunks, [r[0] for r in rows])).encode() + entries,
            digest_size=20).digest()

    def remembered(self, model, k: bytes) -> list[TracerOutcome] | None:
        """The outcomes remembered under ``k`` (``function_key``), each with its group's first detail; or None."""
        memo = self.outcomes[model.name]
        details = memo.setdefault(b"details", {})  # group -> the detail of its first instance
        hit = memo.get(k)
        return None if hit is None else [TracerOutcome(*row, details.get(row[4], "{}")) for row in hit]

    def judge_function(self, model, data: bytes, start: int, name: str, rows: list, masks: dict,
                       gaps: frozenset[int], image: ImageFacts) -> list[TracerOutcome]:
        """A per-function model's outcome for every row of one function, judged now, each with its own detail."""
        live = getattr(model, "live_bytes", None)
        if live is not None:  # the text as the kernel reads it after boot, as far as the model's variant says
            data = live(data, {o: site_kinds(m) for o, m in masks.items()})
        extable = frozenset(o for o, m in masks.items() if "extable" in site_kinds(m))
        walk = model.function_walk(data, start, [r[0] for r in rows], extable, image.thunks)
        sites_at = lambda o: site_kinds(masks.get(o))  # noqa: E731
        out = []
        for off, _, _, mask in rows:
            sites = site_kinds(mask)
            context = Context(off not in gaps, sites, name)
            answer = model.answer_in(walk, data, off, self.tramp, context, extable, sites_at, image.entries)
            ours = walk.ours_at(data, off)
            out.append(self.judged(ours if isinstance(ours, Instruction) else None, answer, machine_of(model)))
        return out

    def remember_function(self, model, k: bytes, out: list[TracerOutcome]) -> list[TracerOutcome]:
        """``out``, a function's outcomes judged now (``judge_function``), remembered under ``k``; each returned with
        its group's first detail (a group keeps its first one)."""
        self.counts["per_instance"] += len(out)
        memo = self.outcomes[model.name]
        details = memo.setdefault(b"details", {})
        for o in out:
            details.setdefault(o.group, o.detail)
        memo[k] = tuple(o.row()[:5] for o in out)  # without the detail: a group keeps its first one
        return [TracerOutcome(*o.row()[:5], details[o.group]) for o in out]

    @staticmethod
    def _length_differs(model, stream: bytes, address: int) -> bool:
        spec = getattr(model, "decoder", None)
        if not spec:
            return False
        ours = decode(stream, address)
        d = linux_facts.insn_of(spec.split("@", 1)[1], stream[:15])
        return not d.ok or not isinstance(ours, Instruction) or d.length != ours.length


def _judge_tag() -> bytes:
    """This CPU as the judge sees it, under its feature mask (``concrete.cpu.identity``)."""
    return b"|cpu:" + hashlib.blake2b(json.dumps(identity().as_json(), sort_keys=True).encode(),
                                      digest_size=8).hexdigest().encode()


def _obligation(insn: Instruction, answer, tramp: int, where=None) -> bytes:
    """The proof obligation itself: the original's bytes at A, what runs from T, and the machine it runs
    in (``tracers.model.machine_of``).  The same obligation under the same tools (the memo's tag) has the same verdict,
    whichever tracer or model version produced it."""
    doc = answer.as_json()
    body = json.dumps({k: doc.get(k) for k in ("kind", "code", "tracer_memory", "effects", "reason")},
                      sort_keys=True).encode()
    return hashlib.blake2b(insn.raw + insn.address.to_bytes(8, "little") + tramp.to_bytes(8, "little") + body
                           + (b"" if where is None else b"|" + where.key), digest_size=20).digest()


def _group(insn: Instruction, answer, verdict: str, reason: str, cex: dict | None, method: str = "") -> str:
    cite = answer.cite.function
    if method in CPU_METHODS and method != "cpu":  # unknown, and what the CPU did about z3's counterexample
        return f"{insn.opname} via {cite}: z3's counterexample not confirmed by unicorn; {CPU_METHODS[method]}"
    if verdict == "refuted" and isinstance(answer, RelocateBlock) and answer.entries:
        return f"a {answer.entries[0].how} from outside the function lands in the jmp ({cite}: patched-range entry)"
    if verdict == "refuted":
        what = ",".join(sorted({re.sub(r"\[.*\]", "[]", d["what"]) for d in (cex or {}).get("differences", [])}))
        return f"{insn.opname} via {cite}: differs in {what or 'an obligation'}" + (
            " (confirmed on CPU)" if method == "cpu" else "")
    if verdict == "proved":
        return f"{answer.kind} ({cite})"
    return f"{insn.opname} via {cite}: {_HEX.sub('N', reason)[:120]}"


# -- a whole image ------------------------------------------------------------------------

def audit_store(store_path: str, auditor: Auditor, image_id: int | None = None, limit: int | None = None,
                progress=None, image: ImageFacts | None = None) -> dict:
    """Every stored instruction of the image, bucketed per tracer; the summary's ``tracers``.

    Two passes: the first groups the instructions into *cases*, the facts a bucket depends on
    (instance key, relocverify's own verdict, kernel site kinds, kprobes' boundary walk, and the
    address itself where a key cannot stand for its instances), counting each and keeping a
    few instances; the second judges each case once per tracer.  Every instruction is in
    exactly one case, so the buckets add up to the instructions by construction, and the
    summary checks that they do.  A per-function model (optprobes) is answered in the first
    pass, function by function (``Auditor.function_outcomes``), every row once.

    This is the audit in one process, function after function: ``audit_pass`` makes the first pass on the
    run's workers and gives the same summary; this one is its reference (and the audit of ``--jobs 1``)."""
    t0 = time.monotonic()
    functions = stored_functions(store_path, image_id, limit)
    plan = AuditPlan.of(auditor.models)
    km = KeyMaker(auditor.tramp)
    image = image or ImageFacts()
    tallies = {m.name: Tally() for m in auditor.models}
    total = sum(len(r) for *_, r in functions)
    cases: dict[tuple, list] = {}
    done = 0
    step = max(1, total // 100)
    next_say = step
    for fid, start, name, data, rows in functions:
        off_walk = walks_of(auditor, plan, data, start, rows)
        if plan.per_function:
            masks = masks_of(rows)
            for m in plan.per_function:
                outs = auditor.function_outcomes(m, data, start, name, rows, masks, plan.gaps(m, off_walk), image)
                add_rows(tallies[m.name], outs, start, name, data, rows)
        add_cases(cases, km, plan, off_walk, start, name, data, rows)
        done += len(rows)
        if progress is not None and done >= next_say:
            progress("survey", done, total)
            next_say = done + step
    t1 = time.monotonic()
    judge_cases(auditor, plan, cases, tallies, progress)
    return image_summary(auditor, total, len(functions), cases, tallies, (t0, t1))


def stored_functions(store_path: str, image_id: int | None, limit: int | None) -> list[tuple]:
    """The image's functions with stored rows (``Results.function_verdicts``), the first ``limit``; its seals
    checked first (each tracer is judged against relocverify's verdicts: never altered ones)."""
    store = Results(store_path)
    try:
        image_id = image_id if image_id is not None else store.find_image()
        store.check_seals(image_id)
        functions = list(store.function_verdicts(image_id))
    finally:
        store.close()
    return functions if limit is None else functions[:limit]


@dataclass(frozen=True)
class AuditPlan:
    """How an auditor's models are asked: ``per_function``, the models answering a whole function at once
    (optprobes); ``per_insn``, the others, per case; ``walkers``, the decoders whose boundary walk (kprobes'
    ``can_probe``) a model needs; ``readers``, the models whose answer may read past an instruction (its
    instances are judged alone)."""

    per_function: tuple
    per_insn: tuple
    walkers: tuple[str, ...]
    readers: tuple

    @classmethod
    def of(cls, models) -> AuditPlan:
        return cls(tuple(m for m in models if getattr(m, "per_function", False)),
                   tuple(m for m in models if not getattr(m, "per_function", False)),
                   tuple(sorted({m.decoder.split("@", 1)[1] for m in models
                                 if getattr(m, "needs_boundary", False) and m.decoder})),
                   tuple(m for m in models if hasattr(m, "reads_past")))

    def gaps(self, model, off_walk: tuple) -> frozenset[int]:
        """The offsets ``model``'s boundary walk does not reach, of a function's walks (``walks_of``)."""
        return off_walk[self.walkers.index(model.decoder.split("@", 1)[1])]

    def boundary(self, model, bnd: tuple) -> bool | None:
        """Whether an instance is on ``model``'s boundary walk, of its case's ``bnd``; None: the model walks none."""
        return bnd[self.walkers.index(model.decoder.split("@", 1)[1])] if self.walkers and getattr(
            model, "needs_boundary", False) else None


def walks_of(auditor: Auditor, plan: AuditPlan, data: bytes, start: int, rows: list) -> tuple[frozenset[int], ...]:
    """Per walker of ``plan``, the offsets of the function's rows its boundary walk does not reach."""
    return tuple(auditor.walk(spec, data, start, [r[0] for r in rows]) for spec in plan.walkers)


def masks_of(rows: list) -> dict[int, int]:
    """A function's site masks by offset, of the rows at a site."""
    return {off: mask for off, _, _, mask in rows if mask}


def add_rows(tally: Tally, outs: list[TracerOutcome], start: int, name: str, data: bytes, rows: list) -> None:
    """A per-function model's outcomes for a function's rows, one instruction each, into its tally."""
    for (off, n, own, _), out in zip(rows, outs):
        tally.add(out.bucket(own), out, 1, [((start + off) & MASK64, name, off, data[off:off + n].hex())])


def add_cases(cases: dict, km: KeyMaker, plan: AuditPlan, off_walk: tuple, start: int, name: str, data: bytes,
              rows: list) -> None:
    """Each row of a function into its case (instance key, own verdict, site mask, boundary walks, and the
    address where no key stands for the instance): its count, its first few instances, the first one's bytes."""
    keys = {off: key for off, _, key in km.keys(data, start)}
    walked = tuple(True for _ in off_walk) if not any(off_walk) else None  # every instance on every walk
    readers = plan.readers
    for off, n, own, mask in rows:
        key = keys.get(off)
        if key is None:
            key = keys[off] = km.key(data[off:off + n], start + off)
        bnd = walked if walked is not None else tuple([off not in bad for bad in off_walk])
        alone = per_instance(key) or False in bnd or (readers and any(m.reads_past(data[off:off + n])
                                                                      for m in readers)) or (
            data[off] == 0x0F and linux_facts.emulate_prefixed(data[off:off + 5]))  # read with the bytes after it
        case = (key, own, mask, bnd, start + off if alone else None)
        c = cases.get(case)
        if c is None:
            cases[case] = [1, [(start + off, name, off, n)], data[off:off + 15]]
        else:
            c[0] += 1
            if len(c[1]) < EXAMPLES:
                c[1].append((start + off, name, off, n))


def merge_cases(cases: dict, more: dict) -> None:
    """``more``, the cases of the functions after those of ``cases``, added to it as ``add_cases`` would have."""
    for case, (count, examples, stream) in more.items():
        c = cases.get(case)
        if c is None:
            cases[case] = [count, list(examples), stream]
        else:
            c[0] += count
            c[1].extend(examples[:EXAMPLES - len(c[1])])


def judge_cases(auditor: Auditor, plan: AuditPlan, cases: dict, tallies: dict[str, Tally], progress=None) -> None:
    """The second pass: each case judged once per per-instruction model, in case order, into its tally."""
    for m in plan.per_insn:
        if hasattr(m, "prefetch"):  # a command answers in batches: ask about every case it lacks
            memo = auditor.outcomes[m.name]
            m.prefetch([((c[1][0][0]) & MASK64, auditor.tramp, c[2][:c[1][0][3]]) for (key, *_), c in cases.items()
                        if key not in memo])
    sites_of: dict = {}
    for k, (case, (count, examples, stream)) in enumerate(cases.items()):
        key, own, mask, bnd, _ = case
        sites = sites_of.get(mask)
        if sites is None:
            sites = sites_of[mask] = site_kinds(mask)
        address, name = examples[0][0] & MASK64, examples[0][1]
        for m in plan.per_insn:
            out = auditor.outcome(m, key, stream, address, Context(plan.boundary(m, bnd), sites, name), examples[0][3])
            tallies[m.name].add(out.bucket(own), out, count,
                                [(a & MASK64, fn, off, stream[:n].hex() if j == 0 else "") for j, (a, fn, off, n)
                                 in enumerate(examples)])
        if progress is not None and k % 1000 == 0:
            progress("judge", k, len(cases))


def image_summary(auditor: Auditor, total: int, functions: int, cases: dict, tallies: dict[str, Tally],
                  times: tuple[float, float]) -> dict:
    """An image's audit summary: its instructions, functions and cases, each tracer's tally, the auditor's counts
    so far, and the seconds of the first pass (from ``times[0]`` to ``times[1]``) and of the judging since."""
    t0, t1 = times
    return {"instructions": total, "functions": functions, "tramp": hex(auditor.tramp), "cases": len(cases),
            "tracers": {name: t.as_json() | {"source": _source_of(auditor, name)} for name, t in tallies.items()},
            "counts": dict(auditor.counts),
            "phases": {"survey_s": round(t1 - t0, 3), "judge_s": round(time.monotonic() - t1, 3)},
            "wall_s": round(time.monotonic() - t0, 3)}


def _source_of(auditor: Auditor, name: str) -> str:
    return next((getattr(m, "source", "") for m in auditor.models if m.name == name), "")


def summary_path(store_path: str) -> str:
    """Where an audit's summary is kept: beside its store (the report's tracer page reads it)."""
    return store_path + ".audit.json"


def save_summary(store_path: str, summary: dict) -> None:
    write_atomic(summary_path(store_path), json.dumps(summary, indent=1))
