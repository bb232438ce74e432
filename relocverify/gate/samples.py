"""The gate's inputs as samples: distinct byte strings, grouped into units.

A unit is one section of an image, one corpus file, or one fuzz run.  Each
keeps, per distinct byte string, the first address it occurs at and how
often it occurs: every decoder is asked about each distinct string once.

Instruction boundaries in an image come from a linear sweep by iced-x86
over each function (``image.functions.iter_instruction_spans``, int3
padding left out; ``x86.decoders.iced.sweep_into`` makes the same spans and
keeps iced-x86's answers on the way, so iced does not decode twice); each decoder is then asked about exactly those bytes, so
a decoder that reads a different length differs at that instruction rather
than desynchronising everything after it.  Fuzz samples are whole 15-byte
windows: there, each decoder decides where the first instruction ends.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..collector import paused
from ..errors import InputError
from ..processes import fork_map
from .answers import remember


@dataclass
class Unit:
    """One section, corpus file or fuzz run: distinct bytes -> [first address, occurrences]."""

    name: str
    samples: dict[bytes, list[int]] = field(default_factory=dict)
    instructions: int = 0
    path: str | None = None  # the input file (an image, a module tree, a corpus); None for a fuzz run

    def add(self, address: int, raw: bytes) -> None:
        self.instructions += 1
        seen = self.samples.get(raw)
        if seen is None:
            self.samples[raw] = [address, 1]
        else:
            seen[1] += 1


def image_units(path: str, jobs: int | None = None) -> list[Unit]:
    """One unit per executable section of the image at ``path``.

    With ``jobs`` > 1 the functions are split into contiguous runs swept by
    a fork pool; merging the runs in order keeps each string's first address."""
    from ..image.functions import find_functions
    from ..image.loader import load_image

    if not os.path.exists(path):
        raise InputError(f"--image {path}: no such file")
    image = load_image(path)
    functions = find_functions(image)
    jobs = jobs or os.cpu_count() or 1
    if jobs > 1 and len(functions) > 2_000:
        _SWEEP[:] = [image, functions]
        size = -(-len(functions) // (jobs * 2))
        runs = [(i, min(i + size, len(functions))) for i in range(0, len(functions), size)]
        parts = fork_map(_sweep_run, runs, jobs)
        _SWEEP.clear()
    else:
        with paused():  # a kernel's sweep keeps ~600 k samples and answers: 4.0 s with the collector, 2.7 without
            parts = [sweep_functions(image, functions)]
    from ..x86.decoders.iced import IcedAdapter

    base = os.path.basename(path)
    units: dict[str, Unit] = {}
    for part, facts in parts:
        remember(IcedAdapter(), facts)
        for section, (samples, count) in part.items():
            unit = units.get(section)
            if unit is None:
                unit = units[section] = Unit(f"{base}:{section}", path=path)
            unit.instructions += count
            mine = unit.samples
            for raw, seen in samples.items():
                have = mine.get(raw)
                if have is None:
                    mine[raw] = seen
                else:
                    have[1] += seen[1]
    return [units[k] for k in sorted(units)]


_SWEEP: list = []  # (image, functions) for forked sweep workers


def _sweep_run(run: tuple[int, int]):
    image, functions = _SWEEP
    return sweep_functions(image, functions[run[0]:run[1]])


def sweep_functions(image, functions) -> tuple[dict[str, tuple[dict[bytes, list[int]], int]], dict]:
    """section -> (bytes -> [first address, occurrences], instructions) over ``functions``,
    and iced-x86's answer for each distinct valid string, from the sweep's own decode."""
    from ..image.functions import function_bytes  # the bytes iter_instruction_spans sweeps
    from ..x86.decoders.iced import sweep_into

    out: dict[str, tuple[dict[bytes, list[int]], int]] = {}
    facts: dict = {}
    for function in functions:
        samples, count = out.get(function.section, ({}, 0))
        count += sweep_into(function_bytes(image, function), function.start, samples, facts)
        out[function.section] = (samples, count)
    return out, facts


def corpus_units(paths: list[str]) -> list[Unit]:
    """One unit per corpus file: each entry's bytes at its ``at`` address."""
    from ..corpus.runner import load_file

    units = []
    for path in paths:
        unit = Unit(f"corpus:{os.path.basename(path)}", path=path)
        for entry in load_file(path):
            unit.add(entry.at, entry.raw[:15])
        units.append(unit)
    return units
