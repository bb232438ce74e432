"""What the report reads from a store: the image, its runs, the outcomes, and the
functions with their instruction rows, in address order.

Everything goes through the read model's queries (``store.store.Results``) except two whole-table reads
that it answers only per key (every variant, every run's host), which
are read here in one scan each, read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ..errors import InputError
from ..store.store import FunctionRecord, InstructionRow, Results

VERDICTS = ("proved", "opaque", "unknown", "rejected", "refuted")  # strongest first, as proof.verdict orders them


@dataclass(frozen=True)
class StoredOutcome:
    id: int
    verdict: str
    method: str
    plan_kind: str
    rule: str
    klass: str
    reason_key: str
    reason: str


def open_store(path: str) -> tuple[Results, int]:
    """The store at ``path`` read-only, and its newest image; ``InputError`` if it has none."""
    store = Results(path)
    try:
        store.check_integrity()  # a report is built from every row: never from a damaged store
        store.check_seals()  # nor from one whose verdicts were altered after relocverify wrote them
    except BaseException:
        store.close()
        raise
    image = store.find_image()
    if image is None:
        store.close()
        raise InputError(f"{path}: the store holds no image yet; run `relocverify vmlinux --db {path}` first")
    return store, image


def outcomes(store: Results) -> dict[tuple, StoredOutcome]:
    """(verdict, method, plan kind, rule, class, reason key) -> the stored outcome."""
    return {key: StoredOutcome(oid, *key, reason) for key, (oid, reason) in store.outcome_ids_now().items()}


def outcome_key(row: InstructionRow) -> tuple:
    return (row.verdict, row.method, row.plan_kind, row.rule, row.klass, row.reason_key)


def last_run(store: Results, image: int) -> dict:
    """The newest run of the image with its summary, configuration and host ({} if none)."""
    return store.last_run(image)


def variants(store: Results, image: int) -> dict[tuple[int, int], list[tuple[str, str, str]]]:
    """(function id, offset) -> [(variant name, verdict, reason)] for every boot-patched site of the image."""
    return store.image_variants(image)


def iter_function_rows(store: Results, image: int) -> Iterator[tuple[FunctionRecord, list[InstructionRow]]]:
    """Every function of the image (address order) with its instruction rows (one scan of the rows)."""
    functions = list(store.iter_functions(image))
    rows = store.iter_rows(image)
    pending = next(rows, None)
    held: dict[str, list[InstructionRow]] = {}
    held_start = None
    for f in functions:
        if held_start != f.start:
            # iter_rows orders by (start, offset), so the rows of functions sharing a start interleave
            held, held_start = {}, f.start
            while pending is not None and pending.function_start == f.start:
                held.setdefault(pending.function, []).append(pending)
                pending = next(rows, None)
        yield f, held.pop(f.name, [])


def weak_rows(store: Results, image: int) -> Iterator[InstructionRow]:
    """Every row whose verdict is not ``proved``, through the index of the weak outcomes."""
    for verdict in VERDICTS[1:]:
        yield from store.rows_with(image, verdict)


def function_ids(store: Results, image: int) -> dict[tuple[int, str], int]:
    return {(f.start, f.name): f.id for f in store.iter_functions(image)}


def answer_rows(store: Results, image: int) -> dict[tuple[str, int], str]:
    """(function name, offset) -> the decoders' answers (JSON), for every row where the decoders disagree."""
    return store.disagreement_answers(image)


def jump_buckets(store: Results) -> list[tuple[int, str, str]] | None:
    """(id, name, example reason) of every jump-probe bucket, or None when the store has no
    jump-probe answers (a run without ``--jump-probes``, or a store older than them)."""
    return store.jump_bucket_names() or None


def jump_answers(store: Results, function: int) -> dict[int, int]:
    """offset -> jump-probe bucket id of one function's instructions."""
    return store.jump_answers(function)
