// DDTREE_MPI_CHECK: turns a failing MPI call into CommError (comm.h) naming the call, where it was made and
// MPI's own description of the error. Internal to rank/comm and its tests: it needs <mpi.h>, which users of
// comm.h never see. It only helps on communicators whose error handler is MPI_ERRORS_RETURN (MpiComm sets
// it on the communicators it owns); under MPI's default handler a failing call ends the job before
// returning.
#pragma once

#include <mpi.h>

#include "rank/comm/comm.h"

namespace ddtree::detail {

// Throws CommError: "<call> failed at <file>:<line> on rank <world rank>: <MPI error string> (MPI error
// class <n>)". rc is an MPI error code other than MPI_SUCCESS.
[[noreturn]] void throw_mpi_error(int rc, const char* call, const char* file, int line);

inline void check_mpi(int rc, const char* call, const char* file, int line) {
  if (rc != MPI_SUCCESS) throw_mpi_error(rc, call, file, line);
}

}  // namespace ddtree::detail

// Wrap every MPI call whose result matters: DDTREE_MPI_CHECK(MPI_Bcast(buf, n, type, root, comm)).
#define DDTREE_MPI_CHECK(call) ::ddtree::detail::check_mpi((call), #call, __FILE__, __LINE__)
