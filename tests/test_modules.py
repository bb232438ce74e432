"""Kernel modules: a real Debian module laid out in module space, relocated against the real
vmlinux, its own site tables read from its sections, every instruction one verdict."""

from __future__ import annotations

import io
import json

import pytest

from relocverify.cli import main
from relocverify.errors import ImageError
from relocverify.image.fetch import extract_modules, fetch
from relocverify.image.functions import find_functions
from relocverify.image.loader import load_image
from relocverify.image.module import MODULE_BASE, load_module
from relocverify.kernel.sites import find_sites
from relocverify.x86.decode import decode

MODULES = ["tcp_bbr.ko", "virtio_net.ko"]


@pytest.fixture(scope="module")
def kernel():
    return fetch("debian-6.1-cloud")


@pytest.fixture(scope="module")
def modules(kernel):
    return {p.name: p for p in extract_modules("debian-6.1-cloud", MODULES)}


@pytest.mark.slow
def test_a_module_is_laid_out_and_relocated_against_the_kernel(kernel, modules):
    vmlinux = load_image(kernel.vmlinux)
    m = load_module(modules["virtio_net.ko"], vmlinux)
    text = m.get_section(".text")
    assert text.address >= MODULE_BASE and m.format == "module"
    # every call rel32 in the module's text now lands on a kernel or module function
    starts = {s.address for s in vmlinux.symbols if s.kind == "func"} | {s.address for s in m.symbols}
    calls = []
    for f in find_functions(m):
        if f.section != ".text":
            continue
        sec = m.get_section(f.section)
        data = sec.data[f.start - sec.address:f.end - sec.address]
        pos = 0
        while pos < len(data):
            d = decode(data[pos:pos + 15], f.start + pos)
            if getattr(d, "opname", "") == "call" and d.branch_target is not None:
                calls.append(d.branch_target)
            pos += d.length
    assert len(calls) > 50
    # calls to other modules' exports (virtio_ring's) go to the placeholder, named in the notes
    from relocverify.image.module import UNRESOLVED

    known = [t for t in calls if t != UNRESOLVED]
    assert sum(t in starts for t in known) / len(known) > 0.95
    assert any("other modules" in n for n in m.notes)
    sites = find_sites(m).count_by_kind()
    assert sites.get("return_thunk", 0) > 10 and sites.get("bug", 0) > 0


@pytest.mark.slow
def test_module_command_gives_every_instruction_one_verdict(kernel, modules, tmp_path):
    out = io.StringIO()
    code = main(["module", *map(str, modules.values()), "--kernel", kernel.vmlinux, "--db", str(tmp_path / "m.sqlite"),
                 "--summary-json", str(tmp_path / "m.json"), "--no-progress", "--no-cache"], out, io.StringIO())
    doc = json.loads((tmp_path / "m.json").read_text())
    assert code == 0 and doc["totals_add_up"] and len(doc["modules"]) == 2
    assert doc["totals"]["refuted"] == 0 and sum(doc["totals"].values()) > 9000


def test_a_linked_vmlinux_is_not_a_module(tmp_path):
    import elfbuild
    import test_engine

    linked = elfbuild.build_elf(tmp_path, test_engine.SMALL_ASM, test_engine.SMALL_LDS)
    with pytest.raises(ImageError, match="relocatable"):
        load_module(linked, None)


def test_modules_past_the_end_of_module_space_start_over_at_its_base(kernel, modules):
    """A package lays a thousand modules out one after the other; module space is 1 GiB, so a
    module that would run past its end is laid out at its start again, never past 2^64."""
    from relocverify.image.module import MODULE_BASE, MODULES_END, load_modules

    paths = sorted(modules.values())[:2]
    laid = list(load_modules(paths, load_image(kernel.vmlinux), MODULES_END - 0x1000))
    assert [p for p, _ in laid] == paths
    for _, image in laid:
        placed = [s for s in image.sections if s.alloc and s.size]
        assert MODULE_BASE <= min(s.address for s in placed) and max(s.end for s in placed) <= MODULES_END
