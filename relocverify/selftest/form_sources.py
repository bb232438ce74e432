"""Where the instances of instruction forms come from: real code, the corpora and the planner's own output.

Each source yields raw instruction bytes; ``collect`` groups them by form
(``proof.forms``), keeping up to ``keep`` distinct instances per form and a
count of how often each form occurs (the table records both).

* ``kernel_instructions(name)``: every instruction of a Debian kernel's
  vmlinux (``image.fetch``), and with ``modules`` of every module;
* ``elf_instructions(path)``: every instruction of user-space ELF files;
* ``corpus_instructions()``: every ``hex`` and ``reloc`` of the corpora;
* ``plan_instructions(raws)``: the instructions of the planner's trampolines
  for those originals, at a near and at a far trampoline (jumps back,
  absolute jumps, scratch moves).
"""

from __future__ import annotations

import glob
import os
import tomllib
from collections import Counter, defaultdict
from typing import Iterable, Iterator

import iced_x86

from ..errors import RelocverifyError
from ..image.fetch import extract_modules, fetch
from ..image.functions import find_functions, iter_instruction_spans
from ..kernel.sites import find_sites
from ..kernel.variants import NoVariants, VariantFinder
from ..plan.plan import PlanKind, make_plan
from ..proof.forms import facts
from ..proof.reachable import reachable


def kernel_instructions(name: str, modules: bool = False) -> Iterator[bytes]:
    from ..image.loader import load_image
    from ..image.module import load_modules

    fetched = fetch(name)
    kernel = load_image(fetched.vmlinux)
    for function in find_functions(kernel):
        for _, raw in iter_instruction_spans(kernel, function):
            yield raw
    yield from variant_instructions(kernel, fetched.config)
    if modules:
        for _, image in load_modules(extract_modules(name), kernel):
            for function in find_functions(image):
                for _, raw in iter_instruction_spans(image, function):
                    yield raw
            yield from variant_instructions(image)


def variant_instructions(image, config=None) -> Iterator[bytes]:
    """Every instruction a boot-patched site can hold (``kernel.variants``): the UP form of an SMP lock
    (``ds`` for ``lock``), NOPs and jumps of jump labels, retpoline and return-thunk replacements, and
    each alternative's replacement instructions."""
    index = find_sites(image, config)
    finder = VariantFinder(image)
    for site in index.iter_sites():
        if site.kind == "alternative":
            repl = finder.replacement_instructions(site)
            if not isinstance(repl, NoVariants):
                yield from (raw for _, raw in repl)
        if site.length <= 0 or site.length > 64:
            continue
        try:
            raw = image.read(site.address, 15)
        except RelocverifyError:  # a site at the end of its section: read what there is
            try:
                raw = image.read(site.address, site.length)
            except RelocverifyError:
                continue
        found = finder.variants_at(site, site.address, raw[:max(_length(raw), 1)])
        if not isinstance(found, NoVariants):
            yield from (v.raw for v in found)


def _length(raw: bytes) -> int:
    ins = iced_x86.Decoder(64, raw).decode()
    return 0 if ins.is_invalid else ins.len


def elf_instructions(paths: Iterable[str]) -> Iterator[bytes]:
    from ..image.loader import load_image

    for path in paths:
        try:
            image = load_image(path)
        except RelocverifyError:
            continue
        for function in find_functions(image):
            for _, raw in iter_instruction_spans(image, function):
                yield raw


def corpus_files() -> list[str]:
    here = os.path.dirname(__file__)
    return sorted(glob.glob(os.path.join(here, "..", "..", "corpora", "*.toml")))


def corpus_instructions(files: Iterable[str] | None = None) -> Iterator[bytes]:
    for path in files or corpus_files():
        with open(path, "rb") as f:
            data = tomllib.load(f)
        for entry in data.get("entry", []):
            for key in ("hex", "reloc"):
                text = entry.get(key)
                if isinstance(text, str):
                    try:
                        code = bytes.fromhex(text.replace(" ", ""))
                    except ValueError:
                        continue
                    if key == "hex":
                        yield code
                    else:
                        yield from (raw for _, raw in reachable(code, 0x1000).instructions)


def plan_instructions(raws: Iterable[bytes], at: int = 0xFFFFFFFF81234560,
                      tramps: tuple[int, ...] = (0xFFFFFFFFC0001000, 0x00007F0000001000)) -> Iterator[bytes]:
    from ..x86.decode import decode

    for raw in raws:
        decoded = decode(raw, at)
        for t in tramps:
            plan = make_plan(decoded, t)
            if plan.kind is PlanKind.REJECT or not plan.trampoline:
                continue
            yield from (r for _, r in reachable(plan.trampoline, t).instructions)


def collect(instructions: Iterable[bytes], keep: int = 4,
            forms: dict | None = None, counts: Counter | None = None) -> tuple[dict[str, list[bytes]], Counter]:
    """Group instructions by form: up to ``keep`` distinct instances each, and how many were seen."""
    forms = forms if forms is not None else defaultdict(list)
    counts = counts if counts is not None else Counter()
    for raw in instructions:
        f = facts(bytes(raw))
        if f is None:
            continue
        raw = bytes(raw)
        counts[f.form] += 1
        seen = forms[f.form]
        if len(seen) < keep and raw not in seen:
            seen.append(raw)
    return forms, counts
