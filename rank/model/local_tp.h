// LocalTpAllReduce: tensor parallelism inside one process, one thread per shard (tools and tests; the
// engine uses Comm::all_reduce across ranks). all_reduce sums every shard's buffer in rank order,
// ((b0 + b1) + b2) + ..., and gives every shard the bitwise-same result, as Comm's kSum does.
#pragma once

#include <barrier>
#include <cstring>
#include <vector>

#include "rank/model/model.h"

namespace ddtree::model {

class LocalTpAllReduce {
 public:
  explicit LocalTpAllReduce(int shards) : n_(shards), bufs_(static_cast<std::size_t>(shards)), sync_(shards) {}

  // The callback for shard `rank` (install with Model::set_all_reduce). Every shard must call it the same
  // number of times with the same count, each from its own thread.
  AllReduceFn fn(int rank) {
    return [this, rank](float* data, std::size_t count) {
      bufs_[static_cast<std::size_t>(rank)] = data;
      sync_.arrive_and_wait();
      if (rank == 0) {
        sum_.assign(data, data + count);
        for (int r = 1; r < n_; ++r) {
          const float* b = bufs_[static_cast<std::size_t>(r)];
          for (std::size_t i = 0; i < count; ++i) sum_[i] = sum_[i] + b[i];
        }
      }
      sync_.arrive_and_wait();
      std::memcpy(data, sum_.data(), count * sizeof(float));
      sync_.arrive_and_wait();  // nobody starts the next reduction while another still copies this one
    };
  }

 private:
  int n_;
  std::vector<float*> bufs_;
  std::vector<float> sum_;
  std::barrier<> sync_;
};

}  // namespace ddtree::model
