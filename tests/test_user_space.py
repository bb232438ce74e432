"""User-space ELF (the fasttrap and uprobes case): its own policy table, whole code coverage
for stripped binaries, one verdict per instruction."""

from __future__ import annotations

import io
import json

import pytest

from relocverify.cli import main
from relocverify.engine.run import RunOptions, run
from relocverify.image.functions import find_functions
from relocverify.image.loader import load_image
from relocverify.plan.policy import USER_RULES
from relocverify.store.store import Results

USER_ASM = r"""
    .section .text, "ax"
    .globl user_f
    .type user_f, @function
user_f:
    push %rbp
    pushfq
    popfq
    mov 0x10(%rip), %rax
    mov %fs:0x28, %rdx
    syscall
    cli
    ud2
    endbr64
    ret
    .size user_f, .-user_f
"""
USER_LDS = "SECTIONS { . = 0x401000; .text : { *(.text) } /DISCARD/ : { *(.note.gnu.property) *(.comment) } }"


@pytest.fixture(scope="module")
def user_image(tmp_path_factory):
    import elfbuild

    return load_image(elfbuild.build_elf(tmp_path_factory.mktemp("user"), USER_ASM, USER_LDS))


def test_the_user_policy_differs_where_user_mode_does(user_image, tmp_path):
    db = tmp_path / "s.sqlite"
    summary = run(user_image, str(db), RunOptions(0x501000, 1, 10.0, None, False, None, "user"))
    store = Results(str(db))
    rows = {r.klass: r for r in store.iter_rows(store.find_image(user_image.identity))}
    store.close()
    assert summary["totals_add_up"] and summary["by_verdict"]["refuted"] == 0
    assert rows["popfq"].verdict == "rejected" and "TF" in rows["popfq"].reason, \
        "popf cannot change IF in user mode, but it can set TF, whose trap a copy moves"
    assert rows["syscall"].verdict == "rejected" and "rcx" in rows["syscall"].reason
    assert rows["cli"].rule == "privileged" and rows["ud2"].rule == "ud"
    assert rows["mov"].verdict == "proved" and rows["endbr64"].verdict == "proved"
    assert all(r.sites == () for r in rows.values()), "no kernel site tables in user space"
    assert {r.name for r in USER_RULES} >= {"privileged", "popf", "syscall", "ud"}


def test_the_user_policy_has_its_own_cache_tag():
    from relocverify.plan.policy import RULES
    from relocverify.proof.cache_key import cache_tag

    assert cache_tag(RULES) != cache_tag(USER_RULES)


def test_a_kernel_image_is_refused_by_elf_and_a_user_one_by_vmlinux(user_image, tmp_path):
    import test_engine  # noqa: F401  (its SMALL image is a kernel-half ELF)
    import elfbuild

    kernel = elfbuild.build_elf(tmp_path, test_engine.SMALL_ASM, test_engine.SMALL_LDS)
    err = io.StringIO()
    assert main(["elf", str(kernel), "--no-cache"], io.StringIO(), err) == 2 and "relocverify vmlinux" in err.getvalue()
    err = io.StringIO()
    assert main(["vmlinux", user_image.path, "--no-cache"], io.StringIO(), err) == 2 and "not a kernel" in err.getvalue()


@pytest.mark.slow
def test_a_stripped_system_binary_is_covered_whole(tmp_path):
    """/usr/bin/ls keeps only .dynsym: its code is swept whole, and every instruction gets one verdict."""
    image = load_image("/usr/bin/ls")
    assert image.symbol_source == "dynsym"
    text = image.get_section(".text")
    functions = find_functions(image)
    assert sum(f.size for f in functions if f.section == ".text") == text.size
    out = io.StringIO()
    code = main(["elf", "/usr/bin/ls", "--db", str(tmp_path / "s.sqlite"), "--summary-json",
                 str(tmp_path / "s.json"), "--no-progress", "--no-cache"], out, io.StringIO())
    summary = json.loads((tmp_path / "s.json").read_text())
    assert code == 0 and summary["totals_add_up"] and summary["instructions"] > 15_000
    assert summary["by_verdict"]["refuted"] == 0


@pytest.mark.slow
def test_a_directory_of_binaries_is_one_run_with_totals_per_file(tmp_path):
    """A directory (as /usr/bin): every x86-64 ELF file in it gets its own summary with totals that add
    up, into one store; scripts and data are skipped with why; a link to a file counts it once."""
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("true", "echo"):
        shutil.copy(f"/usr/bin/{name}", bin_dir / name)
    (bin_dir / "script").write_text("#!/bin/sh\necho hi\n")
    (bin_dir / "true-again").symlink_to(bin_dir / "true")
    out = io.StringIO()
    code = main(["elf", str(bin_dir), "--db", str(tmp_path / "u.sqlite"), "--summary-json", str(tmp_path / "u.json"),
                 "--no-progress", "--no-cache", "--jobs", "2"], out, io.StringIO())
    doc = json.loads((tmp_path / "u.json").read_text())
    assert code == 0, out.getvalue()
    assert sorted(p.rsplit("/", 1)[-1] for p in doc["images"]) == ["echo", "true"]
    assert list(doc["skipped"].values()) == ["not an ELF file (a script or data)"]
    assert doc["totals_add_up"] and all(s["totals_add_up"] for s in doc["images"].values())
    assert sum(doc["totals"].values()) == sum(s["instructions"] for s in doc["images"].values()) > 1000
    assert doc["totals"]["refuted"] == 0
    store = Results(str(tmp_path / "u.sqlite"))
    assert store.db.execute("SELECT count(*) FROM images").fetchone()[0] == 2
    store.close()
