// Where the persistent CTAs of a one-CTA-per-SM kernel land (docs/PERF_NOTES.md S33: the guess that two long
// items on neighbouring CTA indices share a TPC). Launches `grid` CTAs (default: the SM count) with the sm_90a
// attention kernel's dynamic shared memory (~225 KB: one CTA per SM) and prints, per CTA index, the SM it ran
// on (%smid), and how many neighbouring index pairs (2k, 2k+1) ran on SMs 2j, 2j+1 (the same TPC if, as is
// common but not documented, a TPC holds SMs 2j and 2j+1).
// Build: nvcc -std=c++20 -arch=sm_90a -O2 bench/dev/smid_probe.cu -o smid_probe
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

__global__ void where_am_i(int* smid_of_cta, long long spin_cycles) {
  extern __shared__ unsigned char smem[];
  if (threadIdx.x == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    smid_of_cta[blockIdx.x] = int(smid);
    smem[0] = 1;
    const long long t0 = clock64();  // stay resident so that no two CTAs share an SM over time
    while (clock64() - t0 < spin_cycles) {
    }
  }
}

int main(int argc, char** argv) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int grid = argc > 1 ? std::atoi(argv[1]) : sms;
  if (grid < 1) {
    std::printf("usage: smid_probe [grid >= 1]\n");
    return 2;
  }
  const int smem = 225 * 1024;
  if (cudaFuncSetAttribute(where_am_i, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
    std::printf("shared-memory opt-in failed\n");
    return 1;
  }
  int* d = nullptr;
  if (cudaMalloc(&d, grid * sizeof(int)) != cudaSuccess) {
    std::printf("cudaMalloc failed\n");
    return 1;
  }
  for (int run = 0; run < 3; ++run) {
    where_am_i<<<grid, 128, smem>>>(d, 200000);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      std::printf("launch failed: %s\n", cudaGetErrorString(e));
      return 1;
    }
    std::vector<int> h(grid);
    if ((e = cudaMemcpy(h.data(), d, grid * sizeof(int), cudaMemcpyDeviceToHost)) != cudaSuccess) {
      std::printf("copy failed: %s\n", cudaGetErrorString(e));
      return 1;
    }
    int same_tpc = 0;
    for (int c = 0; c + 1 < grid; c += 2) same_tpc += (h[c] >> 1) == (h[c + 1] >> 1);
    std::printf("run %d, %d CTAs on %d SMs: CTA -> SM", run, grid, sms);
    for (int c = 0; c < grid; ++c) std::printf("%s%d", c % 24 ? " " : "\n  ", h[c]);
    std::printf("\n  pairs (2k, 2k+1) on SMs (2j, 2j+1): %d of %d\n", same_tpc, grid / 2);
  }
  cudaFree(d);
  return 0;
}
