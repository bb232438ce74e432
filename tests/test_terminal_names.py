"""Names taken from an input never reach the terminal raw (issue 44): symbol names of any bytes (C0 and C1
controls, escape and OSC sequences, bidi and invisible characters, bytes that are no UTF-8) printed by
vmlinux, show (from the image and from the store), check and audit come out as text, every line printable.

The names are generated and written into the ELF's string table in place of placeholders of the same length,
so that they hold bytes no assembler would take (a carriage return, a newline)."""

from __future__ import annotations

import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relocverify import cli

WIDTH = 16
START = 0xffffffff81000000
LDS = "SECTIONS { . = 0xffffffff81000000; .text : { *(.text) } /DISCARD/ : { *(.note.gnu.property) } }"
NAMES = st.lists(st.one_of(st.binary(min_size=1, max_size=1).filter(lambda b: b != b"\0"),
                           st.sampled_from([b"\x1b[2J", b"\x1b]0;title\x07", b"\xc2\x9b31m", b"\xe2\x80\xae",
                                            b"\xe2\x80\x8b", b"\r", b"\n", b"\x7f"])),
                 min_size=1, max_size=6).map(lambda parts: b"".join(parts)[:WIDTH])


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return cli.main(list(argv), out, err), out.getvalue(), err.getvalue()


def _image(d, names: list[bytes]) -> str:
    import elfbuild

    holders = [f"PH{i:02d}".ljust(WIDTH, "_") for i in range(len(names))]
    asm = '    .section .text, "ax"\n'
    for i, h in enumerate(holders):
        asm += (f"    .globl {h}\n    .type {h}, @function\n{h}:\n    sti\n    call {holders[(i + 1) % len(holders)]}\n"
                f"    ret\n    .size {h}, .-{h}\n")
    path = elfbuild.build_elf(d, asm, LDS)
    data = path.read_bytes()
    for h, name in zip(holders, names):
        assert data.count(h.encode()) == 1
        data = data.replace(h.encode(), name.ljust(WIDTH, b"_"))
    path.write_bytes(data)
    return str(path)


def _printable(text: str) -> bool:
    return all(line.isprintable() for line in text.split("\n"))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(NAMES, min_size=2, max_size=3, unique=True))
def test_symbol_names_reach_the_terminal_as_text(tmp_path_factory, names):
    d = tmp_path_factory.mktemp("names")
    image = _image(d, names)
    db = str(d / "s.sqlite")
    runs = [("vmlinux", image, "--db", db, "--no-progress", "--no-cache"),
            ("vmlinux", image, "--db", db, "--no-progress", "--no-cache", "--fail-on", "rejected"),
            ("show", db, hex(START)), ("show", image, hex(START), "--no-cache"),
            ("check", "--image", image, hex(START), "--no-cache"), ("check", "--image", image, hex(START + 1)),
            ("audit", image, "--tracer", "kinst", "--db", str(d / "a.sqlite"), "--no-progress", "--no-cache"),
            ("export", db, "--format", "perf"), ("export", db, "--format", "bpftrace"),
            ("show", db, "PH00"), ("check", "--image", image, "PH00", "--no-cache")]
    for argv in runs:
        code, out, err = _cli(*argv)
        assert code in (0, 1, 2) and "internal error" not in err, (argv, err)
        assert _printable(out) and _printable(err), (argv, out, err)
