"""The search index saved whole to one file, for a peer to load instead of inserting every donor again.

A late router replica's usearch index took ~2 minutes to build at 1M donors (an HNSW insert costs ~0.5 ms of a
core); loading a saved graph takes under a second. The file is a run of blobs followed by a msgpack description of
them, its length (u64, little-endian) and :data:`MAGIC`:

* per namespace: the donors' keys (u64, little-endian), their ids (a msgpack list of strings, in the keys' order)
  and the usearch index as ``Index.save`` writes it;
* the description: the index's settings (``dim``, ``dtype``, ``metric``, ``connectivity``) and, per namespace, its
  name, its key bits (``slot``), its donor count and each blob's ``[offset, length]``.

:func:`read` checks everything but the HNSW graph inside a usearch blob: bounds, counts, distinct ids and keys,
each key's namespace bits, and the blob's own header (dimensions, scalar kind, metric, donors present). A router
loads a graph only from a peer of its own deployment; a loaded index is then checked against the donors the sync
sends (:meth:`~semblend_dynamo.donor_index.DonorIndex.holds`).
"""

from __future__ import annotations

import mmap
import os
import shutil
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, BinaryIO

import msgpack
import numpy as np
import xxhash

MAGIC = b"SBIDX\x00v1"
_TAIL = struct.Struct("<Q8s")
MAX_DESCRIPTION_BYTES = 1 << 20
_READ_BYTES = 4 << 20


class SnapshotError(ValueError):
    """A file that is not a snapshot this index can take; ``reason`` is a short label for counters."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Section:
    """One namespace of a snapshot being read: its keys and ids, and a view of its usearch blob (valid while the
    file is open)."""

    namespace: str
    slot: int
    keys: np.ndarray
    ids: list[str]
    index: memoryview


class Writer:
    """Writes a snapshot: :meth:`section` per namespace, then :meth:`finish` with the index's settings."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._sections: list[dict[str, Any]] = []

    def _blob(self, data: bytes) -> list[int]:
        offset = self._out.tell()
        self._out.write(data)
        return [offset, len(data)]

    def section(self, namespace: str, slot: int, keys: np.ndarray, ids: Sequence[str], index_file: str) -> None:
        """A namespace's donors (``keys[i]`` is ``ids[i]``'s) and its usearch index, saved to ``index_file``."""
        entry: dict[str, Any] = {"namespace": namespace, "slot": slot, "count": len(ids)}
        entry["keys"] = self._blob(np.ascontiguousarray(keys, dtype="<u8").tobytes())
        entry["ids"] = self._blob(msgpack.packb(list(ids)))
        offset = self._out.tell()
        with open(index_file, "rb") as blob:
            shutil.copyfileobj(blob, self._out, _READ_BYTES)
        entry["index"] = [offset, self._out.tell() - offset]
        self._sections.append(entry)

    def finish(self, settings: dict[str, Any]) -> None:
        description = msgpack.packb({**settings, "sections": self._sections})
        self._out.write(description)
        self._out.write(_TAIL.pack(len(description), MAGIC))


@contextmanager
def read(path: str | os.PathLike[str], settings: dict[str, Any], slot_bits: int) -> Iterator[list[Section]]:
    """The sections of the snapshot at ``path``, checked; their blobs are views of the file mapped while the context
    is open. ``settings`` must equal the file's (the index that loads it). Raises :class:`SnapshotError`."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size < _TAIL.size:
            raise SnapshotError("bad_snapshot", "shorter than its tail")
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mapped)
    sections: list[Section] = []
    try:
        sections = _sections(view, settings, slot_bits)
        yield sections
    finally:
        for section in sections:  # the map closes only once no view of it is left
            section.index.release()
        view.release()
        with suppress(BufferError):  # a view still held (an error's traceback): the map closes when it goes
            mapped.close()


def _sections(view: memoryview, settings: dict[str, Any], slot_bits: int) -> list[Section]:
    length, magic = _TAIL.unpack(view[-_TAIL.size :])
    end = len(view) - _TAIL.size - length
    if magic != MAGIC or not 0 < length <= MAX_DESCRIPTION_BYTES or end < 0:
        raise SnapshotError("bad_snapshot", "not a search index snapshot")
    try:
        description = msgpack.unpackb(view[end : len(view) - _TAIL.size], strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise SnapshotError("bad_snapshot", f"description unreadable: {exc}") from None
    if not isinstance(description, dict):
        raise SnapshotError("bad_snapshot", "description is not a map")
    theirs = {name: description.get(name) for name in settings}
    if theirs != settings:
        raise SnapshotError("incompatible", f"saved with {theirs}, this index has {settings}")
    entries = description.get("sections")
    if not isinstance(entries, list):
        raise SnapshotError("bad_snapshot", "no sections")
    sections = [_section(view, end, entry, slot_bits) for entry in entries]
    if len({s.namespace for s in sections}) != len(sections) or len({s.slot for s in sections}) != len(sections):
        raise SnapshotError("bad_snapshot", "a namespace or its key bits appear twice")
    ids = [donor_id for s in sections for donor_id in s.ids]
    if len(set(ids)) != len(ids):
        raise SnapshotError("bad_snapshot", "a donor appears twice")
    return sections


def _section(view: memoryview, end: int, entry: Any, slot_bits: int) -> Section:
    if not isinstance(entry, dict):
        raise SnapshotError("bad_snapshot", "a section is not a map")
    namespace, slot, count = entry.get("namespace"), entry.get("slot"), entry.get("count")
    if not isinstance(namespace, str) or not namespace or not isinstance(slot, int) or not isinstance(count, int):
        raise SnapshotError("bad_snapshot", "a section lacks its namespace, key bits or count")
    if not 0 <= slot < 1 << slot_bits or count < 1:
        raise SnapshotError("bad_snapshot", f"section {namespace!r}: key bits {slot} or count {count} out of range")
    blobs = [_blob(view, end, entry.get(name), name) for name in ("keys", "ids", "index")]
    if len(blobs[0]) != 8 * count:
        raise SnapshotError("bad_snapshot", f"section {namespace!r}: {len(blobs[0])} key bytes for {count} donors")
    keys = np.frombuffer(blobs[0], dtype="<u8").astype(np.int64)
    if (keys < 0).any() or ((keys & ((1 << slot_bits) - 1)) != slot).any() or len(np.unique(keys)) != count:
        raise SnapshotError("bad_snapshot", f"section {namespace!r}: keys not distinct or not of its key bits")
    try:
        ids = msgpack.unpackb(blobs[1])
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise SnapshotError("bad_snapshot", f"section {namespace!r}: ids unreadable: {exc}") from None
    if not isinstance(ids, list) or len(ids) != count or not all(isinstance(i, str) and 0 < len(i) <= 256 for i in ids):
        raise SnapshotError("bad_snapshot", f"section {namespace!r}: ids are not {count} strings of 1-256 characters")
    return Section(namespace, slot, keys, ids, blobs[2])


def _blob(view: memoryview, end: int, extent: Any, name: str) -> memoryview:
    if (
        not isinstance(extent, list)
        or len(extent) != 2
        or not all(isinstance(x, int) and x >= 0 for x in extent)
        or extent[0] + extent[1] > end
    ):
        raise SnapshotError("bad_snapshot", f"{name} blob out of bounds")
    return view[extent[0] : extent[0] + extent[1]]


def file_digest(path: str | os.PathLike[str]) -> str:
    """Hex xxh3-128 of a file's bytes: a snapshot's name on the wire, checked once it has arrived."""
    digest = xxhash.xxh3_128()
    with open(path, "rb") as file:
        while chunk := file.read(_READ_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
