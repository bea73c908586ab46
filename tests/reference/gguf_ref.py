"""A minimal GGUF v2/v3 reader for the numpy reference, written from the GGUF spec
(ggml's docs/gguf.md): header, metadata key-value pairs, tensor infos, aligned data.
Reads F32, F16 and BF16 tensors (what the reference needs) and MXFP4 ones (dequantized,
as gpt-oss stores its experts); everything else is an error.

    meta, tensors = read_gguf(path)
    meta["general.architecture"] -> "qwen2"
    tensors["blk.0.attn_q.weight"] -> float64 array, shape reversed from GGUF's dims
                                      (ne0 = row length last: [rows, cols])
    tensor_types(path) -> {"blk.0.attn_q.weight": 0, ...}   GGML type ids

MXFP4 (OCP Microscaling FP4): blocks of 32 values in 17 bytes, an E8M0 exponent byte e
(scale 2^(e - 127)) then 16 bytes of 4-bit E2M1 codes, value j in the low nibble of byte
j and value j + 16 in the high nibble. E2M1: sign bit, 2 exponent bits, 1 mantissa bit,
the numbers 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; code 8 (-0) reads as +0,
and a value beyond the f32 range as infinity, as ggml reads them.
"""

import struct

import numpy as np

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
GGML_F32, GGML_F16, GGML_BF16, GGML_MXFP4 = 0, 1, 30, 39
FLOAT_TYPES = frozenset((GGML_F32, GGML_F16, GGML_BF16))


def _e2m1(code):
    """The E2M1 number of a 4-bit code, from its bits."""
    exp, man = (code >> 1) & 3, code & 1
    mag = 0.5 * man if exp == 0 else (1.0 + 0.5 * man) * 2.0 ** (exp - 1)
    return -mag if code & 8 and mag else mag


_E2M1 = np.array([_e2m1(c) for c in range(16)], dtype=np.float64)


def dequantize_mxfp4(buf, count, offset=0):
    """count values (a multiple of 32) from the MXFP4 blocks at buf[offset:], as float64
    holding the f32 values."""
    if count % 32:
        raise ValueError("MXFP4: %d values are not whole blocks of 32" % count)
    blocks = np.frombuffer(buf, dtype=np.uint8, count=count // 32 * 17, offset=offset).reshape(-1, 17)
    scale = np.ldexp(1.0, blocks[:, 0].astype(np.int64) - 127)
    qs = blocks[:, 1:]
    codes = np.concatenate([qs & 15, qs >> 4], axis=1)
    with np.errstate(over="ignore"):
        return (_E2M1[codes] * scale[:, None]).astype(np.float32).astype(np.float64).reshape(-1)


class _Reader:
    def __init__(self, buf):
        self.buf = buf
        self.off = 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.off)[0]
        self.off += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = bytes(self.buf[self.off:self.off + n]).decode("utf-8")
        self.off += n
        return s

    def value(self, vtype):
        if vtype in _SCALAR:
            return self.take(_SCALAR[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.take("<I")
            n = self.take("<Q")
            return [self.value(etype) for _ in range(n)]
        raise ValueError("GGUF: unknown value type %d" % vtype)


def _read_header(path):
    """The file's bytes, metadata, tensor infos (name, dims, type, offset) and the
    offset of the data section."""
    with open(path, "rb") as f:
        buf = f.read()
    r = _Reader(buf)
    if buf[:4] != b"GGUF":
        raise ValueError("%s: not a GGUF file" % path)
    r.off = 4
    version = r.take("<I")
    if version not in (2, 3):
        raise ValueError("%s: GGUF version %d" % (path, version))
    n_tensors = r.take("<Q")
    n_kv = r.take("<Q")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.take("<I")
        dims = [r.take("<Q") for _ in range(n_dims)]
        ttype = r.take("<I")
        offset = r.take("<Q")
        infos.append((name, dims, ttype, offset))
    align = int(meta.get("general.alignment", 32))
    base = (r.off + align - 1) // align * align
    return buf, meta, infos, base


def tensor_types(path):
    """The GGML type id of every tensor, by name."""
    return {name: ttype for name, _, ttype, _ in _read_header(path)[2]}


def read_gguf(path):
    buf, meta, infos, base = _read_header(path)
    tensors = {}
    for name, dims, ttype, offset in infos:
        count = int(np.prod(dims))
        start = base + offset
        if ttype == GGML_F32:
            a = np.frombuffer(buf, dtype="<f4", count=count, offset=start)
        elif ttype == GGML_F16:
            a = np.frombuffer(buf, dtype="<f2", count=count, offset=start)
        elif ttype == GGML_BF16:
            u = np.frombuffer(buf, dtype="<u2", count=count, offset=start).astype(np.uint32) << 16
            a = u.view(np.float32)
        elif ttype == GGML_MXFP4:
            a = dequantize_mxfp4(buf, count, start)
        else:
            raise ValueError("%s: tensor %s has GGML type %d; the reference reads F32, F16, BF16 and MXFP4"
                             % (path, name, ttype))
        tensors[name] = a.astype(np.float64).reshape(list(reversed(dims)))
    return meta, tensors
