// Host-side argument checks shared by the CPU twins and the CUDA launchers: each returns DDT_OK or an
// error code after recording a message (ddt_last_error_message()). Validate once at the boundary, trust
// inside.
#pragma once

#include <string>

#include "ddtree/kernels.h"

namespace ddtree::kern {

// Records `msg` as this thread's last error and returns `code`.
int fail(int code, const std::string& msg);
void clear_error();
const char* g_last_error_ptr();

int validate(const ddt_topk_shard_params* p);
int validate(const ddt_topk_combine_params* p);
int validate(const ddt_tree_build_params* p);
int validate(const ddt_sample_keys_params* p);
int validate(const ddt_accept_params* p);
int validate(const ddt_verify_attn_params* p);
int validate(const ddt_kv_compact_params* p);


}  // namespace ddtree::kern
