// Safetensors reader (mmap) and writer. See safetensors.h.
#include "rank/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace ddtree::model {
namespace {

using json = nlohmann::json;

StDType parse_dtype(const std::string& s) {
  static const std::map<std::string, StDType> m = {
      {"F32", StDType::kF32},   {"BF16", StDType::kBF16}, {"F16", StDType::kF16},
      {"F64", StDType::kF64},   {"I64", StDType::kI64},   {"I32", StDType::kI32},
      {"I16", StDType::kI16},   {"I8", StDType::kI8},     {"U8", StDType::kU8},
      {"BOOL", StDType::kBool}, {"F8_E4M3", StDType::kF8E4M3}, {"F8_E5M2", StDType::kF8E5M2}};
  auto it = m.find(s);
  return it == m.end() ? StDType::kOther : it->second;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

float bf16_to_f32(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t((bits + rounding) >> 16);
}

const char* st_dtype_name(StDType t) {
  switch (t) {
    case StDType::kF32: return "F32";
    case StDType::kBF16: return "BF16";
    case StDType::kF16: return "F16";
    case StDType::kF64: return "F64";
    case StDType::kI64: return "I64";
    case StDType::kI32: return "I32";
    case StDType::kI16: return "I16";
    case StDType::kI8: return "I8";
    case StDType::kU8: return "U8";
    case StDType::kBool: return "BOOL";
    case StDType::kF8E4M3: return "F8_E4M3";
    case StDType::kF8E5M2: return "F8_E5M2";
    default: return "?";
  }
}

std::size_t st_dtype_size(StDType t) {
  switch (t) {
    case StDType::kF64: case StDType::kI64: return 8;
    case StDType::kF32: case StDType::kI32: return 4;
    case StDType::kBF16: case StDType::kF16: case StDType::kI16: return 2;
    case StDType::kI8: case StDType::kU8: case StDType::kBool: case StDType::kF8E4M3: case StDType::kF8E5M2: return 1;
    default: return 0;
  }
}

// Element count; -1 when the product overflows int64 (a corrupt or hostile header).
int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return -1;
  return n;
}

std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

static std::string shape_str(const std::vector<int64_t>& shape) {
  TensorInfo t;
  t.shape = shape;
  return t.shape_str();
}

// ---------------------------------------------------------------- SafetensorsFile

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  const std::string p = path.string();
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(p + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw CheckpointError(p + ": cannot stat: " + std::strerror(errno));
  }
  size_ = std::size_t(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    throw CheckpointError(p + ": truncated: " + std::to_string(size_) + " bytes, not even the 8-byte header length");
  }
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw CheckpointError(p + ": mmap failed: " + std::strerror(errno));
  }
  try {
    const auto* base = static_cast<const unsigned char*>(map_);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | base[i];
    if (hlen > size_ - 8)
      throw CheckpointError(p + ": truncated or not a safetensors file: header claims " + std::to_string(hlen) +
                            " bytes, the file has " + std::to_string(size_ - 8) + " after the length");
    json header;
    try {
      header = json::parse(base + 8, base + 8 + hlen);
    } catch (const json::parse_error& e) {
      throw CheckpointError(p + ": header is not valid JSON: " + e.what());
    }
    if (!header.is_object()) throw CheckpointError(p + ": header is not a JSON object");
    const unsigned char* data = base + 8 + hlen;
    const std::size_t data_size = size_ - 8 - std::size_t(hlen);
    for (const auto& [name, v] : header.items()) {
      if (name == "__metadata__") continue;
      const std::string where = p + ": tensor " + name;
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
        throw CheckpointError(where + ": header entry lacks dtype / shape / data_offsets");
      TensorInfo t;
      t.name = name;
      if (!v["dtype"].is_string()) throw CheckpointError(where + ": dtype is not a string");
      t.dtype_str = v["dtype"].get<std::string>();
      t.dtype = parse_dtype(t.dtype_str);
      if (!v["shape"].is_array()) throw CheckpointError(where + ": shape is not a list");
      for (const auto& d : v["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0) throw CheckpointError(where + ": bad shape " + v["shape"].dump());
        t.shape.push_back(d.get<int64_t>());
      }
      const auto& off = v["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        throw CheckpointError(where + ": bad data_offsets " + off.dump());
      const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
      if (e < b) throw CheckpointError(where + ": data_offsets end before begin");
      if (e > data_size)
        throw CheckpointError(p + ": truncated: tensor " + name + " needs bytes [" + std::to_string(b) + ", " +
                              std::to_string(e) + ") of the data section, which has only " +
                              std::to_string(data_size) + " bytes");
      const std::size_t esz = st_dtype_size(t.dtype);
      uint64_t need = 0;
      if (t.numel() < 0 || __builtin_mul_overflow(uint64_t(t.numel()), uint64_t(esz), &need))
        throw CheckpointError(where + ": shape " + t.shape_str() + " overflows 64-bit sizes");
      if (esz != 0 && need != e - b)
        throw CheckpointError(where + ": " + std::to_string(e - b) + " bytes for shape " + t.shape_str() + " of " +
                              t.dtype_str + " (expected " + std::to_string(uint64_t(t.numel()) * esz) + ")");
      t.data = data + b;
      t.nbytes = std::size_t(e - b);
      tensors_.emplace(name, std::move(t));
    }
  } catch (...) {
    ::munmap(map_, size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

// ---------------------------------------------------------------- Checkpoint

Checkpoint::Checkpoint(const std::filesystem::path& dir) : dir_(dir) {
  const auto index = dir / "model.safetensors.index.json";
  const auto single = dir / "model.safetensors";
  if (std::filesystem::exists(index)) {
    layout_ = "index";
    std::ifstream f(index, std::ios::binary);
    if (!f) throw CheckpointError(index.string() + ": cannot open");
    json j;
    try {
      j = json::parse(f);
    } catch (const json::parse_error& e) {
      throw CheckpointError(index.string() + ": not valid JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw CheckpointError(index.string() + ": no \"weight_map\" object");
    std::map<std::string, const SafetensorsFile*> by_file;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) throw CheckpointError(index.string() + ": weight_map[" + name + "] is not a file name");
      const std::string fn = file.get<std::string>();
      if (fn.find('/') != std::string::npos || fn == ".." || fn.empty())
        throw CheckpointError(index.string() + ": weight_map[" + name + "] = '" + fn + "' is not a plain file name");
      auto it = by_file.find(fn);
      if (it == by_file.end()) {
        const auto path = dir / fn;
        if (!std::filesystem::exists(path))
          throw CheckpointError(index.string() + ": tensor " + name + " maps to " + fn + ", which does not exist in " +
                                dir.string());
        files_.push_back(std::make_unique<SafetensorsFile>(path));
        it = by_file.emplace(fn, files_.back().get()).first;
      }
      if (!it->second->find(name))
        throw CheckpointError(index.string() + ": tensor " + name + " maps to " + fn + ", which does not contain it");
      where_[name] = it->second;
    }
  } else if (std::filesystem::exists(single)) {
    layout_ = "single";
    files_.push_back(std::make_unique<SafetensorsFile>(single));
    for (const auto& [name, t] : files_.back()->tensors()) where_[name] = files_.back().get();
  } else {
    throw CheckpointError(dir.string() + ": no model.safetensors.index.json and no model.safetensors");
  }
}

bool Checkpoint::has(const std::string& name) const { return where_.count(name) != 0; }

const TensorInfo& Checkpoint::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end())
    throw CheckpointError(dir_.string() + ": tensor " + name + " missing (looked in " +
                          (layout_ == "index" ? std::string("model.safetensors.index.json") : std::string("model.safetensors")) + ")");
  return *it->second->find(name);
}

std::string Checkpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? dir_.string() : it->second->path().string();
}

std::vector<float> Checkpoint::read_f32(const std::string& name, const std::vector<int64_t>& shape, int64_t r0,
                                        int64_t r1, int64_t c0, int64_t c1) const {
  const TensorInfo& t = get(name);
  const std::string where = file_of(name) + ": tensor " + name;
  if (t.dtype != StDType::kF32 && t.dtype != StDType::kBF16 && t.dtype != StDType::kF16)
    throw CheckpointError(where + ": dtype " + t.dtype_str + " is not supported (supported: BF16, F16, F32)");
  if (t.shape != shape)
    throw CheckpointError(where + ": shape " + t.shape_str() + ", expected " + shape_str(shape));
  if (shape.empty() || shape.size() > 2) throw CheckpointError(where + ": only 1-D and 2-D tensors are read");
  const int64_t rows = shape[0], cols = shape.size() == 2 ? shape[1] : 1;
  if (r1 < 0) r1 = rows;
  if (c1 < 0) c1 = cols;
  if (r0 < 0 || r0 > r1 || r1 > rows || c0 < 0 || c0 > c1 || c1 > cols)
    throw CheckpointError(where + ": slice rows [" + std::to_string(r0) + ", " + std::to_string(r1) + ") cols [" +
                          std::to_string(c0) + ", " + std::to_string(c1) + ") outside " + t.shape_str());
  std::vector<float> out(std::size_t((r1 - r0) * (c1 - c0)));
  std::size_t k = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const std::size_t base = std::size_t(r * cols);
    for (int64_t c = c0; c < c1; ++c, ++k) {
      const std::size_t i = base + std::size_t(c);
      if (t.dtype == StDType::kF32) {
        float v;
        std::memcpy(&v, t.data + 4 * i, 4);
        out[k] = v;
      } else {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        out[k] = t.dtype == StDType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------- writer

void SafetensorsWriter::add(const std::string& name, StDType dtype, const std::vector<int64_t>& shape,
                            const void* data, std::size_t nbytes) {
  Entry e{name, dtype, shape, {}};
  e.bytes.resize(nbytes);
  if (nbytes) std::memcpy(e.bytes.data(), data, nbytes);
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::add_f32(const std::string& name, const std::vector<int64_t>& shape, const float* data) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  add(name, StDType::kF32, shape, data, std::size_t(n) * 4);
}

void SafetensorsWriter::add_i32(const std::string& name, const std::vector<int64_t>& shape, const int32_t* data) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  add(name, StDType::kI32, shape, data, std::size_t(n) * 4);
}

void SafetensorsWriter::write(const std::filesystem::path& path) const {
  json header = json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  std::size_t off = 0;
  for (const auto& e : entries_) {
    header[e.name] = {{"dtype", st_dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {off, off + e.bytes.size()}}};
    off += e.bytes.size();
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8) h.push_back(' ');  // align the data section to 8 bytes
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw CheckpointError(path.string() + ": cannot open for writing");
  unsigned char len[8];
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) len[i] = (unsigned char)((n >> (8 * i)) & 0xff);
  f.write(reinterpret_cast<const char*>(len), 8);
  f.write(h.data(), std::streamsize(h.size()));
  for (const auto& e : entries_) f.write(reinterpret_cast<const char*>(e.bytes.data()), std::streamsize(e.bytes.size()));
  if (!f) throw CheckpointError(path.string() + ": write failed");
}

}  // namespace ddtree::model
