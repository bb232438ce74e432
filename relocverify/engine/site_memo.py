"""An image's kernel sites, kept in the proof cache: found once per image, read back after.

Finding a kernel's sites (``kernel.sites.find_sites``: every table parsed,
an instruction decoded at each of its 130 thousand sites) takes about half a
second, an eighth of a new store's run on a warm cache.  The sites are a
function of the image's bytes, its symbols and relocverify's own source, so
the cache keeps them under the digest of those (``sites_key``) and a later
run reads them back in about half the time.

What the key holds: relocverify's source digest (the tables, layouts and
parsers are code), the image's identity (the SHA-256 of its ELF bytes), and
where its symbols come from.  Symbols read from the ELF are a function of
its bytes; any others (a System.map) enter the key as the digest of every
symbol.  A value that does not load is ignored and the sites are found again.
"""

from __future__ import annotations

import hashlib
import marshal
import zlib

from ..image.image import Image
from ..kernel.sites import SiteIndex, find_sites
from ..store.cache import ProofCache
from ..versions import source_digest
from .row_memo import canonical

_LEVEL = 1  # zlib: a kernel's 5.8 MB of sites in 0.6 MB


def sites_key(image: Image, source: bytes) -> bytes:
    """The digest of everything an image's sites depend on (the module doc)."""
    h = hashlib.blake2b(b"sites|" + source + image.identity.encode() + b"|" + image.symbol_source.encode(),
                        digest_size=16)
    if image.symbol_source != "elf":
        h.update(canonical([(s.name, s.address, s.size, s.kind) for s in image.symbols]))
    return h.digest()


def cached_sites(image: Image, cache: ProofCache | str | None) -> SiteIndex:
    """``find_sites(image)``, read from the proof cache (open, or its directory) when it keeps them, and
    kept there when it does not (None: found every time)."""
    if isinstance(cache, str):
        opened = ProofCache(cache)
        try:
            return cached_sites(image, opened)
        finally:
            opened.close()
    sites = kept_sites(image, cache)
    return sites if sites is not None else found_sites(image, cache)


def kept_sites(image: Image, cache: ProofCache | None) -> SiteIndex | None:
    """The image's sites as the proof cache keeps them, or None (not kept, damaged, or no cache)."""
    if cache is None:
        return None
    value = cache.site_index(sites_key(image, source_digest()))
    return None if value is None else _loaded(value)


def site_data(image: Image) -> bytes:
    """``find_sites(image)`` as the proof cache keeps it: what a run's SMT helper finds on the second core
    while the run sets up (``schedule.smt_helper``, ``first``), for ``found_sites``."""
    return zlib.compress(marshal.dumps(find_sites(image).as_data()), _LEVEL)


def found_sites(image: Image, cache: ProofCache | None, data: bytes | None = None) -> SiteIndex:
    """The image's sites from ``data`` (``site_data``, found by another process), or found here when there is
    none or it does not load; kept in the cache (None: not kept)."""
    sites = None if data is None else _loaded(data)
    if sites is None:
        sites = find_sites(image)
        data = None if cache is None else zlib.compress(marshal.dumps(sites.as_data()), _LEVEL)
    if cache is not None:
        cache.add_site_index(sites_key(image, source_digest()), data)
    return sites


def _loaded(value: bytes) -> SiteIndex | None:
    try:
        return SiteIndex.from_data(marshal.loads(zlib.decompress(value)))
    except (ValueError, TypeError, EOFError, zlib.error):
        return None  # damaged: found again, and replaced
