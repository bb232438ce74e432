"""The engine's one entry point (``engine.verify.verify``) and the audit's (``tracers.run.audit``): every kind of
request (``engine.requests.REQUESTS``) has a row in each table, with what it does; anything else is a caller's
mistake said in one line; a request is a frozen value; and ``verify(KernelRequest(...))`` gives what the
engine's run of that image gives (what ``verify_vmlinux`` returned before the requests)."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest

from relocverify.cli import main
from relocverify.cli.render import escape
from relocverify.engine.requests import (REQUESTS, ElfRequest, ImageRequest, KernelRequest, ModuleRequest,
                                         PackageRequest)
from relocverify.engine.run import RunOptions, run
from relocverify.engine.summary import render_summary
from relocverify.engine.verify import WAYS, verify, way_of
from relocverify.errors import InputError
from relocverify.image.loader import load_image
from relocverify.schedule.progress import Progress
from relocverify.tracers.run import AUDITS, audit, audit_way

from test_engine import SMALL_ASM, SMALL_LDS, TRAMP

#: What a summary holds that differs from one run of the same image to the next.
PER_RUN = ("run", "wall_s", "instructions_per_s")


def _options() -> RunOptions:
    return RunOptions(TRAMP, 1, 10.0)


def test_every_kind_of_request_has_a_way_to_be_verified_and_audited():
    assert set(WAYS) == set(AUDITS) == set(REQUESTS)
    assert all(way.does for way in WAYS.values())
    assert all(bool(way.does) != bool(way.refused) for way in AUDITS.values())  # each row: what it does, or why not


@pytest.mark.parametrize("request_", [object(), "vmlinux", ("vmlinux",)])
def test_what_is_not_a_request_is_refused_in_one_line_naming_the_requests(request_):
    for entry in (lambda: verify(request_), lambda: audit(request_, [])):
        with pytest.raises(InputError, match=r"takes a request of engine\.requests \(KernelRequest(, \w+Request)+\); \w+ is not one"):
            entry()
    with pytest.raises(InputError):
        way_of(request_)


def test_the_audit_refuses_several_user_space_files_with_the_way_out():
    with pytest.raises(InputError, match=r"takes no ElfRequest: .*one at a time, each as an ImageRequest"):
        audit_way(ElfRequest(["a", "b"], _options()))


def test_a_request_is_a_frozen_value_and_its_hooks_are_not_part_of_it():
    options = _options()
    modules = ModuleRequest(["a.ko", "b.ko"], "vmlinux", options, "s.sqlite")
    assert modules.modules == ("a.ko", "b.ko") and ElfRequest(["x"], options).paths == ("x",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        modules.db = "other"
    assert KernelRequest("v", options, check_store=print) == KernelRequest("v", options)
    assert PackageRequest("k", options, "s", on_parts=print) == PackageRequest("k", options, "s")
    assert all(dataclasses.is_dataclass(t) and t.__dataclass_params__.frozen for t in REQUESTS)
    assert ImageRequest in REQUESTS


def test_verify_of_a_kernel_request_is_the_engine_s_run_of_that_image(tmp_path):
    import elfbuild

    path = str(elfbuild.build_elf(tmp_path, SMALL_ASM, SMALL_LDS))
    db = str(tmp_path / "v.sqlite")
    summary = verify(KernelRequest(path, _options(), db))
    direct = run(load_image(path), str(tmp_path / "direct.sqlite"), _options(), Progress(enabled=False))
    stable = {k: v for k, v in summary.document.items() if k not in PER_RUN}
    assert stable == {k: v for k, v in direct.items() if k not in PER_RUN}
    assert summary.document["instructions"] == summary.instructions == 19
    assert dict(summary.by_verdict) == direct["by_verdict"] and summary.totals_add_up and summary.complete
    assert (summary.store, summary.batch, summary.images, summary.tramp) == (db, False, 1, TRAMP)
    # the command renders what the entry point returned: here the same image again, answered from the store
    out, written = io.StringIO(), tmp_path / "summary.json"
    assert main(["vmlinux", path, "--db", db, "--jobs", "1", "--no-progress", "--no-cache", "--summary-json",
                 str(written)], out=out, err=io.StringIO()) == 0
    again = json.loads(written.read_text())
    assert again["run"]["verified_now"] == 0 and again["by_verdict"] == summary.document["by_verdict"]
    assert out.getvalue().startswith(render_summary(again, escape) + f"store: {db}\n")


def test_the_audit_of_a_kernel_request_is_that_of_the_image_loaded(tmp_path):
    """The audit is the engine's request plus an auditor: a ``KernelRequest`` gives what the audit's IMAGE
    (``image_request``, loaded first) gives for the same kernel."""
    import elfbuild
    import test_audit
    from relocverify.engine.verify import image_request
    from relocverify.tracers import get_model

    path = str(elfbuild.build_elf(tmp_path, test_audit.AUDIT_ASM, test_audit.AUDIT_LDS))
    models = [get_model("kprobes@6.1")]
    by_kernel = audit(KernelRequest(path, _options(), str(tmp_path / "k.sqlite")), models)
    by_image = audit(image_request(path, _options(), str(tmp_path / "i.sqlite")), models)
    assert by_kernel.store == str(tmp_path / "k.sqlite") and by_kernel.instructions == by_image.instructions == 13
    assert by_kernel.tracers == by_image.tracers  # each bucket's count (a counterexample's values may differ)
    for key in ("functions", "tramp", "cases", "image", "own"):
        assert by_kernel.document[key] == by_image.document[key], key
