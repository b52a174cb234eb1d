// Tree output layout shared by the CPU twin and the CUDA tree builder: the parts of a built tree that are
// pure functions of (parents, depths, node_count), written by both backends from one definition.
#pragma once

#include <stdint.h>

#include "kernels/common/numerics.h"

namespace ddtree::kern {

DDT_HD int tree_width(int budget) { return budget + 1; }  // N: the root plus `budget` nodes
DDT_HD int vis_words(int n) { return (n + 63) / 64; }      // W: u64 words per ancestor bitmask row

// Packs a frontier item's payload: parent node (10 bits), depth (6 bits), rank among the position's
// top-K (16 bits).
DDT_HD uint32_t pack_item(int parent, int depth, int rank) {
  return uint32_t(parent) | (uint32_t(depth) << 10) | (uint32_t(rank) << 16);
}
DDT_HD int item_parent(uint32_t w) { return int(w & 0x3FFu); }
DDT_HD int item_depth(uint32_t w) { return int((w >> 10) & 0x3Fu); }
DDT_HD int item_rank(uint32_t w) { return int(w >> 16); }

// Heap key of a frontier item: max by score, ties to the smaller push sequence number.
DDT_HD uint64_t item_key(float score, uint32_t seq) { return num::pack_key(score, seq); }

// Writes node i's ancestor bitmask row (W words) from the parent array: walking up from i the ancestors'
// indices decrease, so their words come in non-increasing order and each word is written exactly once.
// Padding nodes (parent -1, i > 0) get {0, i}.
DDT_HD void write_vis_row(const int32_t* parent, int i, int W, uint64_t* row) {
  int w = W - 1;
  uint64_t acc = 0;
  int cur_word = i >> 6;
  for (; w > cur_word; --w) row[w] = 0;
  int j = i;
  bool padding = (i > 0 && parent[i] < 0);
  while (true) {
    const int jw = j >> 6;
    while (cur_word > jw) { row[cur_word] = acc; acc = 0; --cur_word; }
    acc |= uint64_t(1) << (j & 63);
    if (j == 0) break;
    j = padding ? 0 : parent[j];
    padding = false;
  }
  row[cur_word] = acc;
  for (w = cur_word - 1; w >= 0; --w) row[w] = 0;
}

}  // namespace ddtree::kern
