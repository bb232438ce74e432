"""The cache holds one copy of a kernel's vmlinux (issue 43, item 4): ``package DEB`` (``image.debian.unpacked``)
and a named kernel's fetch (``image.fetch``) read the same ``-dbg`` .deb, and each extracted the 589 MB vmlinux
on its own (a second copy under ``debs/``).  Now the second one hard-links the first one's files, in either
order.  Built with dpkg-deb, read by the real extraction code; fetch adopts .debs already in the cache, so
nothing is downloaded."""

from __future__ import annotations

import os
import shutil

import pytest

from relocverify.image import fetch as fetch_module
from relocverify.image.debian import unpacked
from relocverify.image.fetch import KernelSpec, fetch

from test_package_sources import build_deb

RELEASE = "9.9.9-one"
NAME = "test-one-vmlinux"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache with the two .debs of a named test kernel in it, as ``apt-get download`` leaves them."""
    spec = KernelSpec(NAME, RELEASE, f"linux-image-{RELEASE}-unsigned", f"linux-image-{RELEASE}-dbg", 1, "a test row")
    monkeypatch.setitem(fetch_module.KERNELS, NAME, spec)
    cache = tmp_path / "cache"
    cache.mkdir()
    build = tmp_path / "build"
    build.mkdir()
    debs = [build_deb(build, spec.unsigned, {f"boot/vmlinuz-{RELEASE}": b"bz", f"boot/config-{RELEASE}": b"C=y\n"}),
            build_deb(build, spec.dbg, {f"usr/lib/debug/boot/vmlinux-{RELEASE}": b"\x7fELF" + os.urandom(1 << 16),
                                        f"usr/lib/debug/boot/System.map-{RELEASE}": b"ffffffff81000000 T _stext\n"})]
    for deb in debs:
        shutil.copy2(deb, cache / deb.name)
    return cache


def _dbg(cache):
    return next(cache.glob(f"linux-image-{RELEASE}-dbg_*.deb"))


def _one_copy(kernel, tree) -> None:
    for name in (f"vmlinux-{RELEASE}", f"System.map-{RELEASE}"):
        named, other = os.stat(os.path.join(os.path.dirname(kernel.vmlinux), name)), \
            os.stat(tree / "usr/lib/debug/boot" / name)
        assert (named.st_ino, named.st_dev) == (other.st_ino, other.st_dev), name
        assert named.st_nlink == 2


def test_package_after_fetch_links_the_named_kernels_vmlinux(cache):
    kernel = fetch(NAME, cache)
    tree = unpacked(_dbg(cache), cache)
    _one_copy(kernel, tree)
    assert (tree / ".complete").is_file()
    assert unpacked(_dbg(cache), cache) == tree  # and it is reused as any extraction is


def test_fetch_after_package_links_the_unpacked_vmlinux(cache):
    tree = unpacked(_dbg(cache), cache)
    kernel = fetch(NAME, cache)
    _one_copy(kernel, tree)
    again = fetch(NAME, cache)  # the manifest records the linked files: reused, not extracted again
    assert again.sha256s == kernel.sha256s


def test_a_named_copy_changed_since_its_fetch_is_not_linked(cache):
    kernel = fetch(NAME, cache)
    with open(kernel.vmlinux, "ab") as handle:
        handle.write(b"changed")
    tree = unpacked(_dbg(cache), cache)
    assert os.stat(tree / f"usr/lib/debug/boot/vmlinux-{RELEASE}").st_ino != os.stat(kernel.vmlinux).st_ino
