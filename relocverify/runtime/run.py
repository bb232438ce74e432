"""A real kernel function run from random inputs, unprobed and probed, and compared (``relocverify run``):
one ``FunctionRun``.

``run_function`` checks what it is given before any machine is built (the argument SPEC, the CPU
features, that the image is a kernel and names the function: an InputError otherwise), then boots two
machines (``differential.Differential``, or ``jump_probes.JumpDifferential`` with jump probes where the
block is proved and the range safe, int3 probes elsewhere) and runs the trials.  The verdicts that decide
where a probe goes are the checker's (``verdicts.LiveVerdicts``), or a store's by address first
(``verdicts.StoreVerdicts``: a store that holds no results for the image is an InputError).  Nothing here
writes: the command line renders the report.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import InputError
from ..store.store import Results

if TYPE_CHECKING:  # unicorn and iced-x86 load only when a function is run
    from .differential import Report


@dataclass(frozen=True)
class FunctionRun:
    """The differential report, and with jump probes the count of each way a probe was placed or refused
    (``jump_probes.jump_summary_lines`` says it in words)."""

    report: Report
    jump_summary: Counter | None = None


def run_function(image_path: str, system_map: str | None, function: str, args: str, *, trials: int, seed: int,
                 probe_all: bool, jump_probes: bool, cpu_features: str | None, budget: int | None,
                 db: str | None, timeout: float, replay: str) -> FunctionRun:
    """Run ``function`` of the kernel image at ``image_path`` with ``trials`` random inputs drawn from the
    argument SPEC ``args`` (trial i seeded ``seed + i``), unprobed and with its first instruction (every
    instruction: ``probe_all``) probed; ``replay`` is the command line a divergence's replay line starts
    with."""
    from ..image.loader import load_image, require_kernel
    from ..kernel.sites import find_sites
    from .args import parse_spec
    from .differential import DEFAULT_BUDGET, Differential, find_function
    from .kernel import parse_cpu_features

    specs = parse_spec(args)
    features = parse_cpu_features(cpu_features)
    image = load_image(image_path, system_map)
    require_kernel(image)
    find_function(image, function)  # an unknown name is an InputError before the machines are built
    sites = find_sites(image)
    store = None
    try:
        if db is None:
            from .verdicts import LiveVerdicts

            verdicts = LiveVerdicts(sites, timeout)
        else:
            verdicts, store = _store_verdicts(db, image_path, image, sites, timeout)
        if jump_probes:
            from .jump_probes import JumpDifferential

            diff = JumpDifferential(image, features, sites, verdicts, budget or DEFAULT_BUDGET)
        else:
            diff = Differential(image, features, sites, verdicts, budget or DEFAULT_BUDGET)
        report = diff.run(function, specs, trials, seed, probe_all, replay)
    finally:
        if store is not None:
            store.close()
    return FunctionRun(report, diff.summary if jump_probes else None)


def _store_verdicts(db: str, image_path: str, image, sites, timeout: float):
    """(the store's verdicts for ``image``, the open store); an InputError when it holds no results for it."""
    from .verdicts import StoreVerdicts

    store = Results(db)
    image_id = store.find_image(image.identity)
    if image_id is None:
        store.close()
        raise InputError(f"{db}: holds no results for {image_path}; run relocverify vmlinux on it first")
    try:
        store.check_seals(image_id)  # probes go only where the store's verdicts are as relocverify wrote them
    except BaseException:
        store.close()
        raise
    return StoreVerdicts(sites, store, image_id, timeout), store
