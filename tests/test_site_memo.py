"""An image's sites kept in the proof cache (``engine.site_memo``): read back as found, keyed by what they
depend on, found again when the kept value is damaged."""

from __future__ import annotations

import sqlite3

import pytest

from relocverify.engine.site_memo import cached_sites, sites_key
from relocverify.image.fetch import fetch
from relocverify.image.image import Symbol
from relocverify.image.loader import load_image
from relocverify.kernel.sites import SiteIndex, find_sites
from relocverify.store.cache import FILE_NAME


@pytest.fixture(scope="module")
def cloud():
    kernel = fetch("debian-6.1-cloud")
    return kernel, load_image(kernel.vmlinux)


def _same(a: SiteIndex, b: SiteIndex) -> bool:
    return a.as_data() == b.as_data() and a.count_by_kind() == b.count_by_kind() and a.kinds() == b.kinds()


@pytest.mark.slow
def test_kept_sites_are_the_sites_found(cloud, tmp_path):
    _, image = cloud
    found = find_sites(image)
    first = cached_sites(image, str(tmp_path))  # found, and kept
    second = cached_sites(image, str(tmp_path))  # read back
    assert _same(first, found) and _same(second, found)
    assert sum(found.count_by_kind().values()) > 100_000
    some = list(found.iter_sites("fentry"))[:200:7] + list(found.iter_sites("alternative"))[:50]
    for address in (s.address for s in some):
        assert second.sites_at(address, 5) == found.sites_at(address, 5)
    assert _same(cached_sites(image, None), found)  # no cache: found every time


@pytest.mark.slow
def test_a_damaged_value_is_found_again_and_replaced(cloud, tmp_path):
    _, image = cloud
    cached_sites(image, str(tmp_path))
    con = sqlite3.connect(tmp_path / FILE_NAME)
    con.execute("UPDATE site_indexes SET data = x'789c0300'")  # a valid zlib stream of nothing
    con.commit()
    assert _same(cached_sites(image, str(tmp_path)), find_sites(image))
    (data,), = con.execute("SELECT data FROM site_indexes").fetchall()
    con.close()
    assert len(data) > 1000  # replaced by the sites found


def test_the_key_follows_the_source_the_identity_and_other_symbols():
    symbols = (Symbol("f", 0xFFFFFFFF81000000, 16, "func"), Symbol("g", 0xFFFFFFFF81000010, None, "func"))

    class Fake:  # what sites_key reads of an image
        def __init__(self, identity="a" * 64, source="elf", syms=symbols):
            self.identity, self.symbol_source, self.symbols = identity, source, syms

    base = sites_key(Fake(), b"src")
    assert sites_key(Fake(), b"src") == base
    assert sites_key(Fake(), b"other source") != base
    assert sites_key(Fake(identity="b" * 64), b"src") != base
    assert sites_key(Fake(source="system.map"), b"src") != base
    moved = (symbols[0], symbols[1]._replace(address=symbols[1].address + 1))
    # symbols from the ELF are its bytes' (the identity); any others enter the key themselves
    assert sites_key(Fake(syms=moved), b"src") == base
    assert sites_key(Fake(source="system.map", syms=moved), b"src") != sites_key(Fake(source="system.map"), b"src")


@pytest.mark.slow
def test_sites_found_in_another_process_are_the_sites_found_here(cloud, tmp_path):
    """A cold run's SMT helper finds the sites (``site_data``) while the run sets up: what the run makes of its
    value is what ``find_sites`` gives, and it is kept; a value that does not load is found again here."""
    from relocverify.engine import run as run_module
    from relocverify.engine.site_memo import found_sites, kept_sites, site_data
    from relocverify.schedule.smt_helper import SmtHelper
    from relocverify.store.cache import ProofCache

    _, image = cloud
    found = find_sites(image)
    helper = SmtHelper(run_module.WATCHDOG_MARGIN_S, lambda: site_data(image))
    try:
        data = helper.first_value()
    finally:
        helper.close()
    cache = ProofCache(str(tmp_path))
    try:
        assert kept_sites(image, cache) is None
        assert _same(found_sites(image, cache, data), found)
        assert _same(kept_sites(image, cache), found)
        assert _same(found_sites(image, None, b"not zlib"), found)
    finally:
        cache.close()
