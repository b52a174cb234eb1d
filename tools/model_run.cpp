// ddtree-model-run: runs token ids through the cpu-backend model (teacher forced) and writes the logits and
// every layer's hidden state to a safetensors file; optionally continues greedily from a prompt.
//
// usage: ddtree-model-run --model DIR --tokens 1,2,3 --out FILE.safetensors
//                         [--generate N --prompt-len K] [--tp-size S] [--page-size P] [--chunk C]
//
// Output tensors (F32 unless noted):
//   logits         [T, vocab]          teacher-forced logits of --tokens (one causal prefill, or chunks of C)
//   hidden_states  [L + 1, T, hidden]  transformers' output_hidden_states layout (last = after the final norm)
//   tokens         I32 [T]
//   generated      I32 [N]             greedy continuation of the first K tokens (prefill, then N-1 decodes;
//                                      ties to the smaller id), when --generate N
//   generated_logits [N, vocab]        the logits each generated token was chosen from
//   rope_inv_freq  [rope / 2], rope_attention_factor [1], softmax_scale [1]: derived RoPE / YaRN constants
// --tp-size S runs S shards in one process (threads, all-reduce summed in rank order) and writes the
// gathered logits: the tensor-parallel path end to end. Exit status 1 with a message on any error.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rank/model/local_tp.h"
#include "rank/model/model.h"

namespace {

using namespace ddtree;
using namespace ddtree::model;

struct Args {
  std::string model, out;
  std::vector<int32_t> tokens;
  int generate = 0, prompt_len = 0, tp_size = 1, page_size = 16, chunk = 0;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "ddtree-model-run: %s\nusage: ddtree-model-run --model DIR --tokens 1,2,3 --out FILE.safetensors "
               "[--generate N --prompt-len K] [--tp-size S] [--page-size P] [--chunk C]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(k + " needs a value");
      return argv[++i];
    };
    if (k == "--model") a.model = val();
    else if (k == "--out") a.out = val();
    else if (k == "--tokens") {
      std::stringstream ss(val());
      std::string t;
      while (std::getline(ss, t, ',')) a.tokens.push_back(int32_t(std::stol(t)));
    } else if (k == "--generate") a.generate = std::stoi(val());
    else if (k == "--prompt-len") a.prompt_len = std::stoi(val());
    else if (k == "--tp-size") a.tp_size = std::stoi(val());
    else if (k == "--page-size") a.page_size = std::stoi(val());
    else if (k == "--chunk") a.chunk = std::stoi(val());
    else usage("unknown argument " + k);
  }
  if (a.model.empty() || a.out.empty() || a.tokens.empty()) usage("--model, --tokens and --out are required");
  if (a.generate > 0 && (a.prompt_len < 1 || a.prompt_len > int(a.tokens.size())))
    usage("--generate needs --prompt-len in [1, number of tokens]");
  if (a.tp_size < 1) usage("--tp-size must be >= 1");
  return a;
}

struct Shard {
  Model model;
  kv::LatentKvCache cache;
};

int run(const Args& a) {
  const int S = a.tp_size;
  std::vector<std::unique_ptr<Shard>> shards;
  const int64_t max_tokens = int64_t(a.tokens.size()) + a.generate + 1;
  const int pages = int((max_tokens + a.page_size - 1) / a.page_size);
  for (int r = 0; r < S; ++r) {
    Model m = Model::load(a.model, ShardSpec{r, S});
    kv::LatentKvCache cache(m.kv_shape(a.page_size, 2 * pages, 2, pages));
    shards.push_back(std::make_unique<Shard>(Shard{std::move(m), std::move(cache)}));
  }
  LocalTpAllReduce tp(S);
  for (int r = 0; r < S; ++r) shards[std::size_t(r)]->model.set_all_reduce(tp.fn(r));
  const ModelConfig& c = shards[0]->model.config();
  const int64_t V = c.vocab_size, H = c.hidden_size, Ln = c.num_hidden_layers;

  // Runs `batch` on every shard (one thread each) and gathers the logits [rows, V].
  auto step = [&](const std::vector<RequestRows>& batch, bool hidden, std::vector<float>& logits,
                  std::vector<float>* hid) {
    std::vector<ForwardResult> res(static_cast<std::size_t>(S));
    std::vector<std::exception_ptr> err(static_cast<std::size_t>(S));
    std::vector<std::thread> th;
    for (int r = 0; r < S; ++r)
      th.emplace_back([&, r] {
        try {
          shards[std::size_t(r)]->model.forward(batch, shards[std::size_t(r)]->cache, res[std::size_t(r)], hidden);
        } catch (...) {
          err[std::size_t(r)] = std::current_exception();
        }
      });
    for (auto& t : th) t.join();
    for (auto& e : err)
      if (e) std::rethrow_exception(e);
    const int64_t rows = res[0].rows;
    logits.assign(std::size_t(rows * V), 0.0f);
    for (int r = 0; r < S; ++r) {
      const ShardRanges& g = shards[std::size_t(r)]->model.ranges();
      for (int64_t i = 0; i < rows; ++i)
        std::memcpy(&logits[std::size_t(i * V + g.vocab0)], &res[std::size_t(r)].logits[std::size_t(i * g.vocab())],
                    std::size_t(g.vocab()) * sizeof(float));
    }
    if (hid) *hid = std::move(res[0].hidden);
  };

  SafetensorsWriter w;
  const int64_t T = int64_t(a.tokens.size());
  {
    // Teacher forced: request 0, one causal chunk (or chunks of --chunk rows, each a prefill on top of the
    // cache: the decode-after-prefill path when C = 1).
    for (auto& s : shards) s->cache.reserve(0, T);
    std::vector<float> logits, hidden, part_logits, part_hidden;
    const int C = a.chunk > 0 ? a.chunk : int(T);
    logits.reserve(std::size_t(T * V));
    std::vector<std::vector<float>> hid_chunks;
    for (int64_t p = 0; p < T; p += C) {
      RequestRows rr;
      rr.kv_request = 0;
      rr.prefix_len = p;
      rr.n = int(std::min<int64_t>(C, T - p));
      rr.tokens = &a.tokens[std::size_t(p)];
      step({rr}, true, part_logits, &part_hidden);
      logits.insert(logits.end(), part_logits.begin(), part_logits.end());
      hid_chunks.push_back(std::move(part_hidden));
    }
    // Reassemble [L + 1, T, H] from the chunks' [L + 1, n, H].
    hidden.assign(std::size_t((Ln + 1) * T * H), 0.0f);
    int64_t p = 0;
    for (const auto& hc : hid_chunks) {
      const int64_t n = int64_t(hc.size()) / ((Ln + 1) * H);
      for (int64_t l = 0; l <= Ln; ++l)
        std::memcpy(&hidden[std::size_t((l * T + p) * H)], &hc[std::size_t(l * n * H)], std::size_t(n * H) * sizeof(float));
      p += n;
    }
    w.add_f32("logits", {T, V}, logits.data());
    w.add_f32("hidden_states", {Ln + 1, T, H}, hidden.data());
    w.add_i32("tokens", {T}, a.tokens.data());
  }
  if (a.generate > 0) {
    // Greedy from the first prompt_len tokens, request 1: prefill, then one-token decodes.
    for (auto& s : shards) s->cache.reserve(1, a.prompt_len + a.generate);
    std::vector<int32_t> seq(a.tokens.begin(), a.tokens.begin() + a.prompt_len), gen;
    std::vector<float> gen_logits, logits;
    int64_t done = 0;
    while (int(gen.size()) < a.generate) {
      RequestRows rr;
      rr.kv_request = 1;
      rr.prefix_len = done;
      rr.n = int(int64_t(seq.size()) - done);
      rr.tokens = &seq[std::size_t(done)];
      step({rr}, false, logits, nullptr);
      const float* last = &logits[std::size_t((rr.n - 1) * V)];
      int32_t best = 0;
      for (int64_t v = 1; v < V; ++v)
        if (last[v] > last[best]) best = int32_t(v);
      gen_logits.insert(gen_logits.end(), last, last + V);
      gen.push_back(best);
      done = int64_t(seq.size());
      seq.push_back(best);
    }
    w.add_i32("generated", {int64_t(gen.size())}, gen.data());
    w.add_f32("generated_logits", {int64_t(gen.size()), V}, gen_logits.data());
  }
  const std::vector<float> inv = c.rope_inv_freq();
  const float af = float(c.rope_attention_factor()), sc = float(c.softmax_scale());
  w.add_f32("rope_inv_freq", {int64_t(inv.size())}, inv.data());
  w.add_f32("rope_attention_factor", {1}, &af);
  w.add_f32("softmax_scale", {1}, &sc);
  w.set_metadata("config", c.fingerprint());
  w.write(a.out);
  std::printf("ddtree-model-run: %lld tokens%s -> %s\n", (long long)T,
              a.generate ? (" + " + std::to_string(a.generate) + " generated").c_str() : "", a.out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddtree-model-run: error: %s\n", e.what());
    return 1;
  }
}
