"""After a run: the store's path and three commands that work when pasted; a second run of a complete store
says so instead of "wall: 0.0 s, 0 insn/s" (issue 43)."""

from __future__ import annotations

import io
import shlex

import pytest

from relocverify import cli


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def small_image(tmp_path_factory):
    import elfbuild
    import test_engine

    d = tmp_path_factory.mktemp("next")
    return str(elfbuild.build_elf(d, test_engine.SMALL_ASM, test_engine.SMALL_LDS)), d


def test_the_pasted_next_steps_work_and_a_second_run_is_already_complete(small_image, tmp_path):
    image, _ = small_image
    db = str(tmp_path / "a store with spaces.sqlite")
    code, out, err = run("vmlinux", image, "--db", db, "--no-progress")
    assert code == 0, err
    lines = out.splitlines()
    at = lines.index("next:")
    assert lines[at - 1] == f"store: {db}"
    commands = [shlex.split(line) for line in lines[at + 1:at + 4]]
    assert [c[1] for c in commands] == ["show", "report", "export"] and all(c[2] == db for c in commands)
    for words in commands:
        words = [w.replace("reports/html", str(tmp_path / "html")).replace("probes.bt", str(tmp_path / "p.bt"))
                 for w in words]
        code, _, err = run(*words[1:])
        assert code in (0, 1), (words, err)  # 1: findings (e.g. a rejected row), never a usage error
    code, again, _ = run("vmlinux", image, "--db", db, "--no-progress")
    assert code == 0 and "already complete:" in again and "insn/s" not in again
