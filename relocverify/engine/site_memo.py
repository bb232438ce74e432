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
    if cache is None:
        return find_sites(image)
    if isinstance(cache, str):
        opened = ProofCache(cache)
        try:
            return cached_sites(image, opened)
        finally:
            opened.close()
    key = sites_key(image, source_digest())
    value = cache.site_index(key)
    if value is not None:
        try:
            return SiteIndex.from_data(marshal.loads(zlib.decompress(value)))
        except (ValueError, TypeError, EOFError, zlib.error):
            pass  # damaged: found again, and replaced
    sites = find_sites(image)
    cache.add_site_index(key, zlib.compress(marshal.dumps(sites.as_data()), _LEVEL))
    return sites
