// Safetensors loading: the generated checkpoints load (sharded bf16 and single-file f32), and every kind of
// bad checkpoint gives an error that names the file and the tensor, never a crash.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "model_test_util.h"
#include "rank/model/model.h"

namespace ddtree::model {
namespace {

using test::TempDir;
namespace fs = std::filesystem;

// Rewrites `file` (a safetensors file) keeping every tensor, with `edit` free to drop (return false),
// change shape or dtype of each entry.
struct Entry {
  std::string name;
  StDType dtype;
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;
};
template <class F>
void rewrite(const fs::path& file, F edit) {
  std::vector<Entry> entries;
  {
    SafetensorsFile f(file);
    for (const auto& [name, t] : f.tensors())
      entries.push_back(Entry{name, t.dtype, t.shape, std::vector<unsigned char>(t.data, t.data + t.nbytes)});
  }
  SafetensorsWriter w;
  for (auto& e : entries)
    if (edit(e)) w.add(e.name, e.dtype, e.shape, e.bytes.data(), e.bytes.size());
  w.write(file);
}

// Expects Model::load to throw an error whose message contains all of `needles`.
void expect_load_error(const fs::path& dir, std::initializer_list<std::string> needles) {
  try {
    Model::load(dir);
    FAIL() << "loaded " << dir;
  } catch (const std::exception& e) {
    const std::string m = e.what();
    for (const auto& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "message: " << m;
  }
}

// The shard file holding `tensor` in a sharded checkpoint.
fs::path shard_of(const fs::path& dir, const std::string& tensor) {
  Checkpoint ck(dir);
  return ck.file_of(tensor);
}

TEST(Checkpoint, LoadsGeneratedCheckpoints) {
  REQUIRE_FIXTURE(moe, "DDTREE_TEST_MODEL_MOE");
  REQUIRE_FIXTURE(dense, "DDTREE_TEST_MODEL_DENSE");
  Checkpoint a(moe);
  EXPECT_EQ(a.get("model.layers.1.mlp.experts.15.down_proj.weight").dtype, StDType::kBF16);
  EXPECT_EQ(a.get("model.layers.1.mlp.gate.e_score_correction_bias").dtype, StDType::kF32);
  EXPECT_NE(a.file_of("model.embed_tokens.weight"), a.file_of("model.norm.weight"));  // really sharded
  const Model ma = Model::load(moe);
  EXPECT_EQ(ma.config().kv_lora_rank, 512);
  EXPECT_TRUE(ma.weights().layers[1].moe);
  EXPECT_EQ(ma.weights().layers[1].experts.size(), 16u);
  const Model mb = Model::load(dense);
  EXPECT_EQ(mb.config().q_lora_rank, 0);
  EXPECT_TRUE(mb.config().tie_word_embeddings);
  EXPECT_EQ(mb.weights().lm_head.w, mb.weights().embed.w);
  // bf16 widening is exact: the loaded value is the stored bf16 bit pattern << 16.
  const TensorInfo& t = a.get("model.norm.weight");
  uint16_t h;
  std::memcpy(&h, t.data, 2);
  EXPECT_EQ(ma.weights().final_norm[0], bf16_to_f32(h));
}

TEST(Checkpoint, TruncatedFile) {
  REQUIRE_FIXTURE(moe, "DDTREE_TEST_MODEL_MOE");
  TempDir tmp("trunc");
  test::copy_dir(moe, tmp.path);
  const fs::path f = shard_of(tmp.path, "lm_head.weight");
  fs::resize_file(f, fs::file_size(f) - 1000);
  expect_load_error(tmp.path, {f.filename().string(), "truncated", "tensor"});
  // Cut inside the header too.
  fs::resize_file(f, 100);
  expect_load_error(tmp.path, {f.filename().string(), "truncated"});
  fs::resize_file(f, 3);
  expect_load_error(tmp.path, {f.filename().string(), "truncated"});
}

TEST(Checkpoint, MissingTensor) {
  REQUIRE_FIXTURE(moe, "DDTREE_TEST_MODEL_MOE");
  REQUIRE_FIXTURE(dense, "DDTREE_TEST_MODEL_DENSE");
  {
    // Sharded: the index still names the tensor, its file no longer holds it.
    TempDir tmp("missing_idx");
    test::copy_dir(moe, tmp.path);
    const std::string name = "model.layers.2.mlp.experts.7.up_proj.weight";
    const fs::path f = shard_of(tmp.path, name);
    rewrite(f, [&](Entry& e) { return e.name != name; });
    expect_load_error(tmp.path, {name, f.filename().string(), "does not contain"});
  }
  {
    // Single file.
    TempDir tmp("missing_single");
    test::copy_dir(dense, tmp.path);
    const std::string name = "model.layers.1.self_attn.kv_b_proj.weight";
    rewrite(tmp.path / "model.safetensors", [&](Entry& e) { return e.name != name; });
    expect_load_error(tmp.path, {name, "missing"});
  }
  {
    // Tied embeddings do not need lm_head; an untied model does.
    TempDir tmp("missing_lm_head");
    test::copy_dir(moe, tmp.path);
    const fs::path f = shard_of(tmp.path, "lm_head.weight");
    rewrite(f, [&](Entry& e) { return e.name != "lm_head.weight"; });
    // Drop it from the index as well: then it is plainly missing.
    std::ifstream in(tmp.path / "model.safetensors.index.json");
    auto j = nlohmann::json::parse(in);
    j["weight_map"].erase("lm_head.weight");
    std::ofstream(tmp.path / "model.safetensors.index.json") << j.dump();
    expect_load_error(tmp.path, {"lm_head.weight", "missing"});
  }
}

TEST(Checkpoint, WrongShape) {
  REQUIRE_FIXTURE(moe, "DDTREE_TEST_MODEL_MOE");
  TempDir tmp("shape");
  test::copy_dir(moe, tmp.path);
  const std::string name = "model.layers.0.self_attn.kv_b_proj.weight";  // [4 * 256, 512]
  const fs::path f = shard_of(tmp.path, name);
  rewrite(f, [&](Entry& e) {
    if (e.name == name) e.shape = {512, 1024};
    return true;
  });
  expect_load_error(tmp.path, {f.filename().string(), name, "shape [512, 1024]", "expected [1024, 512]"});
}

TEST(Checkpoint, UnsupportedDtype) {
  REQUIRE_FIXTURE(moe, "DDTREE_TEST_MODEL_MOE");
  TempDir tmp("dtype");
  test::copy_dir(moe, tmp.path);
  const std::string name = "model.layers.1.mlp.gate.weight";  // bf16 [16, 256]
  const fs::path f = shard_of(tmp.path, name);
  rewrite(f, [&](Entry& e) {
    if (e.name == name) {  // the same shape stored as FP8 (one byte per element), as the hub's V3 ships
      e.dtype = StDType::kF8E4M3;
      e.bytes.resize(e.bytes.size() / 2);
    }
    return true;
  });
  expect_load_error(tmp.path, {f.filename().string(), name, "F8_E4M3", "not supported"});
}

TEST(Checkpoint, BadHeaderAndIndex) {
  REQUIRE_FIXTURE(moe, "DDTREE_TEST_MODEL_MOE");
  REQUIRE_FIXTURE(dense, "DDTREE_TEST_MODEL_DENSE");
  {
    TempDir tmp("garbage");
    test::copy_dir(dense, tmp.path);
    std::ofstream(tmp.path / "model.safetensors", std::ios::binary | std::ios::trunc) << std::string(64, '\x7f');
    expect_load_error(tmp.path, {"model.safetensors"});
  }
  {
    TempDir tmp("hdrjson");
    test::copy_dir(dense, tmp.path);
    std::string bad = "{\"a\": [1, 2";
    std::string bytes(8, '\0');
    bytes[0] = char(bad.size());
    std::ofstream(tmp.path / "model.safetensors", std::ios::binary | std::ios::trunc) << bytes << bad;
    expect_load_error(tmp.path, {"model.safetensors", "not valid JSON"});
  }
  {
    // A shape whose element count wraps 64-bit arithmetic to 1 (274177 x 67280421310721 = 2^64 + 1) with
    // 4 data bytes: refused before any read (it once passed the size check and overflowed read_f32).
    TempDir tmp("overflow");
    test::copy_dir(dense, tmp.path);
    std::string hdr = "{\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [274177, 67280421310721], "
                      "\"data_offsets\": [0, 4]}}";
    std::string bytes(8, '\0');
    bytes[0] = char(hdr.size() & 0xFF);
    bytes[1] = char(hdr.size() >> 8);
    std::ofstream(tmp.path / "model.safetensors", std::ios::binary | std::ios::trunc) << bytes << hdr
                                                                                       << std::string(4, '\0');
    expect_load_error(tmp.path, {"model.safetensors", "overflows"});
  }
  {
    TempDir tmp("index_file");
    test::copy_dir(moe, tmp.path);
    const fs::path f = shard_of(tmp.path, "model.norm.weight");
    fs::remove(f);
    expect_load_error(tmp.path, {f.filename().string(), "does not exist"});
  }
  {
    TempDir tmp("index_json");
    test::copy_dir(moe, tmp.path);
    std::ofstream(tmp.path / "model.safetensors.index.json", std::ios::trunc) << "{\"weight_map\": ";
    expect_load_error(tmp.path, {"model.safetensors.index.json", "not valid JSON"});
  }
  {
    TempDir tmp("nofiles");
    test::copy_dir(dense, tmp.path);
    fs::remove(tmp.path / "model.safetensors");
    expect_load_error(tmp.path, {"no model.safetensors"});
  }
}

TEST(Checkpoint, BadConfig) {
  REQUIRE_FIXTURE(dense, "DDTREE_TEST_MODEL_DENSE");
  {
    TempDir tmp("cfgjson");
    test::copy_dir(dense, tmp.path);
    std::ofstream(tmp.path / "config.json", std::ios::trunc) << "{\"hidden_size\": 192,,}";
    expect_load_error(tmp.path, {"config.json", "not valid JSON"});
  }
  {
    TempDir tmp("cfgval");
    test::copy_dir(dense, tmp.path);
    std::ifstream in(tmp.path / "config.json");
    auto j = nlohmann::json::parse(in);
    j["scoring_func"] = "softmax";
    j["first_k_dense_replace"] = 0;  // make the layers MoE so the scoring function matters
    std::ofstream(tmp.path / "config.json", std::ios::trunc) << j.dump();
    expect_load_error(tmp.path, {"config.json", "scoring_func", "softmax"});
  }
  {
    // A config that disagrees with the weights: the tensor's shape error names both.
    TempDir tmp("cfgdim");
    test::copy_dir(dense, tmp.path);
    std::ifstream in(tmp.path / "config.json");
    auto j = nlohmann::json::parse(in);
    j["intermediate_size"] = 256;
    std::ofstream(tmp.path / "config.json", std::ios::trunc) << j.dump();
    expect_load_error(tmp.path, {"model.layers.0.mlp.gate_proj.weight", "shape [512, 192]", "expected [256, 192]"});
  }
}

TEST(Checkpoint, WriterRoundTrip) {
  TempDir tmp("writer");
  SafetensorsWriter w;
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.125f};
  const std::vector<int32_t> b = {7, 8, 9};
  w.add_f32("a", {2, 3}, a.data());
  w.add_i32("b", {3}, b.data());
  std::vector<uint16_t> h;
  for (float x : a) h.push_back(f32_to_bf16(x));
  w.add("c", StDType::kBF16, {3, 2}, h.data(), h.size() * 2);
  w.write(tmp.path / "model.safetensors");
  Checkpoint ck(tmp.path);
  EXPECT_EQ(ck.read_f32("a", {2, 3}), a);
  EXPECT_EQ(ck.read_f32("a", {2, 3}, 1, 2, 1, 3), (std::vector<float>{7.0f, -0.125f}));
  EXPECT_EQ(ck.read_f32("c", {3, 2}, 0, 3, 1, 2), (std::vector<float>{-2.0f, 0.0f, -0.125f}));
  EXPECT_EQ(ck.get("b").dtype, StDType::kI32);
  EXPECT_THROW(ck.read_f32("b", {3}), CheckpointError);  // I32 is not a weight dtype
}

}  // namespace
}  // namespace ddtree::model
