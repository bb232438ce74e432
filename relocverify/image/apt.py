"""``apt-get download`` into a directory: the one way relocverify obtains Debian packages (the named kernels,
a package's ``-dbg``), with ``apt-get update`` once when the lists do not know a package."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ..errors import FetchError


def download(cache: Path, package: str, update: bool = True) -> None:
    """``apt-get download package`` (``name`` or ``name=version``) run in ``cache``; FetchError with apt's last
    line when it fails.  ``update``: run ``apt-get update`` once when the lists do not know the package."""
    apt = shutil.which("apt-get")
    if apt is None:
        raise FetchError(f"apt-get not found: download {package} from a Debian mirror into {cache} "
                         "and run the fetch again")
    result = _run([apt, "download", package], cache)
    if update and result.returncode != 0 and ("Unable to locate package" in result.stderr
                                   or "Can't find a source" in result.stderr):
        update = _run([apt, "update"], cache)
        if update.returncode != 0:
            raise FetchError(f"apt-get update failed: {last_line(update.stderr)}")
        result = _run([apt, "download", package], cache)
    if result.returncode != 0:
        raise FetchError(f"apt-get download {package} failed: {last_line(result.stderr)}")


def download_version(cache: Path, package: str, version: str, update: bool = True) -> Path:
    """``apt-get download package=version`` into ``cache``: the .deb it left (FetchError if none)."""
    before = set(cache.glob(f"{package}_*.deb"))
    download(cache, f"{package}={version}", update)
    after = sorted(set(cache.glob(f"{package}_*.deb")) - before) or sorted(cache.glob(f"{package}_*.deb"))
    if not after:
        raise FetchError(f"apt-get download {package}={version} left no .deb in {cache}")
    return after[-1]


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except OSError as exc:
        raise FetchError(f"cannot run {command[0]}: {exc.strerror}") from None


def last_line(text: str) -> str:
    """apt's last line that is not a warning: what it says went wrong."""
    lines = [line for line in text.strip().splitlines() if not line.startswith("W:")]
    return lines[-1] if lines else "(no message)"
