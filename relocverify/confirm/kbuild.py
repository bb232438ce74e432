"""Kernel modules built against the package's own headers, for sites only a module can probe or trigger.

``build_module(guest, source)`` returns the ``.ko`` of one C file (``programs/rvkprobe.c``: a kprobe by
``register_kprobe``), built with Kbuild against the guest kernel's ``linux-headers-<release>``, its
``linux-headers-<abi>-common`` and ``linux-kbuild-<major.minor>``, which ``apt-get download`` fetches
into ``<cache>/confirm/debs`` and ``dpkg-deb -x`` unpacks into ``<cache>/confirm/headers-<release>``.
Debian's flavour Makefile includes the common tree by its absolute ``/usr/src`` path; the unpacked
copy's is pointed at the unpacked common tree.  The compiler is the one the headers name
(``.kernelvariables``: gcc-12 for Debian 12's 6.1); a missing one is an ``InputError`` saying which
package to install.  The module is built once per source and kept beside the guest.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from ..errors import InputError


def header_packages(release: str) -> tuple[str, ...]:
    """``6.1.0-53-cloud-amd64`` -> its linux-headers, linux-headers-...-common and linux-kbuild packages."""
    match = re.match(r"^((\d+)\.(\d+)\.\d+-\d+)-", release)
    if match is None:
        raise InputError(f"{release}: not a Debian kernel release (MAJOR.MINOR.PATCH-ABI-FLAVOUR): no headers "
                         f"package to build a module against")
    abi, major, minor = match.groups()
    return f"linux-headers-{release}", f"linux-headers-{abi}-common", f"linux-kbuild-{major}.{minor}"


def build_module(guest, source: Path, cache_dir: Path, say=None) -> Path:
    """The module built from ``source`` for ``guest``'s kernel (see the module doc)."""
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    out = Path(guest.directory) / f"{source.stem}-{digest}.ko"
    if out.is_file():
        return out
    tree = _headers(guest.release, cache_dir, say)
    compiler = _compiler(tree)
    work = Path(guest.directory) / f"kbuild-{source.stem}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    shutil.copy(source, work / source.name)
    (work / "Kbuild").write_text(f"obj-m := {source.stem}.o\n")
    if say:
        say(f"building {source.name} against linux-headers-{guest.release} ({compiler}) ...")
    result = subprocess.run(["make", "-C", str(tree), f"M={work}", f"CC={compiler}", "modules"],
                            capture_output=True, text=True, stdin=subprocess.DEVNULL)
    built = work / f"{source.stem}.ko"
    if result.returncode != 0 or not built.is_file():
        lines = [line for line in (result.stderr or result.stdout).splitlines() if line.strip()]
        raise InputError(f"building {source.name} against linux-headers-{guest.release} failed: "
                         f"{lines[-1] if lines else 'no message'}")
    os.replace(built, out)
    shutil.rmtree(work, ignore_errors=True)
    return out


def _headers(release: str, cache_dir: Path, say) -> Path:
    """The unpacked flavour headers tree of ``release``, downloaded and unpacked on first use."""
    root = cache_dir / f"headers-{release}"
    tree = root / "usr" / "src" / f"linux-headers-{release}"
    if (root / ".complete").is_file():
        return tree
    debs = cache_dir / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    found = []
    for package in header_packages(release):
        have = sorted(debs.glob(f"{package}_*.deb"))
        if not have:
            if say:
                say(f"downloading {package} with apt-get download ...")
            _run(["apt-get", "download", package], debs, f"apt-get download {package}")
            have = sorted(debs.glob(f"{package}_*.deb"))
            if not have:
                raise InputError(f"apt-get download {package} left no .deb in {debs}")
        found.append(have[-1])
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for deb in found:
        _run(["dpkg-deb", "-x", str(deb), str(root)], root, f"dpkg-deb -x {deb.name}")
    makefile = tree / "Makefile"
    if not makefile.is_file():
        raise InputError(f"{found[0].name} has no usr/src/linux-headers-{release}/Makefile")
    makefile.write_text(makefile.read_text().replace("include /usr/src/", f"include {root}/usr/src/"))
    (root / ".complete").write_text("")
    return tree


def _compiler(tree: Path) -> str:
    variables = tree / ".kernelvariables"
    text = variables.read_text() if variables.is_file() else ""
    match = re.search(r"\)gcc-(\d+)", text)
    name = f"gcc-{match.group(1)}" if match else "gcc"
    if shutil.which(name) is None:
        raise InputError(f"the kernel's headers want {name}, which is not installed (apt-get install {name})")
    return name


def _run(argv: list[str], cwd: Path, what: str) -> None:
    if shutil.which(argv[0]) is None:
        raise InputError(f"{argv[0]} not found: it is needed for {what}")
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("W:")]
        raise InputError(f"{what} failed: {lines[-1] if lines else 'no message'}")
