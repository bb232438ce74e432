"""The probe points a store's verdicts make safe (``relocverify export``): an ``Export``.

One probe point per instruction whose verdict is one of the verdicts asked for (the command's default:
``proved`` only), in every function whose name matches a glob (fnmatch, case-sensitive; None: every
function), in every image of the store: a vmlinux, the modules of a package store, user-space images.
Each point says its image (kind, module name, path, sha256, the trampoline its newest run planned for),
function, offset, address, verdict, reason and section, and whether its function's name is the only one
of its kind in the store's kernel images; which of them a tool can address is ``probe_files``' question.

The store is checked for integrity first (every point comes from a row), and no row's verdict is taken on
trust (``PolicyCheck``): a row whose stored class is not what its own bytes decode to, or whose verdict the
policy does not allow for its rule and bytes (a store edited to call ``sti`` proved), is left out and
counted (``Export.refused``).  An unusable store, a store with no image, or a glob that matches no function
is an InputError.  Nothing here writes.
"""

from __future__ import annotations

import fnmatch
import json
import os
from dataclasses import dataclass

from ..errors import InputError, StoreError
from ..plan.policy import POLICIES, classify
from ..x86.instruction import Instruction

#: Above this many matching functions, one pass over the image's rows beats a query per function.
PER_FUNCTION_LIMIT = 2000


@dataclass(frozen=True)
class Image:
    """One image of the store: its id, kind (``kernel``, ``module`` or ``user``), module name, path, sha256,
    and the trampoline its newest run planned for."""

    id: int
    kind: str
    module: str | None
    path: str
    sha256: str
    tramp: int | None


@dataclass(frozen=True, slots=True)  # millions of them for a whole kernel
class ProbePoint:
    """An instruction a probe may be placed on: its function, offset, address, verdict and reason, where it
    lies, and whether its function's name is the only one of its kind in the store's kernel images."""

    image: Image
    function: str
    offset: int
    address: int
    verdict: str
    reason: str
    section: str
    unique: bool


@dataclass(frozen=True)
class Export:
    """What the store gives for the options: its images, the matching probe points in address order per
    image, and how many functions matched."""

    store: str
    verdicts: tuple[str, ...]
    glob: str | None
    images: tuple[Image, ...]
    points: tuple[ProbePoint, ...]
    functions: int
    refused: int = 0  # rows left out: their verdict is not what the policy allows for their bytes (``PolicyCheck``)


def collect(path: str, glob: str | None, verdicts: tuple[str, ...]) -> Export:
    """The probe points of the store at ``path``: see the module doc."""
    from ..store.store import Results

    try:
        store = Results(path)
    except StoreError as exc:
        raise InputError(str(exc)) from None
    try:
        store.check_integrity()  # every point comes from a row: never export from a damaged store
        store.check_seals()  # nor from one whose verdicts were altered after relocverify wrote them
        images = _images(store, path)
        functions = {image.id: list(store.iter_functions(image.id)) for image in images}
        names: dict[str, int] = {}
        for image in images:
            if image.kind != "user":
                for r in functions[image.id]:
                    names[r.name] = names.get(r.name, 0) + 1
        wanted = set(verdicts)
        reasons: dict[str, str] = {}  # one string per distinct reason: a kernel has millions of rows, few reasons
        points: list[ProbePoint] = []
        matched = refused = 0
        for image in images:
            chosen = {(r.start, r.name): r for r in functions[image.id]
                      if glob is None or fnmatch.fnmatchcase(r.name, glob)}
            matched += len(chosen)
            check = PolicyCheck("user" if image.kind == "user" else "kernel")
            for row in _rows(store, image, chosen):
                if row.verdict in wanted and not check.allows(row):
                    refused += 1
                elif row.verdict in wanted:
                    r = chosen[(row.function_start, row.function)]
                    points.append(ProbePoint(image, r.name, row.address - r.start, row.address, row.verdict,
                                             reasons.setdefault(row.reason, row.reason), r.section,
                                             names.get(r.name, 0) == 1))
    finally:
        store.close()
    if glob is not None and not matched:
        raise InputError(f"--functions {glob!r} matches no function of {path} (the glob is case-sensitive, "
                         f"fnmatch: 'vfs_*', 'tcp_v4_?cv')")
    return Export(path, verdicts, glob, tuple(images), tuple(points), matched, refused)


class PolicyCheck:
    """Whether a stored row's verdict is one the policy allows: for a claim that a probe is safe (``proved``,
    ``opaque``), its class is what its bytes decode to (iced, per distinct bytes), its rule rejects nothing,
    and the policy,
    asked again on the bytes of the first row of each (class, rule), does not reject them."""

    def __init__(self, policy: str):
        self.rules = POLICIES[policy]
        self.rejecting = {r.name for r in self.rules if r.strategy == "reject"}
        self.classes: dict[bytes, str] = {}
        self.judged: dict[tuple[str, str], bool] = {}

    def allows(self, row) -> bool:
        if row.verdict.value in ("rejected", "unknown", "refuted"):  # claims no probe is safe there
            return True
        if row.rule in self.rejecting or row.rule.startswith("site:"):
            return False
        klass = self.classes.get(row.raw)
        if klass is None:
            klass = self.classes[row.raw] = _class_of(row.raw, row.address)
        if klass != row.klass:
            return False
        seen = self.judged.get((row.klass, row.rule))
        if seen is None:
            seen = self.judged[(row.klass, row.rule)] = _policy_allows(row.raw, row.address, row.rule, self.rules)
        return seen


def _class_of(raw: bytes, address: int) -> str:
    """The class the engine stores for an instruction: iced's mnemonic, lower case."""
    import iced_x86

    from ..proof.forms import MNEMONIC_NAMES

    ins = iced_x86.Decoder(64, raw, ip=address).decode()
    return "" if ins.is_invalid else MNEMONIC_NAMES.get(ins.mnemonic, "")


def _policy_allows(raw: bytes, address: int, rule: str, rules) -> bool:
    from ..x86.decode import decode

    decoded = decode(raw, address)
    return isinstance(decoded, Instruction) and classify(decoded, rules).name == rule


def _rows(store, image: Image, chosen: dict):
    """The rows of the chosen functions (a query each, or one pass over the image when they are many)."""
    if len(chosen) > PER_FUNCTION_LIMIT:
        return (row for row in store.iter_rows(image.id) if (row.function_start, row.function) in chosen)
    return (row for r in sorted(chosen.values(), key=lambda r: (r.start, r.name)) for row in store.function_rows(r.id))


def _images(store, path: str) -> list[Image]:
    """The store's images: the kernel first, then modules by name, then user-space images."""
    runs: dict[int, list[dict]] = {}
    for run in store.runs():
        runs.setdefault(run["image"], []).append(run)
    newest = store.find_image()
    ids = set(runs) | ({newest} if newest is not None else set())
    if not ids:
        raise InputError(f"{path}: the store holds no image yet; run `relocverify vmlinux --db {path}` first")
    images = []
    for i in ids:
        info = store.image_info(i)
        config = _config(runs.get(i, []))
        if config.get("policy") == "user":
            kind, module = "user", None
        elif info.get("format") == "module":
            kind, module = "module", module_name(info.get("path") or "")
        else:
            kind, module = "kernel", None
        tramp = config.get("tramp")
        images.append(Image(i, kind, module, info.get("path") or "", info.get("sha256") or "",
                            tramp if isinstance(tramp, int) else None))
    order = {"kernel": 0, "module": 1, "user": 2}
    return sorted(images, key=lambda m: (order[m.kind], m.module or "", m.path, m.id))


def _config(runs: list[dict]) -> dict:
    """The configuration of the image's newest run that has one."""
    for run in reversed(runs):
        try:
            return dict(json.loads(run["config"] or "{}"))
        except (ValueError, TypeError):
            continue
    return {}


def module_name(path: str) -> str:
    """The name the kernel knows a module by: its file name without .ko (and .xz, .zst, .gz), '-' as '_'."""
    name = os.path.basename(path)
    for suffix in (".xz", ".zst", ".gz"):
        name = name.removesuffix(suffix)
    return name.removesuffix(".ko").replace("-", "_")
