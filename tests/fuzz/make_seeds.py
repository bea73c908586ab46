#!/usr/bin/env python3
"""Writes small valid inputs for the fuzzers: a GGUF model, a llama2.c checkpoint, a
llama2.c tokenizer and KV cache files, each a few kilobytes, so mutations start from
well-formed files."""
import json
import os
import struct
import sys


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def q8_0_blob(n):
    """n values (a multiple of 32) as Q8_0 blocks: an f16 scale, then 32 int8 codes."""
    out = b""
    for b in range(n // 32):
        out += struct.pack("<e", 0.01) + bytes((i * 7 + b) % 256 for i in range(32))
    return out


def write_gguf(path, arch="llama", q8_0=False, swa=False, experts=0, rope_dims=0):
    """A one-layer model of `arch` (llama, qwen2 with Q/K/V biases, qwen3 with per-head Q/K
    norms, gemma2 and gemma3 with post-norms, caps and their RoPE keys); with q8_0 its matrices are Q8_0 (dim 32, the block size); with swa a sliding
    window of 4 tokens and its pattern as an array of one bool per layer; with experts > 0
    a mixture of that many experts (2 used) in place of the FFN (qwen3moe); gpt-oss with
    its sinks, biases, YaRN keys and post_attention_norm; rope_dims: partial rotary."""
    dim, hidden, vocab = (32, 32, 6) if q8_0 else (8, 16, 6)
    kvs = []

    def kv(key, typ, payload):
        kvs.append(gguf_string(key) + struct.pack("<I", typ) + payload)

    kv("general.architecture", 8, gguf_string(arch))
    kv("general.alignment", 4, struct.pack("<I", 32))
    for key, val in [("context_length", 16), ("embedding_length", dim), ("block_count", 1),
                     ("feed_forward_length", hidden), ("attention.head_count", 2),
                     ("attention.head_count_kv", 1)]:
        kv(arch + "." + key, 4, struct.pack("<I", val))
    kv(arch + ".attention.layer_norm_rms_epsilon", 6, struct.pack("<f", 1e-5))
    if experts:
        kv(arch + ".expert_count", 4, struct.pack("<I", experts))
        kv(arch + ".expert_used_count", 4, struct.pack("<I", 2))
    if arch in ("gemma2", "gemma3"):
        # The caps and the windowed layers' RoPE base, the keys only these read.
        kv(arch + ".final_logit_softcapping", 6, struct.pack("<f", 30.0))
        kv(arch + ".rope.freq_base_swa", 6, struct.pack("<f", 10000.0))
        if arch == "gemma2":
            kv(arch + ".attn_logit_softcapping", 6, struct.pack("<f", 50.0))
    if rope_dims:
        kv(arch + ".rope.dimension_count", 4, struct.pack("<I", rope_dims))
    if arch == "gpt-oss":
        kv(arch + ".rope.scaling.type", 8, gguf_string("yarn"))
        kv(arch + ".rope.scaling.factor", 6, struct.pack("<f", 4.0))
        kv(arch + ".rope.scaling.original_context_length", 4, struct.pack("<I", 8))
    if swa:
        kv(arch + ".attention.sliding_window", 4, struct.pack("<I", 4))
        kv(arch + ".attention.sliding_window_pattern", 9, struct.pack("<IQ", 7, 1) + b"\x01")
    kv("tokenizer.ggml.model", 8, gguf_string("llama"))
    toks = ["<unk>", "<s>", "</s>", "\u2581", "a", "\u2581a"]
    kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, len(toks)) + b"".join(gguf_string(t) for t in toks))
    kv("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, len(toks)) + struct.pack("<6f", *range(6)))
    kv("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, len(toks)) + struct.pack("<6i", 2, 3, 3, 1, 1, 1))
    tensors = [("token_embd.weight", [dim, vocab]), ("blk.0.attn_norm.weight", [dim]),
               ("blk.0.attn_q.weight", [dim, dim]), ("blk.0.attn_k.weight", [dim, dim // 2]),
               ("blk.0.attn_v.weight", [dim, dim // 2]), ("blk.0.attn_output.weight", [dim, dim]),
               ("blk.0.ffn_norm.weight", [dim]), ("blk.0.ffn_gate.weight", [dim, hidden]),
               ("blk.0.ffn_down.weight", [hidden, dim]), ("blk.0.ffn_up.weight", [dim, hidden]),
               ("output_norm.weight", [dim])]
    hd = dim // 2
    if experts:
        tensors = [t for t in tensors if not t[0].startswith("blk.0.ffn_") or t[0] == "blk.0.ffn_norm.weight"]
        tensors += [("blk.0.ffn_gate_inp.weight", [dim, experts]),
                    ("blk.0.ffn_gate_exps.weight", [dim, hidden, experts]),
                    ("blk.0.ffn_down_exps.weight", [hidden, dim, experts]),
                    ("blk.0.ffn_up_exps.weight", [dim, hidden, experts])]
    if arch in ("qwen2", "gpt-oss"):
        tensors += [("blk.0.attn_q.bias", [dim]), ("blk.0.attn_k.bias", [hd]), ("blk.0.attn_v.bias", [hd])]
    if arch == "gpt-oss":
        tensors = [("blk.0.post_attention_norm.weight", [dim]) if t[0] == "blk.0.ffn_norm.weight" else t
                   for t in tensors]
        tensors += [("blk.0.attn_output.bias", [dim]), ("blk.0.attn_sinks.weight", [2]),
                    ("blk.0.ffn_gate_inp.bias", [experts]), ("blk.0.ffn_gate_exps.bias", [hidden, experts]),
                    ("blk.0.ffn_up_exps.bias", [hidden, experts]), ("blk.0.ffn_down_exps.bias", [dim, experts])]
    if arch in ("qwen3", "qwen3moe", "gemma3"):
        tensors += [("blk.0.attn_q_norm.weight", [hd]), ("blk.0.attn_k_norm.weight", [hd])]
    if arch in ("gemma2", "gemma3"):
        tensors += [("blk.0.post_attention_norm.weight", [dim]), ("blk.0.post_ffw_norm.weight", [dim])]
    if arch == "phi3":  # fused Q/K/V and gate-up
        tensors = [t for t in tensors if t[0] not in ("blk.0.attn_q.weight", "blk.0.attn_k.weight",
                                                      "blk.0.attn_v.weight", "blk.0.ffn_gate.weight",
                                                      "blk.0.ffn_up.weight")]
        tensors += [("blk.0.attn_qkv.weight", [dim, dim + dim]), ("blk.0.ffn_up.weight", [dim, 2 * hidden])]
    infos, data, off = b"", b"", 0
    for name, dims in tensors:
        n = 1
        for d in dims:
            n *= d
        quantized = q8_0 and len(dims) == 2
        infos += gguf_string(name) + struct.pack("<I", len(dims)) + struct.pack("<%dQ" % len(dims), *dims)
        infos += struct.pack("<IQ", 8 if quantized else 0, off)
        blob = q8_0_blob(n) if quantized else struct.pack("<%df" % n, *([0.01] * n))
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
             (10, 256, 84), (11, 256, 110), (12, 256, 144), (13, 256, 176), (14, 256, 210), (15, 256, 292),
             (39, 32, 17)]
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


def write_bpe(folder):
    """fuzz_bpe seeds: a small tokenizer.json (mode byte 0) and a structured input (1)."""
    bs = list(range(33, 127)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    char = {b: chr(c) for b, c in zip(bs, cs)}
    vocab = {char[b]: b for b in range(256)}
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), (char[32], "w")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    regex = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    tj = {"added_tokens": [{"id": len(vocab), "content": "<|im_end|>", "special": True}],
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
              {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated"},
              {"type": "ByteLevel", "use_regex": False}]},
          "model": {"type": "BPE", "vocab": vocab, "merges": [a + " " + b for a, b in merges]}}
    with open(os.path.join(folder, "tiny.json"), "wb") as f:
        f.write(b"\x00" + json.dumps(tj).encode())
    with open(os.path.join(folder, "struct.bin"), "wb") as f:
        f.write(b"\x01\x00\x08" + bytes([104, 101, 108, 108, 0, 1, 32, 119, 1, 2, 3, 4, 5, 6, 7, 8]) +
                "hello world  12345 \u00e9\U0001F600 <|c|><u>\n\n".encode() + b"\xff\xe2\x82")


def write_openai(folder):
    """fuzz_openai_request seeds: byte 0 picks the endpoint (0 completions, 1 chat,
    2 /tokenize, 4 /detokenize, 6 /v1/embeddings)."""
    seeds = [
        (0, {"model": "m", "prompt": "a the", "max_tokens": 5, "temperature": 0.5, "stop": ["\n", "User:"]}),
        (0, {"prompt": [1, 200, 40], "stream": True, "stream_options": {"include_usage": True}, "seed": 7}),
        (1, {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
                          {"role": "assistant", "content": [{"type": "text", "text": "b"}]},
                          {"role": "user", "content": "c"}], "max_completion_tokens": 9, "top_p": 0.9}),
        (1, {"messages": [{"role": "user", "content": "a"}], "logprobs": True, "top_logprobs": 3}),
        (0, {"prompt": "a", "logprobs": 2, "max_tokens": 3}),
        (2, {"content": "a the User:", "add_special": True, "with_pieces": True}),
        (4, {"tokens": [1, 200, 40, 262]}),
        (6, {"input": ["a the", [1, 200, 40]], "model": "m", "encoding_format": "float"}),
        (1, {"messages": [{"role": "user", "content": "a"}],
             "response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {
                 "type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]}}}}),
        (0, {"prompt": "a", "grammar": "root ::= [a-z]+ \"!\"\n", "max_tokens": 4}),
        (0, {"prompt": "a", "response_format": {"type": "json_object"}}),
        (1, {"messages": [{"role": "user", "content": "a"}], "tool_choice": "required",
             "tools": [{"type": "function", "function": {"name": "f", "parameters": {
                 "type": "object", "properties": {"x": {"enum": [1, 2]}}, "required": ["x"]}}}]}),
        (1, {"messages": [{"role": "user", "content": "a"},
                          {"role": "assistant", "content": None, "tool_calls": [{"id": "c",
                           "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                          {"role": "tool", "tool_call_id": "c", "content": "1"}],
             "tools": [{"type": "function", "function": {"name": "f"}}],
             "tool_choice": {"type": "function", "function": {"name": "f"}}}),
    ]
    for i, (endpoint, body) in enumerate(seeds):
        with open(os.path.join(folder, f"req{i}.bin"), "wb") as f:
            f.write(bytes([endpoint]) + json.dumps(body).encode())


def write_grammar(folder):
    """fuzz_grammar seeds: byte 0 even, GBNF text, a NUL and text to feed; odd, a JSON schema."""
    grammars = [
        'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]+ | "(" expr ")"\0(1+2)-3',
        'root ::= "{" ws ("\\"" [^"\\\\]* "\\"")? "}"\nws ::= [ \\t\\n]{0,3} # c\0{ "ab"}',
        'root ::= yes\n   | no\nyes ::= "y\\u00e9"{1,3}\nno ::= [^a-z]? .\0y\u00e9y\u00e9',
    ]
    for i, g in enumerate(grammars):
        with open(os.path.join(folder, f"gbnf{i}.bin"), "wb") as f:
            f.write(b"\x00" + g.encode())
    schemas = [
        {"type": "object", "properties": {"a": {"type": "string", "maxLength": 4},
                                          "b": {"type": "integer", "minimum": -3, "maximum": 120},
                                          "c": {"type": "array", "items": {"enum": ["x", 1, None]}, "maxItems": 2}},
         "required": ["a"], "additionalProperties": False},
        {"$defs": {"n": {"type": "object", "properties": {"k": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
                         "required": ["k"]}}, "$ref": "#/$defs/n"},
        {"anyOf": [{"type": "number"}, {"type": "null"}, {"const": {"q": [1, 2]}}, {"type": "string", "format": "date"}]},
    ]
    for i, sch in enumerate(schemas):
        with open(os.path.join(folder, f"schema{i}.bin"), "wb") as f:
            f.write(b"\x01" + json.dumps(sch).encode())


M64 = (1 << 64) - 1
P1, P2, P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9


def checksum(data):
    """core/checksum.h: four lanes of 8-byte words, then the length and the tail."""
    rotl = lambda x, r: ((x << r) | (x >> (64 - r))) & M64
    lanes = [(P1 + P2) & M64, P2, 0, (-P1) & M64]
    full = len(data) // 32 * 32
    for i in range(0, full, 32):
        for j in range(4):
            w = struct.unpack_from("<Q", data, i + 8 * j)[0]
            lanes[j] = (rotl((lanes[j] + w * P2) & M64, 31) * P1) & M64
    h = (rotl(lanes[0], 1) + rotl(lanes[1], 7) + rotl(lanes[2], 12) + rotl(lanes[3], 18)) & M64
    h ^= (len(data) * P1) & M64
    for b in data[full:]:
        h = ((h ^ b) * P3) & M64
    h ^= h >> 33
    h = (h * P2) & M64
    h ^= h >> 29
    h = (h * P3) & M64
    h ^= h >> 32
    return h


def write_kv(folder):
    """fuzz_kv_file seeds (byte 0: 0 as is, 1 resealed): one layer, one KV head, head_dim 8,
    KIVI 2-bit keys and values, G = R = 8, blocks of 16, 20 tokens (16 keys quantized, 4 in the
    window; 12 values quantized, 8 in the window); then the same with sparse summaries (Quest's
    min/max and the fixed representatives' mean), and as a conversation (a chat section)."""
    H, D, B, G, R, ctx, n = 1, 8, 16, 8, 8, 64, 20
    nb = (n + B - 1) // B
    # (file, summary kind (0 none, 1 min/max, 4 fixed), chat section)
    for name, kind, chat in (("kivi2.kv", 0, False), ("kivi2_sparse.kv", 1, False),
                             ("kivi2_sparse_fix.kv", 4, False), ("kivi2_chat.kv", 0, True)):
        sparse = kind != 0
        cfg = [1, H, D, ctx, 3, 0, 3, 0, G, R, 0, 0, B, 0, 1, 0, 0, 0,
               kind, 16 if sparse else 0, 0, 0, 0, 0, 0, 0, 0]
        sections = [(1, -1, struct.pack("<%di" % len(cfg), *cfg)),
                    (2, -1, struct.pack("<qqii", 0, 0, 0, 0)),
                    (3, -1, struct.pack("<%di" % n, *[(7 * i) % 500 + 1 for i in range(n)]))]
        if chat:  # turns, 0, the sampler's four state words
            sections.append((5, -1, struct.pack("<iiQQQQ", 2, 0, 1, 2, 3, 4)))
        state = struct.pack("<i", n) + struct.pack("<iifiq", 16, 0, 0.0, 0, 0) + \
            struct.pack("<iifiq", 12, 0, 0.0, 0, 0)
        sections.append((4, 0, state))
        codes, params, ring = H * nb * B * D * 2 // 8, H * nb * 16 * 2, 8 * H * D * 4
        for stream in (0, 1):
            for part, size in ((0, codes), (1, params), (2, params), (3, ring)):
                sections.append((16 + 8 * stream + part, 0, bytes((i * 29 + part) % 251 for i in range(size))))
        if sparse:
            done = 16
            vecs = 2 if kind == 1 else 1
            sections.append((32, 0, struct.pack("<ii", done, 0) + bytes(H * (done // 16) * vecs * D * 2)))
        write_kv_sections(folder, name, sections, n)
    write_kv_tq(folder)


def write_kv_sections(folder, name, sections, n):
    """Lays out a KV file of these (kind, layer, body) sections and writes both seed modes."""
    table_end = 64 + 32 * len(sections)
    offsets, off = [], table_end
    for _, _, body in sections:
        off = (off + 63) // 64 * 64
        offsets.append(off)
        off += len(body)
    table = b"".join(struct.pack("<IiQQQ", k, l, o, len(b), checksum(b))
                     for (k, l, b), o in zip(sections, offsets))
    head = b"KIVIKVC\0" + struct.pack("<IIQqqdQ", 4, len(sections), 0x1234, n, n, 0.5, off)
    head += struct.pack("<Q", checksum(head + table))
    out = bytearray(head + table)
    for (_, _, body), o in zip(sections, offsets):
        out += bytes(o - len(out)) + body
    for mode in (0, 1):
        with open(os.path.join(folder, "%d_%s" % (mode, name)), "wb") as f:
            f.write(bytes([mode]) + bytes(out))


def write_kv_tq(folder):
    """A tq seed: one layer, one KV head, head_dim 8, tq3 keys and tq2.5 values, R = 8, blocks
    of 16, 20 tokens (12 of each stored, 8 in the window), rotation seed 0x6b697669. The config
    holds each stream's codebook fingerprint (kv/tq.h) as this build computes it at head_dim 8;
    a build whose codebooks differ refuses the seed at its config, which is still an input."""
    H, D, B, R, ctx, n = 1, 8, 16, 8, 64, 20
    tq3, tq25 = 7, 9
    fp_tq3, fp_tq25 = 2108674478, 1511356768
    cfg = [1, H, D, ctx, tq3, 0, tq25, 0, 8, R, 0, 0, B, 0, 1, 0, 0, 0, 0, 0, 0,
           0x6b697669, 0, fp_tq3, fp_tq25, 0, 0]
    sections = [(1, -1, struct.pack("<%di" % len(cfg), *cfg)),
                (2, -1, struct.pack("<qqii", 0, 0, 0, 0)),
                (3, -1, struct.pack("<%di" % n, *[(7 * i) % 500 + 1 for i in range(n)]))]
    state = struct.pack("<i", n) + struct.pack("<iifiq", 12, 0, 0.0, 0, 0) * 2
    sections.append((4, 0, state))
    nb = (n + B - 1) // B
    for stream, row in ((0, 3), (1, 3)):  # 24 and 18 bits of codes per row: 3 bytes each
        for part, size in ((0, H * nb * B * row), (1, H * nb * B * 2), (3, R * H * D * 4)):
            sections.append((16 + 8 * stream + part, 0, bytes((i * 29 + part) % 251 for i in range(size))))
    write_kv_sections(folder, "tq.kv", sections, n)
    write_kv_layers(folder)


def write_kv_layers(folder):
    """A seed whose layers differ in format: two layers, one KV head, head_dim 8, G = R = 8,
    blocks of 16, 20 tokens; layer 0 KIVI 2-bit keys and values (as kivi2.kv), layer 1 tq3 keys
    and tq2.5 values (as tq.kv). The stream fields hold f32 and the per-layer formats follow
    the config's fixed fields; each codebook field combines the layers' fingerprints
    (h = 31 h + fingerprint over the tq layers: here layer 1's alone)."""
    H, D, B, G, R, ctx, n = 1, 8, 16, 8, 8, 64, 20
    kivi2, tq3, tq25 = 3, 7, 9
    fp_tq3, fp_tq25 = 2108674478, 1511356768
    cfg = [2, H, D, ctx, 0, 0, 0, 0, G, R, 0, 0, B, 0, 1, 0, 0, 0, 0, 0, 0,
           0x6b697669, 0, fp_tq3, fp_tq25, 2, 0,
           kivi2, 0, kivi2, 0, tq3, 0, tq25, 0]
    sections = [(1, -1, struct.pack("<%di" % len(cfg), *cfg)),
                (2, -1, struct.pack("<qqii", 0, 0, 0, 0)),
                (3, -1, struct.pack("<%di" % n, *[(7 * i) % 500 + 1 for i in range(n)]))]
    nb = (n + B - 1) // B
    # Layer 0: KIVI (16 keys and 12 values stored; codes, scales, zero points, rings).
    sections.append((4, 0, struct.pack("<i", n) + struct.pack("<iifiq", 16, 0, 0.0, 0, 0) +
                     struct.pack("<iifiq", 12, 0, 0.0, 0, 0)))
    codes, params, ring = H * nb * B * D * 2 // 8, H * nb * 16 * 2, 8 * H * D * 4
    for stream in (0, 1):
        for part, size in ((0, codes), (1, params), (2, params), (3, ring)):
            sections.append((16 + 8 * stream + part, 0, bytes((i * 29 + part) % 251 for i in range(size))))
    # Layer 1: tq (12 of each stored; codes, scales, rings).
    sections.append((4, 1, struct.pack("<i", n) + struct.pack("<iifiq", 12, 0, 0.0, 0, 0) * 2))
    for stream in (0, 1):
        for part, size in ((0, H * nb * B * 3), (1, H * nb * B * 2), (3, R * H * D * 4)):
            sections.append((16 + 8 * stream + part, 1, bytes((i * 31 + part) % 251 for i in range(size))))
    write_kv_sections(folder, "layers.kv", sections, n)


def main():
    out = sys.argv[1]
    for sub in ("gguf", "llama2c", "tokenizer"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    write_gguf(os.path.join(out, "gguf", "tiny.gguf"))
    write_quantized_gguf(os.path.join(out, "gguf", "quantized.gguf"))
    write_llama2c(os.path.join(out, "llama2c", "tiny.bin"))
    os.makedirs(os.path.join(out, "model"), exist_ok=True)
    for arch in ("llama", "qwen2", "qwen3"):
        write_gguf(os.path.join(out, "model", arch + ".gguf"), arch)
    write_gguf(os.path.join(out, "model", "llama-q8_0.gguf"), "llama", q8_0=True)
    write_gguf(os.path.join(out, "model", "llama-swa.gguf"), "llama", swa=True)
    write_gguf(os.path.join(out, "model", "qwen3moe.gguf"), "qwen3moe", experts=4)
    write_gguf(os.path.join(out, "model", "gemma2.gguf"), "gemma2")
    write_gguf(os.path.join(out, "model", "gemma3.gguf"), "gemma3", swa=True)
    write_gguf(os.path.join(out, "model", "phi3.gguf"), "phi3")
    write_gguf(os.path.join(out, "model", "phi3-partial.gguf"), "phi3", rope_dims=2)
    write_gguf(os.path.join(out, "model", "gpt-oss.gguf"), "gpt-oss", swa=True, experts=4)
    write_tokenizer(os.path.join(out, "tokenizer", "tiny.tok"))
    os.makedirs(os.path.join(out, "bpe"), exist_ok=True)
    write_bpe(os.path.join(out, "bpe"))
    os.makedirs(os.path.join(out, "openai_request"), exist_ok=True)
    write_openai(os.path.join(out, "openai_request"))
    os.makedirs(os.path.join(out, "grammar"), exist_ok=True)
    write_grammar(os.path.join(out, "grammar"))
    os.makedirs(os.path.join(out, "kv_file"), exist_ok=True)
    write_kv(os.path.join(out, "kv_file"))


if __name__ == "__main__":
    main()
