// MpiComm: the Comm interface (comm.h) over MPI on host buffers. It is the cpu backend's communicator and
// the bootstrap / control channel of every backend (NCCL unique id, config agreement, step plans, abort).
//
// Determinism (FIDELITY.md rule E): kSum, and kMax on floating point, never use MPI's reductions, whose
// combination order is unspecified (it changes with the algorithm Open MPI picks for a message size and may
// differ between ranks). Instead every rank all-gathers all ranks' inputs into a scratch buffer and folds
// them itself in rank order, ((in_0 op in_1) op in_2) ..., so every rank runs the same arithmetic on the
// same operands and gets the bitwise-same result. The price is size() times the traffic and memory of a
// ring all-reduce (bounded by chunking, MpiCommOptions::max_scratch_bytes), acceptable on the cpu backend,
// which runs correctness tests on small models; the cuda backend reduces with NCCL. Integer max is exact
// and independent of order, so it uses MPI_MAX.
//
// Errors: every communicator MpiComm owns has MPI_ERRORS_RETURN, and every MPI call goes through
// DDTREE_MPI_CHECK, so a transport failure becomes a CommError on the rank that saw it. The other ranks may
// still be waiting inside the collective: whoever catches a CommError in the engine must end the job with
// abort() (the rank's main and the step watchdog do), never carry on.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "rank/comm/comm.h"
#include "rank/comm/mpi_check.h"

#include "ddtree_build_id.h"  // generated at build time (cmake/build_id.cmake): DDTREE_BUILD_ID

namespace ddtree {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU64: return 8;
    case DType::kU8: return 1;
  }
  throw CommError("dtype_size: invalid DType " + std::to_string(static_cast<int>(t)));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU64: return "u64";
    case DType::kU8: return "u8";
  }
  return "invalid";  // used in messages, so it never throws
}

const char* build_id() { return DDTREE_BUILD_ID; }

const char* mpi_thread_level_name(MpiThreadLevel level) {
  switch (level) {
    case MpiThreadLevel::kSingle: return "MPI_THREAD_SINGLE";
    case MpiThreadLevel::kFunneled: return "MPI_THREAD_FUNNELED";
    case MpiThreadLevel::kSerialized: return "MPI_THREAD_SERIALIZED";
    case MpiThreadLevel::kMultiple: return "MPI_THREAD_MULTIPLE";
  }
  return "invalid";
}

namespace {

bool mpi_is_live() {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  return initialised && !finalised;
}

}  // namespace

MpiThreadLevel mpi_thread_level() {
  if (!mpi_is_live()) throw CommError("mpi_thread_level: MPI is not initialised (or already finalised)");
  int provided = MPI_THREAD_SINGLE;
  DDTREE_MPI_CHECK(MPI_Query_thread(&provided));
  // The MPI_THREAD_* constants are only guaranteed to be ordered, not to have these values.
  if (provided == MPI_THREAD_MULTIPLE) return MpiThreadLevel::kMultiple;
  if (provided == MPI_THREAD_SERIALIZED) return MpiThreadLevel::kSerialized;
  if (provided == MPI_THREAD_FUNNELED) return MpiThreadLevel::kFunneled;
  return MpiThreadLevel::kSingle;
}

namespace detail {

void throw_mpi_error(int rc, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING + 1] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) {
    std::snprintf(text, sizeof text, "unknown MPI error code %d", rc);
  }
  int error_class = -1;
  if (MPI_Error_class(rc, &error_class) != MPI_SUCCESS) error_class = -1;
  int world_rank = -1;
  if (mpi_is_live()) MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  throw CommError(std::string(call) + " failed at " + file + ":" + std::to_string(line) + " on rank " +
                  std::to_string(world_rank) + ": " + text + " (MPI error class " +
                  std::to_string(error_class) + ")");
}

}  // namespace detail

namespace {

// Process-wide MPI lifetime, shared by all MpiComm objects (MPI can be initialised and finalised once).
std::mutex g_lifetime_mutex;
int g_live_comms = 0;           // MpiComm objects alive now
bool g_we_initialised = false;  // make_mpi_comm called MPI_Init_thread: the last MpiComm to go finalises

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI64: return MPI_INT64_T;
    case DType::kU64: return MPI_UINT64_T;
    case DType::kU8: return MPI_UINT8_T;
  }
  throw CommError("invalid DType " + std::to_string(static_cast<int>(t)));
}

bool is_float(DType t) { return t == DType::kF32 || t == DType::kF64; }

// Elementwise max for floating point that is deterministic and never hides a problem:
// - NaN wins: if any rank holds NaN the result is NaN, the first NaN in rank order, payload kept;
// - +0 beats -0 (a plain `a > b ? a : b` would return whichever zero came first).
// Apart from NaN payloads the result is therefore independent of the order of the operands.
template <class T>
T max_nan_wins(T a, T b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  if (a == b) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}

// out[i] = ((in[0][i] op in[1][i]) op in[2][i]) ... for i < n, where in is `size` consecutive blocks of n
// elements (rank r's block at r * n, as MPI_Allgather leaves them). out must not overlap in.
template <class T, class Op>
void fold_rank_order(const std::byte* in_bytes, std::size_t n, int size, void* out_bytes, Op op) {
  const T* in = reinterpret_cast<const T*>(in_bytes);
  T* out = static_cast<T*>(out_bytes);
  std::memcpy(out, in, n * sizeof(T));
  for (int r = 1; r < size; ++r) {
    const T* block = in + static_cast<std::size_t>(r) * n;
    for (std::size_t i = 0; i < n; ++i) out[i] = op(out[i], block[i]);
  }
}

// Integer sums wrap (two's complement) like MPI_SUM does in practice; computed in the unsigned type of the
// same width, since signed overflow is undefined in C++.
template <class U>
U wrapping_add(U a, U b) {
  return static_cast<U>(a + b);
}

void fold(DType dt, ReduceOp op, const std::byte* in, std::size_t n, int size, void* out) {
  if (op == ReduceOp::kSum) {
    switch (dt) {
      case DType::kF32:
        return fold_rank_order<float>(in, n, size, out, [](float a, float b) { return a + b; });
      case DType::kF64:
        return fold_rank_order<double>(in, n, size, out, [](double a, double b) { return a + b; });
      case DType::kI32: return fold_rank_order<std::uint32_t>(in, n, size, out, wrapping_add<std::uint32_t>);
      case DType::kI64: return fold_rank_order<std::uint64_t>(in, n, size, out, wrapping_add<std::uint64_t>);
      case DType::kU64: return fold_rank_order<std::uint64_t>(in, n, size, out, wrapping_add<std::uint64_t>);
      case DType::kU8: return fold_rank_order<std::uint8_t>(in, n, size, out, wrapping_add<std::uint8_t>);
    }
  } else if (op == ReduceOp::kMax) {
    switch (dt) {
      case DType::kF32: return fold_rank_order<float>(in, n, size, out, max_nan_wins<float>);
      case DType::kF64: return fold_rank_order<double>(in, n, size, out, max_nan_wins<double>);
      default: break;  // integer max goes through MPI_MAX (all_reduce)
    }
  }
  throw CommError(std::string("all_reduce: no fold for ") + dtype_name(dt) + " op " +
                  std::to_string(static_cast<int>(op)));
}

// A receive type for one chunk of a block layout: n elements of `base`, with an extent of `stride_bytes`, so
// that receiving 1 of it from each rank puts rank r's piece at r * stride_bytes. Used when count is too long
// for one MPI call (MPI counts and displacements are int; extents are MPI_Aint, 64 bits).
class ChunkType {
 public:
  ChunkType(int n, MPI_Datatype base, MPI_Aint stride_bytes) {
    MPI_Datatype contiguous = MPI_DATATYPE_NULL;
    DDTREE_MPI_CHECK(MPI_Type_contiguous(n, base, &contiguous));
    const int rc = MPI_Type_create_resized(contiguous, 0, stride_bytes, &type_);
    MPI_Type_free(&contiguous);
    DDTREE_MPI_CHECK(rc);
    DDTREE_MPI_CHECK(MPI_Type_commit(&type_));
  }
  ~ChunkType() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }
  ChunkType(const ChunkType&) = delete;
  ChunkType& operator=(const ChunkType&) = delete;
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

// Printable, bounded rendering of a fingerprint for error messages.
std::string quote(std::string_view s) {
  constexpr std::size_t kMaxShown = 240;
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size() && i < kMaxShown; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  out += '"';
  if (s.size() > kMaxShown)
    out += " (" + std::to_string(s.size()) + " bytes, first " + std::to_string(kMaxShown) + " shown)";
  return out;
}

class MpiComm final : public Comm {
 public:
  MpiComm(int* argc, char*** argv, const MpiCommOptions& options) {
    // Checked before any MPI call: every rank passes the same options, so every rank throws.
    if (options.max_scratch_bytes == 0) throw CommError("make_mpi_comm: max_scratch_bytes must be > 0");
    if (options.max_message_count == 0 || options.max_message_count > static_cast<std::size_t>(INT_MAX)) {
      throw CommError("make_mpi_comm: max_message_count must be in [1, 2^31 - 1], got " +
                      std::to_string(options.max_message_count));
    }
    max_scratch_bytes_ = options.max_scratch_bytes;
    max_message_count_ = options.max_message_count;

    std::lock_guard<std::mutex> lock(g_lifetime_mutex);
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (finalised) throw CommError("make_mpi_comm: MPI has already been finalised in this process");
    if (!initialised) {
      int provided = MPI_THREAD_SINGLE;
      // Asks for MULTIPLE (a background thread may send the next step plan on its own Comm while the main
      // thread runs collectives) and accepts what MPI provides: mpi_thread_level() reports it.
      DDTREE_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
      g_we_initialised = true;
    }
    // Bootstrap calls use MPI_COMM_WORLD's handler (by default: an error ends the job with MPI's message).
    DDTREE_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    ++g_live_comms;  // from here the destructor frees comm_ and may finalise
    try {
      DDTREE_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
      DDTREE_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
      DDTREE_MPI_CHECK(MPI_Comm_size(comm_, &size_));
      MPI_Comm node = MPI_COMM_NULL;
      DDTREE_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
      const int rc_rank = MPI_Comm_rank(node, &local_rank_);
      const int rc_size = MPI_Comm_size(node, &local_size_);
      MPI_Comm_free(&node);
      DDTREE_MPI_CHECK(rc_rank);
      DDTREE_MPI_CHECK(rc_size);
    } catch (...) {
      release_locked();
      throw;
    }
  }

  ~MpiComm() override {
    std::lock_guard<std::mutex> lock(g_lifetime_mutex);
    release_locked();
  }

  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }

  void broadcast(void* buf, std::size_t count, DType dt, int root) override {
    const std::size_t es = dtype_size(dt);
    check_root(root, "broadcast");
    check_buffer(buf, count, "broadcast", "buf");
    auto* p = static_cast<std::byte*>(buf);
    for (std::size_t off = 0; off < count; off += max_message_count_) {
      const int n = static_cast<int>(std::min(max_message_count_, count - off));
      DDTREE_MPI_CHECK(MPI_Bcast(p + off * es, n, mpi_type(dt), root, comm_));
    }
  }

  void all_reduce(const void* sendbuf, void* recvbuf, std::size_t count, DType dt, ReduceOp op) override {
    const std::size_t es = dtype_size(dt);
    if (op != ReduceOp::kSum && op != ReduceOp::kMax) {
      throw CommError("all_reduce: invalid ReduceOp " + std::to_string(static_cast<int>(op)));
    }
    check_buffer(sendbuf, count, "all_reduce", "sendbuf");
    check_buffer(recvbuf, count, "all_reduce", "recvbuf");
    if (count == 0) return;
    const auto* send = static_cast<const std::byte*>(sendbuf);
    auto* recv = static_cast<std::byte*>(recvbuf);
    const bool in_place = sendbuf == recvbuf;

    if (op == ReduceOp::kMax && !is_float(dt)) {
      // Exact and order-independent: MPI's reduction gives the same bits whatever order it combines in.
      for (std::size_t off = 0; off < count; off += max_message_count_) {
        const int n = static_cast<int>(std::min(max_message_count_, count - off));
        DDTREE_MPI_CHECK(MPI_Allreduce(in_place ? MPI_IN_PLACE : send + off * es, recv + off * es, n,
                                       mpi_type(dt), MPI_MAX, comm_));
      }
      return;
    }

    if (size_ == 1) {  // the fold of one operand is the operand
      if (!in_place) std::memcpy(recv, send, count * es);
      return;
    }
    // Chunk of elements per rank per round: scratch holds size_ x chunk elements.
    const std::size_t per_element_all_ranks = static_cast<std::size_t>(size_) * es;
    const std::size_t chunk =
        std::min(max_message_count_, std::max<std::size_t>(1, max_scratch_bytes_ / per_element_all_ranks));
    std::byte* scratch = reserve_scratch(std::min(count, chunk) * per_element_all_ranks);
    for (std::size_t off = 0; off < count; off += chunk) {
      const std::size_t n = std::min(chunk, count - off);
      // sendbuf is read here for [off, off + n) before recvbuf's [off, off + n) is written below, and
      // chunks are disjoint, so sendbuf == recvbuf is safe.
      DDTREE_MPI_CHECK(MPI_Allgather(send + off * es, static_cast<int>(n), mpi_type(dt), scratch,
                                     static_cast<int>(n), mpi_type(dt), comm_));
      fold(dt, op, scratch, n, size_, recv + off * es);
    }
  }

  void all_gather(const void* sendbuf, void* recvbuf, std::size_t count, DType dt) override {
    const std::size_t es = dtype_size(dt);
    check_buffer(sendbuf, count, "all_gather", "sendbuf");
    check_buffer(recvbuf, count, "all_gather", "recvbuf");
    if (count == 0) return;
    const auto* send = static_cast<const std::byte*>(sendbuf);
    auto* recv = static_cast<std::byte*>(recvbuf);
    if (count <= max_message_count_) {
      DDTREE_MPI_CHECK(MPI_Allgather(send, static_cast<int>(count), mpi_type(dt), recv,
                                     static_cast<int>(count), mpi_type(dt), comm_));
      return;
    }
    // Split along count: round k moves elements [off, off + n) of every rank's block, received as one
    // ChunkType per rank whose extent is a whole block, so rank r's piece lands at (r * count + off).
    for (std::size_t off = 0; off < count; off += max_message_count_) {
      const int n = static_cast<int>(std::min(max_message_count_, count - off));
      ChunkType piece(n, mpi_type(dt), static_cast<MPI_Aint>(count * es));
      DDTREE_MPI_CHECK(
          MPI_Allgather(send + off * es, n, mpi_type(dt), recv + off * es, 1, piece.get(), comm_));
    }
  }

  void gather(const void* sendbuf, void* recvbuf, std::size_t count, DType dt, int root) override {
    const std::size_t es = dtype_size(dt);
    check_root(root, "gather");
    check_buffer(sendbuf, count, "gather", "sendbuf");
    const bool is_root = rank_ == root;
    if (is_root) check_buffer(recvbuf, count, "gather", "recvbuf");
    if (count == 0) return;
    const auto* send = static_cast<const std::byte*>(sendbuf);
    auto* recv = static_cast<std::byte*>(recvbuf);
    if (count <= max_message_count_) {
      DDTREE_MPI_CHECK(MPI_Gather(send, static_cast<int>(count), mpi_type(dt), is_root ? recv : nullptr,
                                  static_cast<int>(count), mpi_type(dt), root, comm_));
      return;
    }
    // As in all_gather; the receive arguments only matter on root.
    for (std::size_t off = 0; off < count; off += max_message_count_) {
      const int n = static_cast<int>(std::min(max_message_count_, count - off));
      ChunkType piece(n, mpi_type(dt), static_cast<MPI_Aint>(count * es));
      DDTREE_MPI_CHECK(MPI_Gather(send + off * es, n, mpi_type(dt), is_root ? recv + off * es : nullptr, 1,
                                  piece.get(), root, comm_));
    }
  }

  void barrier() override { DDTREE_MPI_CHECK(MPI_Barrier(comm_)); }

  void check_same_everywhere(const std::string& what, const std::string& fingerprint) override {
    // Round 1: every rank's length; round 2: the strings themselves, back to back in rank order.
    const std::uint64_t length = fingerprint.size();
    std::vector<std::uint64_t> lengths(static_cast<std::size_t>(size_));
    DDTREE_MPI_CHECK(MPI_Allgather(&length, 1, MPI_UINT64_T, lengths.data(), 1, MPI_UINT64_T, comm_));
    std::vector<int> counts(lengths.size()), offsets(lengths.size());
    std::uint64_t total = 0;
    for (std::size_t r = 0; r < lengths.size(); ++r) {
      if (lengths[r] > static_cast<std::uint64_t>(INT_MAX) ||
          total + lengths[r] > static_cast<std::uint64_t>(INT_MAX)) {
        // Every rank sees the same lengths, so every rank throws here.
        throw CommError("check_same_everywhere(" + what + "): fingerprints too long (rank " +
                        std::to_string(r) + ": " + std::to_string(lengths[r]) + " bytes)");
      }
      counts[r] = static_cast<int>(lengths[r]);
      offsets[r] = static_cast<int>(total);
      total += lengths[r];
    }
    std::string all(static_cast<std::size_t>(total), '\0');
    DDTREE_MPI_CHECK(MPI_Allgatherv(fingerprint.data(), static_cast<int>(length), MPI_BYTE, all.data(),
                                    counts.data(), offsets.data(), MPI_BYTE, comm_));
    const std::string_view reference(all.data(), lengths[0]);
    int first_different = -1, n_different = 0;
    for (int r = 1; r < size_; ++r) {
      if (std::string_view(all.data() + offsets[r], lengths[r]) != reference) {
        if (first_different < 0) first_different = r;
        ++n_different;
      }
    }
    if (first_different < 0) return;
    // Every rank has the same gathered strings, so every rank throws the same error: nobody is left
    // waiting in a later collective.
    const std::string_view theirs(all.data() + offsets[first_different], lengths[first_different]);
    throw CommError("check_same_everywhere(" + what + "): rank " + std::to_string(first_different) + " has " +
                    quote(theirs) + " but rank 0 has " + quote(reference) + " (" +
                    std::to_string(n_different) + " of " + std::to_string(size_) +
                    " ranks differ from rank 0)");
  }

  [[noreturn]] void abort(int exit_code, const std::string& why) override {
    if (exit_code == 0) exit_code = 1;  // an abort must never look like success
    std::fflush(stdout);
    std::fprintf(stderr, "[ddtree rank %d] fatal: %s\n", rank_, why.c_str());
    std::fflush(stderr);
    // MPI_COMM_WORLD, not comm_: the whole job ends, including ranks that never made an MpiComm.
    if (mpi_is_live()) MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this is for a process without live MPI
  }

 private:
  void check_root(int root, const char* call) const {
    if (root < 0 || root >= size_) {
      throw CommError(std::string(call) + ": root " + std::to_string(root) + " out of range [0, " +
                      std::to_string(size_) + ")");
    }
  }

  static void check_buffer(const void* p, std::size_t count, const char* call, const char* name) {
    if (p == nullptr && count > 0) {
      throw CommError(std::string(call) + ": " + name + " is null with count " + std::to_string(count));
    }
  }

  // Scratch for all_reduce, kept between calls (the engine reduces the same shapes every step) and only
  // ever as large as the largest call needed, at most max_scratch_bytes_ (or one element per rank).
  std::byte* reserve_scratch(std::size_t bytes) {
    if (bytes > scratch_bytes_) {
      scratch_.reset(static_cast<std::byte*>(::operator new (bytes, std::align_val_t{64})));
      scratch_bytes_ = bytes;
    }
    return scratch_.get();
  }

  // Frees comm_ and finalises MPI if this was the last MpiComm and make_mpi_comm initialised MPI.
  // Caller holds g_lifetime_mutex. Never throws (runs in the destructor).
  void release_locked() noexcept {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (!finalised && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
    if (--g_live_comms == 0 && g_we_initialised && !finalised) {
      MPI_Finalize();
      g_we_initialised = false;
    }
  }

  struct AlignedDelete {
    void operator()(std::byte* p) const { ::operator delete (p, std::align_val_t{64}); }
  };

  MPI_Comm comm_ = MPI_COMM_NULL;  // our duplicate of MPI_COMM_WORLD, MPI_ERRORS_RETURN
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::size_t max_scratch_bytes_ = 0;  // bytes
  std::size_t max_message_count_ = 0;  // elements per MPI call
  std::unique_ptr<std::byte, AlignedDelete> scratch_;
  std::size_t scratch_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(int* argc, char*** argv, const MpiCommOptions& options) {
  return std::make_unique<MpiComm>(argc, argv, options);
}

std::unique_ptr<Comm> make_mpi_comm(int* argc, char*** argv) {
  return make_mpi_comm(argc, argv, MpiCommOptions{});
}

}  // namespace ddtree
