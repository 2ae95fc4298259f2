"""A GGUF file's metadata and tensor table, read in one pass over a memory map.

The layout (GGUF versions 2 and 3, little-endian; llama.cpp's ``docs/gguf.md``): the magic
``GGUF``, a uint32 version, uint64 tensor and key-value counts; the key-value pairs (a string key,
a uint32 value type, the value; arrays as an element type, a uint64 count and the elements); the
tensor infos (name, uint32 dimension count, uint64 dimensions innermost first, uint32 storage type,
uint64 offset); then the tensor data, from the next multiple of ``general.alignment`` (32 when
absent), each tensor at its offset from there.

``gguf.GGUFReader`` (llama.cpp's Python package) reads the same file, but builds numpy views for
every part of every metadata value: 3.5-4 s for SmolLM2's 49k-token vocabulary and 49k merges on
a 2-core CPU, before any weight is touched, in every process that loads the model. Here strings
and numbers are decoded straight from the bytes (the arrays of numbers by one ``np.frombuffer``)
and tensor data stays a view of the map, cut to the shapes ``gguf.quants.dequantize`` takes.
"""
from __future__ import annotations

import dataclasses
import mmap
import pathlib
import struct
from typing import Any, Dict, List, Tuple

import numpy as np

MAGIC = b"GGUF"
STRING, ARRAY = 8, 9
# value type -> struct format (little-endian) of a scalar
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
NUMPY_SCALARS = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
                 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
DEFAULT_ALIGNMENT = 32


@dataclasses.dataclass
class TensorInfo:
    name: str
    shape: Tuple[int, ...]  # GGUF order: innermost (the row length, ne0) first
    tensor_type: Any  # gguf.GGMLQuantizationType
    data: np.ndarray  # as gguf.quants.dequantize takes it: float32/float16 values, else uint8 rows of blocks


class GGUFFile:
    """``fields`` (key -> str, int, float, bool or a list of them) and ``tensors`` (in file order)."""

    def __init__(self, path):
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        self.path = pathlib.Path(path)
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        buf, self._at = self._map, 0
        if buf[:4] != MAGIC:
            raise ValueError(f"{self.path.name} is not a GGUF file (magic {bytes(buf[:4])!r})")
        self._at = 4
        version = self._scalar("<I")
        if version not in (2, 3):
            raise ValueError(f"{self.path.name}: GGUF version {version} is not supported (2 and 3 are; a "
                             f"big-endian file reads as a huge version)")
        n_tensors, n_fields = self._scalar("<Q"), self._scalar("<Q")
        self.fields: Dict[str, Any] = {}
        for _ in range(n_fields):
            key = self._string()
            self.fields[key] = self._value(self._scalar("<I"))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            dims = tuple(self._scalar("<Q") for _ in range(self._scalar("<I")))
            infos.append((name, dims, self._scalar("<I"), self._scalar("<Q")))
        alignment = int(self.fields.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-self._at // alignment) * alignment
        self.tensors: List[TensorInfo] = []
        for name, dims, kind, offset in infos:
            qtype = GGMLQuantizationType(kind)
            block, block_bytes = GGML_QUANT_SIZES[qtype]
            count = int(np.prod(dims, dtype=np.int64))
            nbytes = count // block * block_bytes
            raw = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=start + offset)
            rows = tuple(reversed(dims[1:]))
            if qtype == GGMLQuantizationType.F32:
                data = raw.view(np.float32).reshape(rows + (dims[0],))
            elif qtype == GGMLQuantizationType.F16:
                data = raw.view(np.float16).reshape(rows + (dims[0],))
            else:
                data = raw.reshape(rows + (dims[0] // block * block_bytes,))
            self.tensors.append(TensorInfo(name, dims, qtype, data))

    def _scalar(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self._map, self._at)
        self._at += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._scalar("<Q")
        text = self._map[self._at: self._at + n].decode("utf-8")
        self._at += n
        return text

    def _value(self, kind: int):
        if kind == STRING:
            return self._string()
        if kind == ARRAY:
            item, count = self._scalar("<I"), self._scalar("<Q")
            if item == STRING:
                return [self._string() for _ in range(count)]
            if item == ARRAY:
                return [self._value(self._scalar("<I")) for _ in range(count)]
            dtype = np.dtype(NUMPY_SCALARS[item]).newbyteorder("<")
            values = np.frombuffer(self._map, dtype=dtype, count=count, offset=self._at)
            self._at += count * dtype.itemsize
            return values.tolist()
        if kind not in SCALARS:
            raise ValueError(f"{self.path.name}: unknown GGUF value type {kind} at byte {self._at}")
        return self._scalar(SCALARS[kind])
