// comm_abort_probe: shows that Comm::abort from one rank ends the whole mpirun job, non-zero, without
// hanging. Run by ctest comm_mpi_abort_np2 (expect_mpi_failure.cmake) under mpirun with two or more ranks.
//
// Rank 1 calls abort(3, ...) while every other rank waits in a barrier that rank 1 never joins: only the
// abort can end them.
#include <cstdio>
#include <exception>

#include "rank/comm/comm.h"

int main(int argc, char** argv) {
  try {
    auto comm = ddtree::make_mpi_comm(&argc, &argv);
    if (comm->size() < 2) {
      std::fprintf(stderr, "comm_abort_probe: needs at least 2 ranks, got %d\n", comm->size());
      return 2;
    }
    comm->barrier();  // every rank is up
    if (comm->rank() == 1) comm->abort(3, "abort probe: rank 1 ends the job on purpose");
    comm->barrier();  // never completes: rank 1 is gone
    std::fprintf(stderr, "comm_abort_probe rank %d: BUG: barrier returned after rank 1 aborted\n",
                 comm->rank());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_abort_probe: %s\n", e.what());
    return 2;
  }
}
