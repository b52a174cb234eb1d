// Comm: the collective interface every rank uses (ARCHITECTURE.md "Backends and communicators").
//
// Implementations: MPI on host buffers (this file's MpiComm, the cpu backend), NCCL on device buffers and
// MPI with host staging for cuda buffers (later). The engine above this seam is identical for all of them.
//
// Determinism (FIDELITY.md rule E): every reduction is defined as a fold in rank order,
//   out = ((in_0 op in_1) op in_2) ... op in_{n-1},
// and every rank receives the bitwise-same result, whatever the transport does internally.
// All calls are collective: every rank calls them in the same order with the same count and dtype.
// Errors (mismatched sizes the implementation can see, transport failures) throw CommError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace ddtree {

enum class DType : int { kF32 = 0, kF64 = 1, kI32 = 2, kI64 = 3, kU64 = 4, kU8 = 5 };
std::size_t dtype_size(DType t);
const char* dtype_name(DType t);

enum class ReduceOp : int {
  kSum = 0,  // fold in rank order (floating point: bitwise reproducible, identical on every rank)
  kMax = 1,  // elementwise max; with kU64 this is the max over packed 64-bit keys (argmax across shards)
};

class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Ranks on this node and this rank's index among them (device = local_rank on the cuda backend).
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;

  // buf[count] on `root` is copied to every rank's buf.
  virtual void broadcast(void* buf, std::size_t count, DType dt, int root) = 0;
  // sendbuf[count] from every rank -> recvbuf[count] on every rank, reduced by `op` in rank order.
  // sendbuf may equal recvbuf (in place).
  virtual void all_reduce(const void* sendbuf, void* recvbuf, std::size_t count, DType dt, ReduceOp op) = 0;
  // sendbuf[count] from every rank -> recvbuf[size() * count] on every rank, rank r's block at r * count.
  virtual void all_gather(const void* sendbuf, void* recvbuf, std::size_t count, DType dt) = 0;
  // sendbuf[count] from every rank -> recvbuf[size() * count] on `root` (recvbuf ignored elsewhere).
  virtual void gather(const void* sendbuf, void* recvbuf, std::size_t count, DType dt, int root) = 0;
  virtual void barrier() = 0;

  // Checks that every rank runs the same build and configuration: `fingerprint` (for example the build id
  // plus a hash of the model config and engine flags) must be equal on all ranks. Throws CommError naming
  // the first rank that differs and both values.
  virtual void check_same_everywhere(const std::string& what, const std::string& fingerprint) = 0;

  // Ends the whole job from any rank (a dead or failing rank must never leave the others hanging).
  [[noreturn]] virtual void abort(int exit_code, const std::string& why) = 0;
};

// The build id compiled into this binary (git revision, version, backend set): part of every fingerprint.
const char* build_id();

// MPI on host buffers. Calls MPI_Init_thread (MPI_THREAD_MULTIPLE) if MPI is not initialised yet and
// MPI_Finalize on destruction if it initialised it. A single process without mpirun is a world of size 1.
// Each MpiComm works on its own duplicate of MPI_COMM_WORLD, so several may coexist, independent of each
// other (for example one for a background thread, given mpi_thread_level() == kMultiple). If make_mpi_comm
// initialised MPI, MPI is finalised when the last MpiComm alive goes away. One MpiComm must be used by one
// thread at a time: collectives on it must come in the same order on every rank.
// Buffers are host memory, naturally aligned for their dtype; sendbuf and recvbuf are either the same
// pointer (all_reduce only) or do not overlap. A null buffer is allowed where count is 0.
std::unique_ptr<Comm> make_mpi_comm(int* argc, char*** argv);

// Bounds of MpiComm's internal buffers and messages. The defaults are what the engine uses; tests lower
// them to exercise the chunked paths with small buffers. Every rank must pass the same options.
struct MpiCommOptions {
  // all_reduce (kSum, and kMax on floats) all-gathers every rank's input into a scratch buffer of
  // size() x chunk elements and folds it in rank order; the chunk is chosen so the scratch stays within
  // this many bytes (but is at least one element per rank). Bytes; must be > 0.
  std::size_t max_scratch_bytes = std::size_t{64} << 20;
  // Most elements handed to one MPI call (MPI counts are int); longer calls are split. In [1, 2^31 - 1].
  std::size_t max_message_count = 2147483647;
};
std::unique_ptr<Comm> make_mpi_comm(int* argc, char*** argv, const MpiCommOptions& options);

// The thread support MPI provides in this process (MPI_Query_thread). make_mpi_comm asks for kMultiple
// and accepts less: with less than kMultiple, only one thread may call into MPI at a time (kSerialized)
// or only the thread that initialised it (kFunneled, kSingle), whichever Comm object it uses.
// Throws CommError when MPI is not initialised (or already finalised).
enum class MpiThreadLevel : int { kSingle = 0, kFunneled = 1, kSerialized = 2, kMultiple = 3 };
MpiThreadLevel mpi_thread_level();
const char* mpi_thread_level_name(MpiThreadLevel level);

}  // namespace ddtree
