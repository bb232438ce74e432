"""Build small real x86-64 ELF images for the tests, with the machine's gcc and ld.

gcc and binutils are part of every machine this project runs on (and CI);
their absence is a failure with the fix named, not a skipped test.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest


def build_elf(directory, asm: str, script: str):
    """Assemble and link ``asm`` with linker script ``script`` into ``directory/vmlinux``."""
    missing = [t for t in ("gcc", "ld") if not shutil.which(t)]
    if missing:
        pytest.fail(f"building the test ELF needs {' and '.join(missing)}: apt-get install gcc binutils")
    source, obj, lds, out = (directory / n for n in ("k.s", "k.o", "k.lds", "vmlinux"))
    source.write_text(asm)
    lds.write_text(script)
    subprocess.run(["gcc", "-c", "-o", str(obj), str(source)], check=True)
    subprocess.run(["ld", "-static", "-nostdlib", "-T", str(lds), "-o", str(out), str(obj)], check=True)
    return out
