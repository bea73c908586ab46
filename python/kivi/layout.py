"""Byte layouts of the KIVI codes, in numpy, written from the specification in kv/codec.h.

A row of D codes of `bits` bits packs into W = D * bits / 8 bytes; byte j holds channels
j, j + W, j + 2W, ... from the low bits up (so [0, 1, 2, 3] at 2 bits is the byte 228).

Keys: the G rows of a key group are interleaved in 32-bit words. Word c of token i (row
bytes 4c .. 4c + 3) sits at byte offset 4 (c G + i) of the group, its bytes in the order
0, 2, 1, 3. Rows whose W is not a multiple of 4 interleave in units of u = 2 or 1 bytes
(offset (j // u) G u + i u + j % u, no reordering). quantize_keys returns this layout, which
is what the cache stores; key_group_rows turns it into plain rows.

Values: quantize_values returns plain rows [..., T, W]; the cache stores them interleaved by
quads of tokens, byte j of token t at [t // 4, j, t % 4] (value_quads).
"""

import numpy as np

KEY_WORD_ORDER = (0, 2, 1, 3)  # position of row byte 4c + r within word c (its own inverse)


def key_group_offsets(group_size: int, row_bytes: int) -> np.ndarray:
    """Offsets [G, W]: where byte j of token i of a key group is stored within the group."""
    G, W = group_size, row_bytes
    i = np.arange(G)[:, None]
    j = np.arange(W)[None, :]
    if W % 4 == 0:
        order = np.array(KEY_WORD_ORDER)
        return (j // 4 * G + i) * 4 + order[j % 4]
    u = 2 if W % 2 == 0 else 1
    return (j // u * G + i) * u + j % u


def key_group_rows(codes: np.ndarray, group_size: int) -> np.ndarray:
    """Key codes as stored, [..., T/G, G*W], to plain packed rows [..., T, W]."""
    codes = np.asarray(codes)
    G = group_size
    if codes.shape[-1] % G:
        raise ValueError("key_group_rows: the last dimension %d is not a multiple of the group size %d"
                         % (codes.shape[-1], G))
    W = codes.shape[-1] // G
    rows = codes[..., key_group_offsets(G, W)]  # [..., NG, G, W]
    return rows.reshape(codes.shape[:-2] + (codes.shape[-2] * G, W))


def key_group_interleave(rows: np.ndarray, group_size: int) -> np.ndarray:
    """Plain packed key rows [..., T, W] (T a multiple of G) to the stored layout [..., T/G, G*W]."""
    rows = np.asarray(rows)
    G = group_size
    T, W = rows.shape[-2], rows.shape[-1]
    if T % G:
        raise ValueError("key_group_interleave: %d tokens is not a multiple of the group size %d" % (T, G))
    grouped = rows.reshape(rows.shape[:-2] + (T // G, G, W))
    out = np.zeros(rows.shape[:-2] + (T // G, G * W), dtype=rows.dtype)
    out[..., key_group_offsets(G, W)] = grouped
    return out


def value_quads(rows: np.ndarray) -> np.ndarray:
    """Plain packed value rows [..., T, W] to the cache's quad layout [..., ceil(T/4), W, 4]
    (byte j of token t at [t // 4, j, t % 4]; slots past T are zero)."""
    rows = np.asarray(rows)
    T, W = rows.shape[-2], rows.shape[-1]
    nq = (T + 3) // 4
    padded = np.zeros(rows.shape[:-2] + (nq * 4, W), dtype=rows.dtype)
    padded[..., :T, :] = rows
    return np.swapaxes(padded.reshape(rows.shape[:-2] + (nq, 4, W)), -1, -2).copy()


def value_quad_rows(quads: np.ndarray, n_tokens: int) -> np.ndarray:
    """The cache's quad layout [..., Q, W, 4] back to plain rows [..., n_tokens, W]."""
    quads = np.asarray(quads)
    rows = np.swapaxes(quads, -1, -2).reshape(quads.shape[:-3] + (quads.shape[-3] * 4, quads.shape[-2]))
    return rows[..., :n_tokens, :]


def unpack_codes(rows: np.ndarray, bits: int) -> np.ndarray:
    """Packed rows [..., W] to codes [..., D] (D = W * 8 / bits), uint8."""
    rows = np.asarray(rows, dtype=np.uint8)
    per = 8 // bits
    planes = [(rows >> (bits * p)) & ((1 << bits) - 1) for p in range(per)]  # plane p: channels pW .. pW+W-1
    return np.concatenate(planes, axis=-1).astype(np.uint8)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes [..., D] (each < 2^bits) to packed rows [..., D * bits / 8], uint8."""
    codes = np.asarray(codes, dtype=np.uint8)
    per = 8 // bits
    D = codes.shape[-1]
    if D % per:
        raise ValueError("pack_codes: %d codes is not a multiple of %d" % (D, per))
    W = D // per
    out = np.zeros(codes.shape[:-1] + (W,), dtype=np.uint8)
    for p in range(per):
        out |= (codes[..., p * W:(p + 1) * W] << (bits * p)).astype(np.uint8)
    return out
