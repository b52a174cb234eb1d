// Dev harness (not shipped): latency in cycles of the primitive chains one pop of the warp-parallel tree
// builder is made of, measured by one warp alone on an SM with clock64. Guides docs/PERF_NOTES.md.
// usage: pop_latency   (prints a table)
#include <cstdio>
#include <cuda_runtime.h>

constexpr int kIters = 4096;

template <int KIND>
__global__ void chain(unsigned* out, long long* cycles, const unsigned* in) {
  __shared__ unsigned sm[1024];
  const int lane = threadIdx.x;
  for (int i = lane; i < 1024; i += 32) sm[i] = (i * 7 + 3) & 1023;
  __syncwarp();
  unsigned x = in[lane];
  const long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
    if (KIND == 0) x = __reduce_max_sync(0xFFFFFFFFu, x ^ lane) + 1;                     // redux
    if (KIND == 1) x = __ballot_sync(0xFFFFFFFFu, (x >> (lane & 7)) & 1) + x;            // vote
    if (KIND == 2) x = __shfl_sync(0xFFFFFFFFu, x, x & 31) + 1;                          // shfl
    if (KIND == 3) x = sm[x & 1023] + 1;                                                 // lds
    if (KIND == 4) {                                                                     // one pop's skeleton
      const unsigned m = __reduce_max_sync(0xFFFFFFFFu, x ^ lane);
      const unsigned b = __ballot_sync(0xFFFFFFFFu, (x ^ lane) == m);
      const int owner = __ffs(b) - 1;
      const unsigned slot = __shfl_sync(0xFFFFFFFFu, x, owner);
      const unsigned pay = sm[slot & 1023];
      x += sm[(pay + 1) & 1023] + m;
      __syncwarp();
    }
    if (KIND == 5) { if (lane == (x & 31)) x += sm[x & 1023]; __syncwarp(); x += 1; }  // divergent branch
  }
  const long long t1 = clock64();
  out[lane] = x;
  if (lane == 0) cycles[0] = t1 - t0;
}

int main() {
  unsigned *in, *out;
  long long* cyc;
  cudaMalloc(&in, 128); cudaMalloc(&out, 128); cudaMalloc(&cyc, 8);
  cudaMemset(in, 1, 128);
  const char* names[] = {"redux.sync.max", "vote.ballot", "shfl.idx", "lds (dependent)", "pop skeleton", "divergent lane branch"};
  std::printf("| chain | cycles per iteration |\n|---|---|\n");
  auto run = [&](auto kern, const char* name) {
    long long c = 0;
    kern<<<1, 32>>>(out, cyc, in);
    kern<<<1, 32>>>(out, cyc, in);
    cudaMemcpy(&c, cyc, 8, cudaMemcpyDeviceToHost);
    std::printf("| %s | %.1f |\n", name, double(c) / kIters);
  };
  run(chain<0>, names[0]); run(chain<1>, names[1]); run(chain<2>, names[2]);
  run(chain<3>, names[3]); run(chain<4>, names[4]); run(chain<5>, names[5]);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
