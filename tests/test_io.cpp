#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "io/llama2c.h"
#include "io/mapped_file.h"
#include "model/model.h"
#include "test_util.h"

namespace kivi {
namespace {

using io::GgmlType;
using io::GgufFile;
using io::GgufWriter;

// A tiny but complete llama GGUF: dim 8, 2 heads, 1 KV head, 1 layer, vocab 6.
struct TinyGguf {
  int dim = 8, hidden = 16, layers = 1, heads = 2, kv_heads = 1, vocab = 6, ctx = 32;
  std::vector<float> w;  // backing storage for every tensor
  std::string skip_tensor, duplicate_tensor, arch = "llama", tok_model = "llama";
  int tokens_in_vocab = 6;
  std::vector<uint64_t> q_dims;  // override attn_q dims
  bool f16_matrices = false;

  void write(const std::string& path) {
    GgufWriter g;
    g.add_string("general.architecture", arch);
    g.add_u32("llama.context_length", ctx);
    g.add_u32("llama.embedding_length", dim);
    g.add_u32("llama.block_count", layers);
    g.add_u32("llama.feed_forward_length", hidden);
    g.add_u32("llama.attention.head_count", heads);
    g.add_u32("llama.attention.head_count_kv", kv_heads);
    g.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    g.add_u32("llama.vocab_size", vocab);
    g.add_string("tokenizer.ggml.model", tok_model);
    std::vector<std::string> toks = {"<unk>",
                                     "<s>",
                                     "</s>",
                                     "\xE2\x96\x81",
                                     "a",
                                     "\xE2\x96\x81"
                                     "a"};
    toks.resize(tokens_in_vocab, "x");
    g.add_string_array("tokenizer.ggml.tokens", toks);
    g.add_f32_array("tokenizer.ggml.scores", std::vector<float>(toks.size(), 0.0f));
    std::vector<int32_t> types(toks.size(), 1);
    types[0] = 2;
    types[1] = types[2] = 3;
    g.add_i32_array("tokenizer.ggml.token_type", types);
    g.add_u32("tokenizer.ggml.bos_token_id", 1);
    g.add_u32("tokenizer.ggml.eos_token_id", 2);
    w.assign(1 << 16, 0.01f);
    auto add = [&](const std::string& name, std::vector<uint64_t> dims) {
      if (name == skip_tensor) return;
      const bool matrix = dims.size() == 2;
      g.add_tensor(name, dims, matrix && f16_matrices ? GgmlType::kF16 : GgmlType::kF32,
                   static_cast<const void*>(w.data()));
      if (name == duplicate_tensor)
        g.add_tensor(name, dims, GgmlType::kF32, static_cast<const void*>(w.data()));
    };
    const uint64_t d = dim, kv = kv_heads * (dim / heads);
    add("token_embd.weight", {d, static_cast<uint64_t>(vocab)});
    for (int l = 0; l < layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      add(p + "attn_norm.weight", {d});
      add(p + "attn_q.weight", q_dims.empty() ? std::vector<uint64_t>{d, d} : q_dims);
      add(p + "attn_k.weight", {d, kv});
      add(p + "attn_v.weight", {d, kv});
      add(p + "attn_output.weight", {d, d});
      add(p + "ffn_norm.weight", {d});
      add(p + "ffn_gate.weight", {d, static_cast<uint64_t>(hidden)});
      add(p + "ffn_down.weight", {static_cast<uint64_t>(hidden), d});
      add(p + "ffn_up.weight", {d, static_cast<uint64_t>(hidden)});
    }
    add("output_norm.weight", {d});
    g.write(path);
  }
};

using test::load_error;

TEST(Gguf, WriterAndReaderRoundTrip) {
  test::TempDir t;
  GgufWriter g;
  g.add_string("s", "hello");
  g.add_u32("u", 7);
  g.add_i32("i", -3);
  g.add_u64("big", 1ull << 40);
  g.add_f32("f", 2.5f);
  g.add_bool("b", true);
  g.add_string_array("sa", {"x", "", "yz"});
  g.add_f32_array("fa", {1.0f, -2.0f});
  g.add_i32_array("ia", {5, 6, 7});
  std::vector<float> a(15);
  for (int i = 0; i < 15; ++i) a[i] = static_cast<float>(i);
  std::vector<uint16_t> h(6, 0x3C00);  // 1.0 in f16
  g.add_tensor("a", {5, 3}, GgmlType::kF32, static_cast<const void*>(a.data()));
  g.add_tensor("h", {6}, GgmlType::kF16, static_cast<const void*>(h.data()));
  g.add_tensor("gen", {4}, GgmlType::kF32,
               GgufWriter::Generator([](uint64_t first, uint64_t n, void* dst) {
                 for (uint64_t i = 0; i < n; ++i)
                   static_cast<float*>(dst)[i] = static_cast<float>(first + i) * 10;
               }));
  const std::string path = t.file("x.gguf");
  g.write(path);
  EXPECT_EQ(test::read_file(path).size(), g.file_size());
  GgufFile f(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("s"), "hello");
  EXPECT_EQ(f.get_uint("u"), 7u);
  EXPECT_EQ(f.find("i")->i, -3);
  EXPECT_EQ(f.get_uint("big"), 1ull << 40);
  EXPECT_EQ(f.get_float("f"), 2.5);
  EXPECT_TRUE(f.get_bool("b"));
  EXPECT_EQ(f.get_string_array("sa"), (std::vector<std::string>{"x", "", "yz"}));
  EXPECT_EQ(f.get_f32_array("fa"), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(f.get_i32_array("ia"), (std::vector<int32_t>{5, 6, 7}));
  ASSERT_EQ(f.tensors().size(), 3u);
  const auto* ta = f.find_tensor("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->dims, (std::vector<uint64_t>{5, 3}));
  EXPECT_EQ(std::memcmp(ta->data, a.data(), 60), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ta->data) % 32, 0u);
  const auto* tg = f.find_tensor("gen");
  float gv[4];
  std::memcpy(gv, tg->data, 16);
  EXPECT_EQ(gv[3], 30.0f);
  EXPECT_THROW(f.get_string("u"), Error);  // wrong type names the key
  EXPECT_THROW(f.get_uint("missing"), Error);
}

std::vector<uint8_t> small_gguf() {
  test::TempDir t;
  TinyGguf tg;
  tg.write(t.file("m.gguf"));
  return test::read_file(t.file("m.gguf"));
}

TEST(Gguf, EveryTruncationIsAnError) {
  const auto img = small_gguf();
  for (size_t n = 0; n < img.size(); n += (n < 2048 ? 1 : 97)) {
    EXPECT_THROW(
        {
          GgufFile f(img.data(), n, "trunc");
          // A file cut inside the tensor data parses but cannot hold the tensors.
          for (const auto& t : f.tensors()) {
            if (!t.data) throw Error("no data");
          }
          if (f.tensors().size() < 11) throw Error("missing tensors");
        },
        Error)
        << "prefix of " << n << " bytes";
  }
}

template <class T>
void poke(std::vector<uint8_t>& img, size_t off, T v) {
  std::memcpy(img.data() + off, &v, sizeof(T));
}

std::string parse_error(const std::vector<uint8_t>& img) {
  try {
    GgufFile f(img.data(), img.size(), "x.gguf");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Gguf, HostileHeaders) {
  const auto good = small_gguf();
  auto img = good;
  poke<uint32_t>(img, 0, 0x12345678);
  EXPECT_NE(parse_error(img).find("bad magic"), std::string::npos);
  img = good;
  poke<uint32_t>(img, 4, 1);
  EXPECT_NE(parse_error(img).find("unsupported GGUF version 1"), std::string::npos);
  img = good;
  poke<uint32_t>(img, 4, 99);
  EXPECT_NE(parse_error(img).find("version 99"), std::string::npos);
  img = good;
  poke<uint64_t>(img, 8, ~0ull);  // tensor count
  EXPECT_NE(parse_error(img).find("tensor count"), std::string::npos);
  img = good;
  poke<uint64_t>(img, 16, 1ull << 60);  // metadata count
  EXPECT_NE(parse_error(img).find("metadata count"), std::string::npos);
  img = good;
  poke<uint64_t>(img, 24, 1ull << 50);  // first key's length
  EXPECT_NE(parse_error(img).find("truncated"), std::string::npos);
  img = good;
  poke<uint32_t>(img, 24 + 8 + std::strlen("general.architecture"), 77);  // first value's type
  EXPECT_NE(parse_error(img).find("unknown type 77"), std::string::npos);
}

TEST(Gguf, HostileTensorTable) {
  test::TempDir t;
  {
    TinyGguf tg;
    tg.duplicate_tensor = "blk.0.attn_k.weight";
    tg.write(t.file("dup.gguf"));
    EXPECT_NE(load_error(t.file("dup.gguf")).find("duplicate tensor 'blk.0.attn_k.weight'"),
              std::string::npos);
  }
  {
    TinyGguf tg;
    tg.skip_tensor = "blk.0.ffn_up.weight";
    tg.write(t.file("miss.gguf"));
    EXPECT_NE(load_error(t.file("miss.gguf")).find("missing tensor 'blk.0.ffn_up.weight'"),
              std::string::npos);
  }
  {
    TinyGguf tg;
    tg.q_dims = {8, 9};
    tg.write(t.file("shape.gguf"));
    EXPECT_NE(load_error(t.file("shape.gguf"))
                  .find("'blk.0.attn_q.weight' has shape [8, 9], expected [8, 8]"),
              std::string::npos);
  }
  {
    TinyGguf tg;
    tg.arch = "gpt2";
    tg.write(t.file("arch.gguf"));
    EXPECT_NE(load_error(t.file("arch.gguf")).find("unsupported architecture 'gpt2'"),
              std::string::npos);
  }
  {
    TinyGguf tg;
    tg.tok_model = "rwkv";
    tg.write(t.file("tok.gguf"));
    EXPECT_NE(load_error(t.file("tok.gguf")).find("unsupported tokenizer 'rwkv'"),
              std::string::npos);
  }
  {
    TinyGguf tg;
    tg.tok_model = "gpt2";  // byte-level BPE, but without merges
    tg.write(t.file("bpe.gguf"));
    EXPECT_NE(load_error(t.file("bpe.gguf")).find("has no merges"), std::string::npos);
  }
  {
    TinyGguf tg;
    tg.tokens_in_vocab = 5;
    tg.write(t.file("vocab.gguf"));
    EXPECT_NE(load_error(t.file("vocab.gguf"))
                  .find("tokenizer has 5 tokens but the model's vocabulary size is"),
              std::string::npos);
  }
  {
    TinyGguf tg;
    tg.heads = 3;  // does not divide dim 8
    tg.write(t.file("heads.gguf"));
    EXPECT_NE(load_error(t.file("heads.gguf")).find("does not divide dim"), std::string::npos);
  }
  {
    // Tensor offset past the end: cut the file inside the tensor data.
    TinyGguf tg;
    tg.write(t.file("ok.gguf"));
    auto img = test::read_file(t.file("ok.gguf"));
    ASSERT_GT(img.size(), 8u);
    img.erase(img.end() - 8, img.end());  // (resize(size - 8) trips -Wstringop-overflow at -O1)
    test::write_file(t.file("cut.gguf"), img);
    EXPECT_NE(load_error(t.file("cut.gguf")).find("runs past the end of the file"),
              std::string::npos);
  }
  {
    TinyGguf tg;
    tg.f16_matrices = true;
    tg.write(t.file("f16.gguf"));
    EXPECT_EQ(load_error(t.file("f16.gguf")), "");  // F16 matrices load
  }
}

// Byte offset of tensor `name`'s u64 data offset in a GGUF image's tensor table.
size_t tensor_offset_field(const std::vector<uint8_t>& img, const std::string& name) {
  const auto it = std::search(img.begin(), img.end(), name.begin(), name.end());
  EXPECT_NE(it, img.end()) << name;
  const size_t p = static_cast<size_t>(it - img.begin()) + name.size();
  uint32_t nd = 0;
  std::memcpy(&nd, &img[p], 4);
  return p + 4 + 8 * nd + 4;
}

// Tensor data ranges must be disjoint: the same offset, a start inside another tensor,
// a range reaching into the next one; ranges that only touch are fine.
TEST(Gguf, OverlappingTensorsAreRejected) {
  const auto good = small_gguf();
  GgufFile f(good.data(), good.size(), "ok");
  const io::GgufTensor* q = f.find_tensor("blk.0.attn_q.weight");  // 8 x 8 f32: 256 bytes
  ASSERT_NE(q, nullptr);
  auto with_offset = [&](const std::string& name, uint64_t off) {
    auto img = good;
    poke<uint64_t>(img, tensor_offset_field(img, name), off);
    return img;
  };
  for (const uint64_t off : {q->offset, q->offset + 32, q->offset + 224}) {
    const std::string e = parse_error(with_offset("blk.0.ffn_up.weight", off));
    EXPECT_NE(e.find("overlaps"), std::string::npos) << off << ": " << e;
    EXPECT_NE(e.find("blk.0.attn_q.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("blk.0.ffn_up.weight"), std::string::npos) << e;
  }
  // attn_q moved to start 32 bytes before the next tensor: its 256 bytes run into it.
  const io::GgufTensor* k = f.find_tensor("blk.0.attn_k.weight");
  EXPECT_NE(parse_error(with_offset("blk.0.attn_q.weight", k->offset - 32)).find("overlaps"),
            std::string::npos);
  // The unmodified file: every tensor's range ends where the next begins (touching is fine).
  EXPECT_EQ(parse_error(good), "");
}

// llama2.c header fields, in order.
std::vector<uint8_t> l2c_image(std::vector<int32_t> header, size_t floats) {
  std::vector<uint8_t> img(28 + floats * 4, 0);
  std::memcpy(img.data(), header.data(), 28);
  return img;
}

std::string l2c_error(const std::vector<uint8_t>& img) {
  try {
    io::parse_llama2c(img.data(), img.size(), "m.bin");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Llama2c, HeaderValidation) {
  // dim 8, hidden 16, 1 layer, 2 heads, 1 kv head, vocab 4, seq 4.
  const std::vector<int32_t> ok = {8, 16, 1, 2, 1, 4, 4};
  io::Llama2cHeader h;
  std::memcpy(&h, ok.data(), 28);
  const size_t floats = (io::llama2c_expected_size(h, true) - 28) / 4;
  EXPECT_EQ(l2c_error(l2c_image(ok, floats)), "");
  auto with = [&](int field, int32_t v) {
    auto hd = ok;
    hd[field] = v;
    return l2c_error(l2c_image(hd, floats));
  };
  EXPECT_NE(with(0, 0).find("'dim' = 0"), std::string::npos);
  EXPECT_NE(with(0, -8).find("'dim' = -8"), std::string::npos);
  EXPECT_NE(with(1, -1).find("'hidden_dim' = -1"), std::string::npos);
  EXPECT_NE(with(2, 0).find("'n_layers' = 0"), std::string::npos);
  EXPECT_NE(with(3, 3).find("n_heads = 3 does not divide dim = 8"), std::string::npos);
  EXPECT_NE(with(4, 3).find("'n_kv_heads' = 3"), std::string::npos);
  EXPECT_NE(with(5, 0).find("'vocab_size' = 0"), std::string::npos);
  EXPECT_NE(with(6, 1 << 30).find("'seq_len'"), std::string::npos);
  EXPECT_NE(with(0, 1 << 30).find("'dim'"), std::string::npos);
  // Size mismatches: truncated, trailing data, and a negative vocab (separate classifier)
  // whose classifier is missing.
  EXPECT_NE(l2c_error(l2c_image(ok, floats - 1)).find("truncated"), std::string::npos);
  EXPECT_NE(l2c_error(l2c_image(ok, floats + 1)).find("trailing data"), std::string::npos);
  auto neg = ok;
  neg[5] = -4;
  EXPECT_NE(l2c_error(l2c_image(neg, floats)).find("separate classifier"), std::string::npos);
  EXPECT_EQ(l2c_error(l2c_image(neg, floats + 4 * 8)), "");
  EXPECT_NE(l2c_error(std::vector<uint8_t>(10)).find("header alone needs 28"), std::string::npos);
}

TEST(Llama2c, RealCheckpointLoads) {
  KIVI_REQUIRE_MODEL();
  auto ck = io::read_llama2c(test::model_path());
  EXPECT_EQ(ck->header.dim, 64);
  EXPECT_EQ(ck->header.n_kv_heads, 4);
  EXPECT_TRUE(ck->shared_classifier);
  EXPECT_EQ(ck->wcls, ck->token_embd);
}

TEST(Llama2c, TokenizerVocabularySizeMustMatch) {
  KIVI_REQUIRE_MODEL();
  EXPECT_EQ(io::read_llama2c_tokenizer(test::tokenizer_path(), 512).pieces.size(), 512u);
  try {
    io::read_llama2c_tokenizer(test::tokenizer_path(), 500);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more tokens than the model's vocabulary size 500"),
              std::string::npos);
  }
  try {
    io::read_llama2c_tokenizer(test::tokenizer_path(), 600);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fewer tokens than the model's vocabulary size 600"),
              std::string::npos);
  }
}

// copy_to_memory keeps the addresses and the bytes, and leaves the file alone. The map
// starts on a 2 MiB boundary so that the copy can use 2 MiB pages.
TEST(MappedFile, CopyToMemoryKeepsAddressesAndBytes) {
  test::TempDir t;
  for (size_t size : {size_t{1}, size_t{5000}, (size_t{3} << 20) + 123}) {
    std::string bytes(size, '\0');
    for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 131 + size);
    const std::string path = t.file("f" + std::to_string(size));
    test::write_text(path, bytes);
    io::MappedFile f(path);
    const uint8_t* before = f.data();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(before) % (size_t{2} << 20), 0u) << size;
    EXPECT_FALSE(f.copied());
    ASSERT_TRUE(f.copy_to_memory()) << size;
    EXPECT_TRUE(f.copied());
    EXPECT_EQ(f.data(), before);
    EXPECT_EQ(std::memcmp(f.data(), bytes.data(), size), 0) << size;
    ASSERT_TRUE(f.copy_to_memory());  // a second call changes nothing
    EXPECT_EQ(std::memcmp(f.data(), bytes.data(), size), 0) << size;
    EXPECT_EQ(test::read_file(path), std::vector<uint8_t>(bytes.begin(), bytes.end()));
  }
}

TEST(MappedFile, MissingFileAndDirectory) {
  try {
    io::MappedFile f("/nonexistent/file.bin");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/file.bin"), std::string::npos);
  }
  test::TempDir t;
  try {
    model::Model::load(t.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos);
  }
  test::write_text(t.file("empty"), "");
  EXPECT_THROW(model::Model::load(t.file("empty")), Error);
}

}  // namespace
}  // namespace kivi
