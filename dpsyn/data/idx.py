"""Reader for IDX files, the format of MNIST and Fashion-MNIST, plain or gzip-compressed.

An IDX file is a 4-byte magic number (two zero bytes, a type code, the number of dimensions), then one big-endian
uint32 per dimension, then the values in C order (big-endian for multi-byte types). Every way a file can be wrong
(bad magic, unexpected number of dimensions, too few or too many bytes, broken gzip stream) raises
:class:`DataFormatError` naming the file and the problem, so a half-downloaded file never turns into silently
wrong data.
"""

from __future__ import annotations

import logging
import math
import struct
import zlib
from pathlib import Path

import numpy as np

__all__ = ["DataFormatError", "read_idx"]

log = logging.getLogger(__name__)

# IDX type code -> numpy dtype (big-endian on disk).
_IDX_DTYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}
_GZIP_MAGIC = b"\x1f\x8b"


class DataFormatError(ValueError):
    """A data file exists but its content is not what its format promises (corrupt, truncated, wrong shape)."""


def _gunzip(raw: bytes, path: Path) -> bytes:
    """Decompress a (possibly multi-member) gzip stream, checking CRCs and completeness.

    Raises:
        DataFormatError: if the stream is corrupt or ends early.
    """
    chunks: list[bytes] = []
    data = raw
    while True:
        dec = zlib.decompressobj(wbits=31)  # 31 = gzip header and trailer (CRC32, size) checked by zlib
        try:
            chunks.append(dec.decompress(data))
        except zlib.error as err:
            raise DataFormatError(f"{path}: broken gzip stream ({err})") from err
        if not dec.eof:
            raise DataFormatError(
                f"{path}: gzip stream ends early after {len(raw)} compressed bytes (truncated download?)"
            )
        data = dec.unused_data
        if not data:
            break
        if not data.startswith(_GZIP_MAGIC):
            raise DataFormatError(f"{path}: {len(data)} bytes of garbage after the gzip stream")
    return b"".join(chunks)


def read_idx(path: str | Path, *, ndim: int | None = None) -> np.ndarray:
    """Read an IDX file (``.gz`` or plain; gzip is recognised by suffix or by its magic bytes).

    Args:
        path: The file.
        ndim: If given, the number of dimensions the file must have (3 for images, 1 for labels).

    Returns:
        A read-only array with the file's shape, in native byte order (uint8 for MNIST-style files). It is read-only
        because it may be shared by a cache; call ``.copy()`` to modify it.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        DataFormatError: if the file is not a well-formed IDX file; the message names the file and the problem.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"IDX file not found: {path}")
    raw = path.read_bytes()
    if path.suffix == ".gz" or raw.startswith(_GZIP_MAGIC):
        raw = _gunzip(raw, path)

    if len(raw) < 4:
        raise DataFormatError(f"{path}: only {len(raw)} bytes, too short for the 4-byte IDX magic number")
    if raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DataFormatError(
            f"{path}: bad IDX magic number 0x{raw[:4].hex()} (expected 0x0000, a type code in "
            f"{{{', '.join(f'{c:02x}' for c in _IDX_DTYPES)}}}, then the number of dimensions)"
        )
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    nd = raw[3]
    if nd == 0:
        raise DataFormatError(f"{path}: IDX header declares 0 dimensions")
    if ndim is not None and nd != ndim:
        raise DataFormatError(f"{path}: IDX header declares {nd} dimensions, expected {ndim}")
    header = 4 + 4 * nd
    if len(raw) < header:
        raise DataFormatError(
            f"{path}: truncated IDX header ({len(raw)} bytes, {header} needed for {nd} dimension sizes)"
        )
    dims = struct.unpack(f">{nd}I", raw[4:header])
    count = math.prod(dims)
    expected = count * dtype.itemsize
    found = len(raw) - header
    if found < expected:
        raise DataFormatError(
            f"{path}: too few bytes: shape {dims} of {dtype.name} needs {expected} data bytes, found {found} "
            "(truncated file?)"
        )
    if found > expected:
        raise DataFormatError(
            f"{path}: {found - expected} unexpected bytes after the {expected} data bytes of shape {dims} "
            "(wrong dimension sizes in the header?)"
        )
    arr = np.frombuffer(raw, dtype=dtype, count=count, offset=header).reshape(dims)
    if dtype.itemsize > 1:
        arr = arr.astype(dtype.newbyteorder("="))
    arr.flags.writeable = False
    log.debug("read %s: shape %s, dtype %s", path, arr.shape, arr.dtype)
    return arr
