"""Everyday use on the default kernel (issue 43): what a user types first works as the help says."""

from __future__ import annotations

import io
import re
import subprocess
import sys

import pytest

from relocverify import cli

pytestmark = pytest.mark.slow  # the default kernel (the Debian 6.1 cloud packages, in the cache)


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_a_location_without_an_image_is_read_in_the_default_kernel(debian_kernels, capsys):
    debian_kernels("debian-6.1-cloud")
    code, out, err = run("check", "vfs_read+0x1c")
    assert code == cli.EXIT_CLEAN, err
    assert "movq %rax, 0x60(%rsp)" in out and "default kernel" in capsys.readouterr().err


def test_the_help_examples_of_check_are_instructions_of_the_default_kernel(debian_kernels):
    debian_kernels("debian-6.1-cloud")
    text = subprocess.run([sys.executable, "-m", "relocverify", "check", "--help"], capture_output=True,
                          text=True).stdout
    examples = sorted(set(re.findall(r"(?:kprobe:)?tcp_v4_rcv\+\w+", " ".join(text.split()))))
    assert len(examples) >= 3, text
    for example in examples:
        code, out, err = run("check", example)
        assert code == cli.EXIT_CLEAN and "inside an instruction" not in err, (example, err)
