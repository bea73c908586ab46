#!/usr/bin/env python3
"""Writes small valid inputs for the fuzzers: a GGUF model, a llama2.c checkpoint and a
llama2.c tokenizer, each a few kilobytes, so mutations start from well-formed files."""
import os
import struct
import sys


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_gguf(path):
    dim, hidden, vocab = 8, 16, 6
    kvs = []

    def kv(key, typ, payload):
        kvs.append(gguf_string(key) + struct.pack("<I", typ) + payload)

    kv("general.architecture", 8, gguf_string("llama"))
    kv("general.alignment", 4, struct.pack("<I", 32))
    for key, val in [("llama.context_length", 16), ("llama.embedding_length", dim), ("llama.block_count", 1),
                     ("llama.feed_forward_length", hidden), ("llama.attention.head_count", 2),
                     ("llama.attention.head_count_kv", 1)]:
        kv(key, 4, struct.pack("<I", val))
    kv("llama.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", 1e-5))
    kv("tokenizer.ggml.model", 8, gguf_string("llama"))
    toks = ["<unk>", "<s>", "</s>", "\u2581", "a", "\u2581a"]
    kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, len(toks)) + b"".join(gguf_string(t) for t in toks))
    kv("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, len(toks)) + struct.pack("<6f", *range(6)))
    kv("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, len(toks)) + struct.pack("<6i", 2, 3, 3, 1, 1, 1))
    tensors = [("token_embd.weight", [dim, vocab]), ("blk.0.attn_norm.weight", [dim]),
               ("blk.0.attn_q.weight", [dim, dim]), ("blk.0.attn_k.weight", [dim, 4]),
               ("blk.0.attn_v.weight", [dim, 4]), ("blk.0.attn_output.weight", [dim, dim]),
               ("blk.0.ffn_norm.weight", [dim]), ("blk.0.ffn_gate.weight", [dim, hidden]),
               ("blk.0.ffn_down.weight", [hidden, dim]), ("blk.0.ffn_up.weight", [dim, hidden]),
               ("output_norm.weight", [dim])]
    infos, data, off = b"", b"", 0
    for name, dims in tensors:
        n = 1
        for d in dims:
            n *= d
        infos += gguf_string(name) + struct.pack("<I", len(dims)) + struct.pack("<%dQ" % len(dims), *dims)
        infos += struct.pack("<IQ", 0, off)
        blob = struct.pack("<%df" % n, *([0.01] * n))
        pad = (-len(blob)) % 32
        data += blob + b"\0" * pad
        off += len(blob) + pad
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + infos
    head += b"\0" * ((-len(head)) % 32)
    with open(path, "wb") as f:
        f.write(head + data)


def write_quantized_gguf(path):
    """One tensor of every readable block type (ggml type id, block values, block bytes),
    two rows of one or two blocks each, with varied bytes."""
    types = [(1, 1, 2), (30, 1, 2), (2, 32, 18), (3, 32, 20), (6, 32, 22), (7, 32, 24), (8, 32, 34),
             (10, 256, 84), (11, 256, 110), (12, 256, 144), (13, 256, 176), (14, 256, 210), (15, 256, 292)]
    infos, data, off = b"", b"", 0
    for tid, block, nbytes in types:
        cols = 256 if block == 256 else 64
        n_blocks = 2 * cols // block
        blob = bytes((i * 37 + tid) % 251 for i in range(n_blocks * nbytes))
        infos += gguf_string("t%d" % tid) + struct.pack("<I", 2) + struct.pack("<2Q", cols, 2)
        infos += struct.pack("<IQ", tid, off)
        pad = (-len(blob)) % 32
        data += blob + b"\0" * pad
        off += len(blob) + pad
    head = b"GGUF" + struct.pack("<IQQ", 3, len(types), 0) + infos
    head += b"\0" * ((-len(head)) % 32)
    with open(path, "wb") as f:
        f.write(head + data)


def write_llama2c(path):
    dim, hidden, layers, heads, kv_heads, vocab, seq = 8, 16, 1, 2, 1, 6, 4
    hs = dim // heads
    kv_dim = kv_heads * hs
    n = vocab * dim + layers * dim + layers * dim * dim + 2 * layers * kv_dim * dim + layers * dim * dim
    n += layers * dim + 3 * layers * hidden * dim + dim + seq * hs
    with open(path, "wb") as f:
        f.write(struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab, seq))
        f.write(struct.pack("<%df" % n, *([0.01] * n)))


def write_tokenizer(path):
    toks = [b"<unk>", b"\n<s>\n", b"\n</s>\n", b"<0x41>", b" ", b"a", b" a", b"b", b"ab"]
    body = struct.pack("<i", 8)
    for i, t in enumerate(toks):
        body += struct.pack("<fi", -float(i), len(t)) + t
    # 4 control bytes: vocabulary size (9), split point (keep the whole file), flags.
    with open(path, "wb") as f:
        split = 230
        f.write(bytes([9, 0, split, 1]) + body + b"ab a\xc3\xa9!")


def main():
    out = sys.argv[1]
    for sub in ("gguf", "llama2c", "tokenizer"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    write_gguf(os.path.join(out, "gguf", "tiny.gguf"))
    write_quantized_gguf(os.path.join(out, "gguf", "quantized.gguf"))
    write_llama2c(os.path.join(out, "llama2c", "tiny.bin"))
    write_tokenizer(os.path.join(out, "tokenizer", "tiny.tok"))


if __name__ == "__main__":
    main()
