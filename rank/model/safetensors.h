// Safetensors: a memory-mapped reader (one file, or a sharded checkpoint with model.safetensors.index.json)
// and a small writer (the teacher-forced dump tool and the tests' corrupted checkpoints).
//
// File format: u64 little-endian header length N, N bytes of JSON {name: {"dtype", "shape", "data_offsets":
// [begin, end)}, "__metadata__": {...}}, then the data section; offsets are relative to its start.
// Everything a file claims is checked against the file before any byte is read: dtype known, offsets
// inside the file (a truncated file names the first tensor that does not fit), end - begin equal to
// numel x dtype size. Errors are CheckpointError with the file and the tensor in the message.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddtree::model {

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class StDType { kF32, kBF16, kF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool, kF8E4M3, kF8E5M2, kOther };
const char* st_dtype_name(StDType t);
std::size_t st_dtype_size(StDType t);

struct TensorInfo {
  std::string name;
  std::string dtype_str;        // as written in the file ("BF16", ...)
  StDType dtype = StDType::kOther;
  std::vector<int64_t> shape;
  const unsigned char* data = nullptr;  // inside the mapping
  std::size_t nbytes = 0;
  int64_t numel() const;
  std::string shape_str() const;
};

// One memory-mapped .safetensors file. Movable, not copyable; the mapping lives as long as the object.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const TensorInfo* find(const std::string& name) const;  // nullptr if absent
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }

 private:
  std::filesystem::path path_;
  void* map_ = nullptr;
  std::size_t size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
};

// A checkpoint directory: model.safetensors.index.json (weight_map name -> file) if present, else
// model.safetensors. Files are opened (mapped) when the checkpoint is opened, so missing or corrupt shards
// fail early with their name.
class Checkpoint {
 public:
  explicit Checkpoint(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  bool has(const std::string& name) const;
  // The tensor, or a CheckpointError naming it and where it was looked for.
  const TensorInfo& get(const std::string& name) const;
  // The file a tensor lives in (for messages).
  std::string file_of(const std::string& name) const;

  // Reads a 1-D or 2-D tensor, checks its full shape against `shape` and returns rows [r0, r1) x
  // cols [c0, c1) (1-D: elements [r0, r1)) as fp32. bf16 / f16 widen exactly; f32 is copied.
  // c1 < 0 / r1 < 0 mean "to the end".
  std::vector<float> read_f32(const std::string& name, const std::vector<int64_t>& shape, int64_t r0 = 0,
                              int64_t r1 = -1, int64_t c0 = 0, int64_t c1 = -1) const;

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;  // tensor name -> file
  std::string layout_;  // "index" or "single": for messages
};

// Writer: tensors in insertion order, fp32 / bf16 / i32 payloads given as raw little-endian bytes.
class SafetensorsWriter {
 public:
  void add(const std::string& name, StDType dtype, const std::vector<int64_t>& shape, const void* data,
           std::size_t nbytes);
  void add_f32(const std::string& name, const std::vector<int64_t>& shape, const float* data);
  void add_i32(const std::string& name, const std::vector<int64_t>& shape, const int32_t* data);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  void write(const std::filesystem::path& path) const;  // throws CheckpointError on I/O failure

 private:
  struct Entry {
    std::string name;
    StDType dtype;
    std::vector<int64_t> shape;
    std::vector<unsigned char> bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// bf16 <-> f32 (round to nearest even; NaN stays NaN).
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

}  // namespace ddtree::model
