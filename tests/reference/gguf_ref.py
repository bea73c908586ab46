"""A minimal GGUF v2/v3 reader for the numpy reference, written from the GGUF spec
(ggml's docs/gguf.md): header, metadata key-value pairs, tensor infos, aligned data.
Reads F32, F16 and BF16 tensors (what the reference needs); everything else is an error.

    meta, tensors = read_gguf(path)
    meta["general.architecture"] -> "qwen2"
    tensors["blk.0.attn_q.weight"] -> float64 array, shape reversed from GGUF's dims
                                      (ne0 = row length last: [rows, cols])
"""

import struct

import numpy as np

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
GGML_F32, GGML_F16, GGML_BF16 = 0, 1, 30


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


def read_gguf(path):
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
        else:
            raise ValueError("%s: tensor %s has GGML type %d; the reference reads F32, F16 and BF16"
                             % (path, name, ttype))
        tensors[name] = a.astype(np.float64).reshape(list(reversed(dims)))
    return meta, tensors
