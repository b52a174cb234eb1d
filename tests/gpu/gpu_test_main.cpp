// main() of every GPU test binary: exit 77 (ctest: skipped) when no GPU is visible or the build has no
// cuda backend, else run the GoogleTest suite.
#include <gtest/gtest.h>

#include <cstdio>

#include "ddtree/kernels.h"

int main(int argc, char** argv) {
  if (!ddt_cuda_available()) {
    std::printf("SKIPPED: no CUDA GPU visible (or this build has no cuda backend)\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
