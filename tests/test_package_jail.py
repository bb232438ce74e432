"""Package extraction is a jail (``image.debian.extract``, issue 44): nothing is written outside the cache's
own directory for the package, members are checked from their headers before a byte is written, a partial
file never stays, a member named twice is refused, and a package file named ``.deb`` or ``..deb`` cannot
make the extraction directory the cache's ``debs/`` itself."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relocverify.errors import FetchError
from relocverify.image import debian
from relocverify.image.debian import unpacked

RELEASE = "9.9.9-test"


def _ar(members: list[tuple[str, bytes]]) -> bytes:
    out = [b"!<arch>\n"]
    for name, data in members:
        header = f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
        out += [header, data, b"\n" if len(data) % 2 else b""]
    return b"".join(out)


def _tar(entries: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _control(package: str) -> bytes:
    text = f"Package: {package}\nVersion: 9.9.9-1\nArchitecture: amd64\nMaintainer: t <t@example.org>\n" \
           f"Description: test\n".encode()
    info = tarfile.TarInfo("./control")
    info.size = len(text)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.addfile(info, io.BytesIO(text))
    return buf.getvalue()


def deb(path: Path, entries, package: str = f"linux-image-{RELEASE}-unsigned") -> Path:
    path.write_bytes(_ar([("debian-binary", b"2.0\n"), ("control.tar.gz", _control(package)),
                          ("data.tar", _tar(entries))]))
    return path


def regular(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


HOSTILE = st.sampled_from([
    "../../escape", f"./boot/../../../escape", "/boot/abs", f"./boot/vmlinuz-{RELEASE}/../../../../x",
    f"./lib/modules/{RELEASE}/../../../../etc/passwd", "./boot/./././ok",
])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(HOSTILE, min_size=1, max_size=4), st.sampled_from(["symlink", "hardlink", "device", "file"]))
def test_nothing_is_written_outside_the_package_s_directory(tmp_path, names, kind):
    import tempfile

    cache = Path(tempfile.mkdtemp(dir=tmp_path))  # one per example: hypothesis reuses tmp_path
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    entries = []
    for name in names:
        if kind == "file":
            entries.append(regular(name))
            continue
        info = tarfile.TarInfo(name)
        info.type = {"symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE, "device": tarfile.CHRTYPE}[kind]
        info.linkname = str(outside / "target")
        entries.append((info, None))
    entries.append(regular(f"./boot/vmlinuz-{RELEASE}", b"kernel"))
    package = deb(cache.with_suffix(".deb"), entries)
    try:
        target = unpacked(package, cache)
    except FetchError as exc:  # two names for one path: refused, which is fine too
        assert "twice" in str(exc)
        target = next((cache / "debs").iterdir())
    made = {p.relative_to(cache) for p in _files_under(cache)}
    assert all(str(p).startswith("debs") or p.name == "proofs.key" for p in made), made
    assert all(target in p.parents or p == target for p in _files_under(cache / "debs") if p != target.parent)
    assert not list(outside.iterdir()) and not (tmp_path / "escape").exists()
    assert all(not p.is_symlink() for p in _files_under(target))


def test_a_member_larger_than_the_bound_is_refused_before_it_is_written(tmp_path, monkeypatch):
    """A header that says 3 GiB (a sparse member, a bomb): refused from the header; no partial file stays."""
    info = tarfile.TarInfo(f"./boot/vmlinuz-{RELEASE}")
    info.size = 3 << 30
    data = _tar([(info, None)])
    path = tmp_path / "bomb.deb"
    path.write_bytes(_ar([("debian-binary", b"2.0\n"), ("control.tar.gz", _control(f"linux-image-{RELEASE}-x")),
                          ("data.tar", data)]))
    with pytest.raises(FetchError, match="bound"):
        unpacked(path, tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.name != "proofs.key"]


def test_too_many_members_are_refused_while_reading(tmp_path, monkeypatch):
    monkeypatch.setattr(debian, "MAX_MEMBERS", 50)
    entries = [regular(f"./usr/share/doc/x{i}") for i in range(60)] + [regular(f"./boot/vmlinuz-{RELEASE}")]
    with pytest.raises(FetchError, match="more than 50 members"):
        unpacked(deb(tmp_path / "many.deb", entries), tmp_path / "cache")


def test_a_member_named_twice_is_refused(tmp_path):
    name = f"./lib/modules/{RELEASE}/kernel/a.ko"
    with pytest.raises(FetchError, match="twice"):
        unpacked(deb(tmp_path / "twice.deb", [regular(name, b"one"), regular(name, b"two")]), tmp_path / "cache")


@pytest.mark.parametrize("name", [".deb", "..deb", "...deb"])
def test_a_package_file_named_dot_deb_extracts_into_its_own_directory(tmp_path, name):
    cache = tmp_path / "cache"
    other = cache / "debs" / "someone-else"
    other.mkdir(parents=True)
    (other / "keep").write_text("kept")
    target = unpacked(deb(tmp_path / name, [regular(f"./boot/vmlinuz-{RELEASE}")]), cache)
    assert target.parent == cache / "debs" and target.name not in ("", ".", "..")
    assert (other / "keep").read_text() == "kept"


def test_two_packages_with_one_name_size_and_time_do_not_share_an_extraction(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = deb(tmp_path / "a" / "p.deb", [regular(f"./boot/vmlinuz-{RELEASE}", b"AAAA")])
    b = deb(tmp_path / "b" / "p.deb", [regular(f"./boot/vmlinuz-{RELEASE}", b"BBBB")])
    os.utime(b, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns))
    assert a.stat().st_size == b.stat().st_size
    ta, tb = unpacked(a, tmp_path / "cache"), unpacked(b, tmp_path / "cache")
    assert ta != tb
    assert (ta / f"boot/vmlinuz-{RELEASE}").read_bytes() == b"AAAA"
    assert (tb / f"boot/vmlinuz-{RELEASE}").read_bytes() == b"BBBB"
