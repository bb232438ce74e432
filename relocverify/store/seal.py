"""Seals on what the proof cache keeps: a keyed BLAKE2b MAC over every kept value (a segment of findings,
a proof, a function's kept rows, an outcome, an image's sites, the jump answers).

The cache is trusted to hand back what relocverify wrote: a value whose seal does not match is treated as
absent (proved again, and written again sealed), never used.  The key is 32 random bytes in
``proofs.key`` beside ``proofs.sqlite``, created by the first run (mode 0600).  What a seal stops: a cache
edited by hand or by another program, a value copied from another user's cache or from another key, a
cache from before seals (all of it is proved again, once).  What it cannot stop: someone who can read the
key file, which is to say the same user; ``export``, ``report`` and the runtime re-derive the policy's
answer for what they emit besides (``report.probe_points``)."""

from __future__ import annotations

import hashlib
import hmac
import os

KEY_FILE = "proofs.key"
MAC_SIZE = 16


class Seal:
    """Seals made and checked with one cache directory's key."""

    def __init__(self, directory: str):
        self._keyed(_key(os.path.join(directory, KEY_FILE)))

    @classmethod
    def of_key(cls, key: bytes) -> "Seal":
        """Seals made and checked with ``key`` itself (a result store keeps its own: ``store.row_seals``)."""
        seal = cls.__new__(cls)
        seal._keyed(key)
        return seal

    def _keyed(self, key: bytes) -> None:
        self.key = key
        self._keyed_hash = hashlib.blake2b(key=key, digest_size=MAC_SIZE)  # copied by each MAC: the key hashed once

    def __reduce__(self):
        return Seal.of_key, (self.key,)

    def mac(self, *parts: bytes) -> bytes:
        h = self._keyed_hash.copy()
        update = h.update
        for part in parts:
            update(len(part).to_bytes(8, "little"))
            update(part)
        return h.digest()

    def seal(self, data: bytes, *context: bytes) -> bytes:
        """``data`` with its seal in front; ``context`` (a tag, a key) is bound into the seal, not stored."""
        return self.mac(*context, data) + data

    def open(self, blob: bytes | None, *context: bytes) -> bytes | None:
        """The data of a sealed ``blob`` whose seal matches (with the same ``context``), else None."""
        if not isinstance(blob, (bytes, bytearray)) or len(blob) < MAC_SIZE:
            return None
        data = bytes(blob[MAC_SIZE:])
        return data if hmac.compare_digest(blob[:MAC_SIZE], self.mac(*context, data)) else None


def _key(path: str) -> bytes:
    """The key in ``path``, made (32 random bytes, readable by the user alone) if there is none."""
    damaged = False
    try:
        with open(path, "rb") as fh:
            key = fh.read()
        if len(key) == 32:
            return key
        damaged = True  # a key of another length: replaced, and every seal made with it is void
    except FileNotFoundError:
        pass
    partial = f"{path}.{os.getpid()}.part"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, os.urandom(32))
    finally:
        os.close(fd)
    try:
        if damaged:
            os.replace(partial, path)
        else:
            os.link(partial, path)  # the first writer's key wins; a racing writer reads it back
    except FileExistsError:
        pass
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    with open(path, "rb") as fh:
        return fh.read()
