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


def test_a_cloud_deb_finds_its_dbg_package_beside_it(debian_kernels, tmp_path):
    """``package DEB`` with the matching -dbg .deb in the same directory needs no --dbg (issue 43)."""
    import os

    from relocverify.image.debian import from_debs
    from relocverify.image.fetch import default_cache_dir

    debian_kernels("debian-6.1-cloud")
    cache = default_cache_dir()
    for name in os.listdir(cache):
        if name.startswith("linux-image-6.1.0-53-cloud-amd64-") and name.endswith(".deb"):
            os.symlink(os.path.join(cache, name), tmp_path / name)
    image = next(p for p in tmp_path.iterdir() if "-unsigned_" in p.name)
    parts = from_debs(image)
    assert parts.vmlinux.endswith("vmlinux-6.1.0-53-cloud-amd64") and "/usr/lib/debug/" in parts.vmlinux
