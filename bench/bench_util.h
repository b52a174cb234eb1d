// Shared by the GPU benchmarks (bench/*.cpp): launch-or-exit, event timing, the same-run copy ceiling.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "ddtree/kernels.h"
#include "tests/gpu/gpu_util.h"

namespace ddtree::bench {

// A kernel entry point that fails makes the benchmark exit 1 with the library's message.
#define BENCH_OK(call)                                                                          \
  do {                                                                                          \
    int rc_ = (call);                                                                           \
    if (rc_ != DDT_OK) {                                                                        \
      std::fprintf(stderr, "%s failed: %s (%s)\n", #call, ddt_status_string(rc_), ddt_last_error_message()); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

inline // Median over 5 samples of (time of `reps` back-to-back calls) / reps, in microseconds.
double time_us(cudaStream_t s, int reps, const std::function<void()>& launch) {
  cudaEvent_t a, b;
  GPU_CHECK(cudaEventCreate(&a));
  GPU_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) launch();
  std::vector<double> t;
  for (int sample = 0; sample < 5; ++sample) {
    GPU_CHECK(cudaEventRecord(a, s));
    for (int i = 0; i < reps; ++i) launch();
    GPU_CHECK(cudaEventRecord(b, s));
    GPU_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    GPU_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(1e3 * ms / reps);
  }
  GPU_CHECK(cudaEventDestroy(a));
  GPU_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[2];
}

// Same, with `reps` launches captured in one CUDA graph.
inline double graph_us(cudaStream_t s, int reps, const std::function<void()>& launch) {
  cudaGraph_t g;
  cudaGraphExec_t e;
  GPU_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < reps; ++i) launch();
  GPU_CHECK(cudaStreamEndCapture(s, &g));
  GPU_CHECK(cudaGraphInstantiate(&e, g, 0));
  const double us = time_us(s, 1, [&] { GPU_CHECK(cudaGraphLaunch(e, s)); }) / reps;
  GPU_CHECK(cudaGraphExecDestroy(e));
  GPU_CHECK(cudaGraphDestroy(g));
  return us;
}

// Device copy bandwidth in TB/s counting bytes read + written (2 GiB buffers, median of 5 timed copies).
inline double copy_bandwidth_tbs(cudaStream_t s) {
  const size_t bytes = size_t(2) << 30;
  test::DevBuf<char> a(bytes), b(bytes);
  a.poison(1);
  const double us = time_us(s, 5, [&] { GPU_CHECK(cudaMemcpyAsync(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice, s)); });
  return 2.0 * bytes / (us * 1e-6) / 1e12;
}

}  // namespace ddtree::bench
