"""A function symbol whose size runs past its section is cut at the section's end, and every output that shows
that function says so once (issue 44: clamped in silence): the run's summary, ``show`` from the image and
from the store, the report's provenance.  Which symbol and how far past are generated."""

from __future__ import annotations

import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relocverify import cli

NOTE = "function symbol(s) run past the end of their section"
FUNCTIONS = ("f_plain", "f_cpuid", "f_loop", "f_twice")


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return cli.main(list(argv), out, err), out.getvalue(), err.getvalue()


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(FUNCTIONS), size=st.integers(0x40, 1 << 31))
def test_a_symbol_past_its_section_is_said_by_every_output(tmp_path_factory, name, size):
    import elfbuild
    import test_engine

    d = tmp_path_factory.mktemp("past")
    asm = test_engine.SMALL_ASM.replace(f"    .size {name}, .-{name}", f"    .size {name}, {size:#x}")
    assert asm != test_engine.SMALL_ASM
    image = str(elfbuild.build_elf(d, asm, test_engine.SMALL_LDS))
    db = str(d / "s.sqlite")
    code, out, err = _cli("vmlinux", image, "--db", db, "--no-progress", "--no-cache")
    assert code == 0 and out.count(NOTE) == 1, err
    for source in (image, db):
        code, out, err = _cli("show", source, name, "--no-cache") if source == image else _cli("show", source, name)
        assert code == 0 and out.count(NOTE) == 1, (source, err)
    code, _, err = _cli("report", db, "-o", str(d / "report"))
    assert code == 0, err
    assert (d / "report" / "index.html").read_text().count(NOTE) == 1


def test_a_symbol_within_its_section_brings_no_note(tmp_path):
    import elfbuild
    import test_engine

    image = str(elfbuild.build_elf(tmp_path, test_engine.SMALL_ASM, test_engine.SMALL_LDS))
    code, out, err = _cli("show", image, "f_plain", "--no-cache")
    assert code == 0 and NOTE not in out and "note:" not in out, err
