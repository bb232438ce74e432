"""The compressed kernel inside a bzImage (``vmlinuz``).

The x86 boot protocol setup header (``HdrS`` at 0x202, protocol >= 2.08)
locates the compressed payload, which is decompressed by its magic (xz,
lz4 legacy frames, zstd, gzip, bzip2, lzma; lzo is recognised and refused
with a way out) and must be an ELF."""

from __future__ import annotations

import bz2
import io
import lzma
import struct
import zlib
from typing import NamedTuple

from ..errors import ImageError
from .image import one_line

#: Ceiling on a decompressed bzImage payload; Debian's vmlinux.bin is ~60 MB.
MAX_PAYLOAD = 1 << 30

# --- bzImage ---------------------------------------------------------------

class _Codec(NamedTuple):
    name: str
    magic: bytes


#: Payload compressors of arch/x86/boot/compressed, told apart by magic.
CODECS = (
    _Codec("xz", b"\xfd7zXZ\x00"),
    _Codec("lz4", b"\x02\x21\x4c\x18"),   # lz4 legacy frame format (lz4 -l)
    _Codec("zstd", b"\x28\xb5\x2f\xfd"),
    _Codec("gzip", b"\x1f\x8b"),
    _Codec("bzip2", b"BZh"),
    _Codec("lzo", b"\x89LZO\x00"),
    _Codec("lzma", b"\x5d\x00\x00"),
)


def is_bzimage(head: bytes) -> bool:
    return len(head) >= 0x250 and head[0x202:0x206] == b"HdrS"


def payload(path: str, read, head: bytes) -> bytes:
    """The compressed payload bytes, located by the setup header."""
    version = struct.unpack_from("<H", head, 0x206)[0]
    if version < 0x208:
        raise ImageError(f"{path}: boot protocol {version >> 8}.{version & 0xff:02d} has no "
                         "payload fields (needs 2.08+); extract vmlinux with scripts/extract-vmlinux")
    setup_sects = head[0x1F1] or 4
    payload_offset, payload_length = struct.unpack_from("<II", head, 0x248)
    start = (setup_sects + 1) * 512 + payload_offset
    rest = head + read()
    if payload_length == 0 or start + payload_length > len(rest):
        raise ImageError(f"{path}: truncated bzImage: payload {start:#x}+{payload_length:#x} "
                         f"runs past the end of the file ({len(rest):#x} bytes)")
    return rest[start:start + payload_length]


def compression_of(path: str, payload: bytes) -> str:
    for codec in CODECS:
        if payload.startswith(codec.magic):
            return codec.name
    raise ImageError(f"{path}: unknown bzImage payload compression (magic {payload[:6].hex()})")


def decompress(path: str, payload: bytes, compression: str) -> bytes:
    try:
        data = _DECOMPRESSORS[compression](payload)
    except ImageError as exc:
        raise ImageError(f"{path}: {exc}") from None
    except _codec_errors() as exc:
        raise ImageError(f"{path}: corrupt {compression} payload: {one_line(exc)}") from None
    if not data:
        raise ImageError(f"{path}: corrupt {compression} payload: it decompresses to nothing")
    if len(data) > MAX_PAYLOAD:
        raise ImageError(f"{path}: {compression} payload inflates past {MAX_PAYLOAD >> 20} MiB; "
                         "not a kernel")
    if not data.startswith(b"\x7fELF"):
        raise ImageError(f"{path}: the decompressed {compression} payload is not an ELF "
                         f"(starts with {data[:8].hex()})")
    return data


def _codec_errors() -> tuple[type[BaseException], ...]:
    import lz4.block
    import zstandard

    return (lzma.LZMAError, zlib.error, OSError, ValueError, EOFError,
            lz4.block.LZ4BlockError, zstandard.ZstdError)


def _inflate_xz(payload: bytes) -> bytes:
    decompressor = lzma.LZMADecompressor(lzma.FORMAT_AUTO)
    return decompressor.decompress(payload, MAX_PAYLOAD + 1)


def _inflate_lzma(payload: bytes) -> bytes:
    decompressor = lzma.LZMADecompressor(lzma.FORMAT_ALONE)
    return decompressor.decompress(payload, MAX_PAYLOAD + 1)


def _inflate_gzip(payload: bytes) -> bytes:
    decompressor = zlib.decompressobj(wbits=31)
    return decompressor.decompress(payload, MAX_PAYLOAD + 1)


def _inflate_bzip2(payload: bytes) -> bytes:
    return bz2.BZ2Decompressor().decompress(payload, MAX_PAYLOAD + 1)


def _inflate_zstd(payload: bytes) -> bytes:
    import zstandard

    reader = zstandard.ZstdDecompressor(max_window_size=1 << 31).stream_reader(
        io.BytesIO(payload), read_across_frames=False)
    return reader.read(MAX_PAYLOAD + 1)


#: lz4 legacy frames: magic, then [u32 LE compressed size][block] until the
#: end; each block inflates to at most 8 MiB.  The kernel's size_append adds
#: a 4-byte uncompressed size after the last block.
LZ4_LEGACY_MAGIC = 0x184C2102
LZ4_LEGACY_BLOCK = 8 << 20


def _inflate_lz4(payload: bytes) -> bytes:
    import lz4.block

    out = []
    total = 0
    position, end = 4, len(payload)
    while end - position >= 4:
        (length,) = struct.unpack_from("<I", payload, position)
        if length == LZ4_LEGACY_MAGIC:  # a concatenated stream restarts
            position += 4
            continue
        if end - position == 4:  # the size_append trailer
            break
        if position + 4 + length > end:
            raise ImageError(f"truncated lz4 block of {length} bytes at payload offset {position:#x}; "
                             "the bzImage is cut short")
        block = payload[position + 4:position + 4 + length]
        out.append(lz4.block.decompress(block, uncompressed_size=LZ4_LEGACY_BLOCK))
        total += len(out[-1])
        if total > MAX_PAYLOAD:
            break
        position += 4 + length
    return b"".join(out)


def _refuse_lzo(payload: bytes) -> bytes:
    raise ImageError("lzo-compressed bzImage is not supported (no LZO library); decompress it "
                     "externally: scripts/extract-vmlinux vmlinuz > vmlinux, then pass vmlinux")


_DECOMPRESSORS = {
    "xz": _inflate_xz,
    "lz4": _inflate_lz4,
    "zstd": _inflate_zstd,
    "gzip": _inflate_gzip,
    "bzip2": _inflate_bzip2,
    "lzma": _inflate_lzma,
    "lzo": _refuse_lzo,
}

