"""Fixtures shared by the test modules."""

from __future__ import annotations

import os

import pytest

from relocverify.image.fetch import KERNELS, fetch, stripped_copy

#: The real kernels the tests download and read.  Only the Debian 6.1 cloud kernel (about 310 MB
#: of packages) by default; name more with RELOCVERIFY_TEST_KERNELS=debian-6.1-cloud,debian-6.1-amd64
#: (the amd64 packages are 925 MB, the 6.12 cloud ones 345 MB).
TEST_KERNELS = [k for k in os.environ.get("RELOCVERIFY_TEST_KERNELS", "debian-6.1-cloud").split(",") if k]
for _name in TEST_KERNELS:
    if _name not in KERNELS:
        raise pytest.UsageError(f"RELOCVERIFY_TEST_KERNELS names {_name!r}; choose from {', '.join(sorted(KERNELS))}")


@pytest.fixture(autouse=True)
def _private_proof_cache(tmp_path_factory, monkeypatch):
    """Commands that use the persistent proof cache by default get a private one per test session,
    so that no test depends on what another (or an earlier session) proved."""
    monkeypatch.setenv("RELOCVERIFY_PROOF_CACHE", str(tmp_path_factory.getbasetemp() / "proof-cache"))


@pytest.fixture(scope="session")
def debian_kernels():
    """get(name) -> (FetchedKernel, path of a stripped copy of its vmlinux), fetched once per session."""
    cache = {}

    def get(name):
        if name not in cache:
            kernel = fetch(name)
            cache[name] = (kernel, stripped_copy(kernel.vmlinux))
        return cache[name]
    return get


#: What a test run must not leave behind: files under the tracked reports/ directory, and scratch
#: directories in the system's temporary directory (a Dask LocalCluster's, the engine's shards).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LEFTOVER_PREFIXES = ("dask-scratch-space", "relocverify-dask-")


def _footprint() -> dict[str, float]:
    import tempfile

    out = {}
    reports = os.path.join(_ROOT, "reports")
    for name in os.listdir(reports):
        out[os.path.join(reports, name)] = os.stat(os.path.join(reports, name)).st_mtime
    scratch = tempfile.gettempdir()
    for name in os.listdir(scratch):
        if name.startswith(_LEFTOVER_PREFIXES):
            out[os.path.join(scratch, name)] = os.stat(os.path.join(scratch, name)).st_mtime
    return out


@pytest.fixture(scope="session", autouse=True)
def _leaves_nothing_behind():
    """The whole session leaves reports/ and the temporary directory as it found them: the test
    fails at the end of the session naming what was written (screenshots go to a temporary
    directory unless RELOCVERIFY_SCREENSHOTS asks for them)."""
    before = _footprint()
    yield
    after = _footprint()
    written = sorted(p for p, m in after.items() if before.get(p) != m
                     and not (os.environ.get("RELOCVERIFY_SCREENSHOTS") and p.endswith(".png")))
    assert not written, f"the test session wrote outside its temporary directories: {written}"


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the tests marked slow (whole real kernels; CI runs them: .ci/run)")


def pytest_collection_modifyitems(config, items):
    """Plain ``pytest`` is the fast suite; ``--slow`` (or ``-m slow``) adds the whole-kernel tests."""
    if config.getoption("--slow") or "slow" in (config.getoption("-m") or ""):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


def ensure_linux_source(version: str) -> None:
    """/usr/src/linux-source-VERSION.tar.xz (the kernel's insn decoder and the tracers' decision code
    are built from it), installed with apt-get when missing, as the report tests' Chromium is; a skip
    with the reason only when it cannot be installed here."""
    import shutil
    import subprocess

    from relocverify.x86.decoders import linux_insn

    tarball = linux_insn.PACKAGE_TARBALL.format(version=version)
    if os.path.isfile(tarball):
        return
    package = f"linux-source-{version}"
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(f"{tarball} is missing and cannot be installed here (not root): apt-get install {package}")
    why = ""
    for command in (["apt-get", "install", "-y", "-qq", package],
                    ["sh", "-c", f"apt-get update -qq && apt-get install -y -qq {package}"]):
        proc = subprocess.run(command, capture_output=True, text=True)
        if os.path.isfile(tarball):
            return
        why = (proc.stderr.strip().splitlines() or ["no message"])[-1]
    pytest.skip(f"cannot install {package}: {why}")


@pytest.fixture(scope="session")
def linux_sources():
    """Both Debian kernel source packages the Linux tracer models and linux-insn are built from."""
    for version in ("6.1", "6.12"):
        ensure_linux_source(version)
