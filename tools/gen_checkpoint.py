#!/usr/bin/env python3
"""Deterministic DeepSeek-V3 test checkpoints: a Hugging Face model directory (config.json + safetensors with
the hub's tensor names, as save_pretrained writes them, optionally sharded with model.safetensors.index.json),
random weights from a seed, sized so the whole CI stays fast.

usage: gen_checkpoint.py OUT_DIR [--preset moe|dense] [--seed N] [--shards K] [--dtype bf16|f32] [--check]

Presets (FIDELITY.md fixtures; the C++ tests and tests/model/test_vs_transformers.py use them):
  moe   (config a): MoE (1 dense + 2 MoE layers, 16 routed experts in 4 groups, top-2 groups, top-4, one shared
        expert), q LoRA, YaRN (factor 40, mscale 1.0, mscale_all_dim 0.8: a non-trivial attention factor and
        softmax mscale), the real latent dims (kv_lora_rank 512, rope 64, nope 128, v 128), hub-style config
        (`rope_scaling`, top-level rope_theta), default 3 shards, bf16.
  dense (config b): dense layers only, plain q_proj (q_lora_rank null), plain RoPE written as transformers 5's
        `rope_parameters`, rope_interleave false, tied embeddings, v_head_dim != qk_nope_head_dim,
        rms_norm_eps 1e-5, eos as a list, one file, f32.

--check (needs torch + transformers) loads the directory with transformers' DeepseekV3ForCausalLM (no missing or
unexpected tensors allowed), then checks and prints the fixture properties of FIDELITY.md: every attention and
MoE/MLP block moves the residual stream by >= 10% (mean ||block out|| / ||residual in|| over positions), the
greedy continuation has many distinct tokens and no period <= 4, and the typical top-1 margin. Exit 1 if a
check fails.

Only numpy is needed to write a checkpoint (the safetensors format is written directly; bf16 is fp32 rounded to
nearest even).
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

PRESETS = {
    "moe": dict(
        config=dict(
            vocab_size=3001, hidden_size=256, intermediate_size=768, moe_intermediate_size=128,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
            n_routed_experts=16, routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=192,
            qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, n_group=4, topk_group=2,
            num_experts_per_tok=4, first_k_dense_replace=1, norm_topk_prob=True, moe_layer_freq=1,
            topk_method="noaux_tc", scoring_func="sigmoid", aux_loss_alpha=0.001, seq_aux=True, ep_size=1,
            hidden_act="silu", max_position_embeddings=163840, rms_norm_eps=1e-6, rope_theta=10000,
            rope_scaling=dict(type="yarn", factor=40, beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=0.8,
                              original_max_position_embeddings=4096),
            tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, attention_bias=False,
            attention_dropout=0.0, initializer_range=0.02, num_nextn_predict_layers=0, pretraining_tp=1,
            use_cache=True, model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"],
            torch_dtype="bfloat16"),
        shards=3, dtype="bf16"),
    "dense": dict(
        config=dict(
            vocab_size=1500, hidden_size=192, intermediate_size=512, moe_intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
            n_routed_experts=8, routed_scaling_factor=1.0, kv_lora_rank=128, q_lora_rank=None,
            qk_rope_head_dim=32, v_head_dim=48, qk_nope_head_dim=64, n_group=1, topk_group=1,
            num_experts_per_tok=2, first_k_dense_replace=2, norm_topk_prob=True,
            hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-5,
            rope_parameters=dict(rope_type="default", rope_theta=50000.0), rope_interleave=False,
            tie_word_embeddings=True, bos_token_id=0, eos_token_id=[2, 3], attention_bias=False,
            attention_dropout=0.0, initializer_range=0.02, num_nextn_predict_layers=0, pretraining_tp=1,
            use_cache=True, model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], dtype="float32"),
        shards=1, dtype="f32"),
}


def bf16_bits(a):
    """fp32 array -> uint16 bf16 bits, round to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return r.astype(np.uint16)


def write_safetensors(path, tensors, dtype_of):
    """tensors: list of (name, fp32 array). dtype_of(name) -> 'BF16' | 'F32'."""
    header, blobs, off = {}, [], 0
    for name, a in tensors:
        dt = dtype_of(name)
        b = bf16_bits(a).tobytes() if dt == "BF16" else np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return off


def make_weights(cfg, seed):
    """Hub tensor names -> fp32 arrays, in save_pretrained's order. Scales: unit-variance activations through
    every projection (std 1/sqrt(fan_in)), norm weights around 1, embeddings N(0, 1) (N(0, 1/16) when tied), a correction bias of
    the size of the score differences, so every block matters and the router's choices depend on the bias."""
    rng = np.random.default_rng(seed)
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nh = cfg["num_attention_heads"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    kvl, ql = cfg["kv_lora_rank"], cfg["q_lora_rank"]
    out = []

    def lin(name, o, i, gain=1.0):
        out.append((name, (rng.standard_normal((o, i)) * (gain / np.sqrt(i))).astype(np.float32)))

    def norm(name, n):
        out.append((name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)))

    # Tied embeddings double as the LM head: a smaller scale (0.25, chosen by the fixture checks) keeps the
    # logits moderate and the blocks, not the token's own embedding, in charge of the prediction.
    estd = 0.25 if cfg.get("tie_word_embeddings") else 1.0
    out.append(("model.embed_tokens.weight", (estd * rng.standard_normal((V, H))).astype(np.float32)))
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        if ql is None:
            lin(a + "q_proj.weight", nh * (nope + rope), H)
        else:
            lin(a + "q_a_proj.weight", ql, H)
            norm(a + "q_a_layernorm.weight", ql)
            lin(a + "q_b_proj.weight", nh * (nope + rope), ql)
        lin(a + "kv_a_proj_with_mqa.weight", kvl + rope, H)
        norm(a + "kv_a_layernorm.weight", kvl)
        lin(a + "kv_b_proj.weight", nh * (nope + vd), kvl)
        lin(a + "o_proj.weight", H, nh * vd)
        m = p + "mlp."
        moe = cfg.get("n_routed_experts") and l >= cfg["first_k_dense_replace"]
        if moe:
            E, I = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
            for e in range(E):
                lin(m + f"experts.{e}.gate_proj.weight", I, H)
                lin(m + f"experts.{e}.up_proj.weight", I, H)
                lin(m + f"experts.{e}.down_proj.weight", H, I)
            lin(m + "gate.weight", E, H)
            out.append((m + "gate.e_score_correction_bias", (0.1 * rng.standard_normal(E)).astype(np.float32)))
            Is = I * cfg["n_shared_experts"]
            if Is:
                lin(m + "shared_experts.gate_proj.weight", Is, H)
                lin(m + "shared_experts.up_proj.weight", Is, H)
                lin(m + "shared_experts.down_proj.weight", H, Is)
        else:
            I = cfg["intermediate_size"]
            lin(m + "gate_proj.weight", I, H)
            lin(m + "up_proj.weight", I, H)
            lin(m + "down_proj.weight", H, I)
        norm(p + "input_layernorm.weight", H)
        norm(p + "post_attention_layernorm.weight", H)
    if cfg.get("tie_word_embeddings"):
        # Tied: logits = E . norm(x) and x carries the current token's embedding, so with norm weights near 1
        # every token predicts itself and greedy decoding repeats one token. Zero-mean final-norm weights
        # make E_t . (w * E_t) average out.
        out.append(("model.norm.weight", rng.standard_normal(H).astype(np.float32)))
    else:
        norm("model.norm.weight", H)
    if not cfg.get("tie_word_embeddings"):
        lin("lm_head.weight", V, H)
    return out


def generate(out_dir, preset="moe", seed=0, shards=None, dtype=None):
    spec = PRESETS[preset]
    cfg = dict(spec["config"])
    shards = spec["shards"] if shards is None else shards
    dtype = spec["dtype"] if dtype is None else dtype
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):
        if f.endswith(".safetensors") or f.endswith(".json"):
            os.remove(os.path.join(out_dir, f))
    if dtype == "f32":
        cfg.pop("torch_dtype", None)
        cfg["dtype"] = "float32"
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    tensors = make_weights(cfg, seed)

    # The router's correction bias stays fp32 in bf16 checkpoints (transformers keeps it in fp32 too).
    def dtype_of(name):
        return "F32" if dtype == "f32" or name.endswith("e_score_correction_bias") else "BF16"

    if shards <= 1:
        write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, dtype_of)
    else:
        per = -(-len(tensors) // shards)
        weight_map, total = {}, 0
        for k in range(shards):
            part = tensors[k * per:(k + 1) * per]
            fn = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            total += write_safetensors(os.path.join(out_dir, fn), part, dtype_of)
            for name, _ in part:
                weight_map[name] = fn
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return cfg


def prompt_tokens(vocab, n, seed):
    return np.random.default_rng(1000 + seed).integers(4, vocab, size=n).tolist()


def check(out_dir, seed, gen_len=48):
    """FIDELITY.md fixture checks with transformers; returns (ok, report lines)."""
    import torch
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(0)
    model, info = DeepseekV3ForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager",
                                                        output_loading_info=True)
    model.eval()
    cfg = model.config
    lines, ok = [], True
    missing = [k for k in info["missing_keys"] if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
    if missing or info["unexpected_keys"] or info.get("mismatched_keys"):
        return False, [f"loading: missing {missing} unexpected {info['unexpected_keys']} "
                       f"mismatched {info.get('mismatched_keys')}"]
    ids = torch.tensor([prompt_tokens(cfg.vocab_size, 32, seed)])
    # Ratios against the residual stream: the decoder layer's input (attention) and input + attention
    # output (MLP / MoE), recorded with hooks.
    resid = {}

    def layer_pre(l):
        def f(mod, args, kwargs):
            resid[l] = args[0] if args else kwargs["hidden_states"]
        return f

    outs = {}

    def block_out(name):
        def f(mod, args, kwargs, output):
            outs[name] = output[0] if isinstance(output, tuple) else output
        return f

    hs = []
    for l, layer in enumerate(model.model.layers):
        hs.append(layer.register_forward_pre_hook(layer_pre(l), with_kwargs=True))
        hs.append(layer.self_attn.register_forward_hook(block_out(f"attn{l}"), with_kwargs=True))
        hs.append(layer.mlp.register_forward_hook(block_out(f"mlp{l}"), with_kwargs=True))
    with torch.no_grad():
        logits = model(ids).logits[0]
    for h in hs:
        h.remove()
    for l in range(cfg.num_hidden_layers):
        r0 = resid[l]
        a = outs[f"attn{l}"]
        r1 = r0 + a
        m = outs[f"mlp{l}"]
        ra = (a.norm(dim=-1) / r0.norm(dim=-1)).mean().item()
        rm = (m.norm(dim=-1) / r1.norm(dim=-1)).mean().item()
        kind = "moe" if l >= cfg.first_k_dense_replace and cfg.n_routed_experts else "mlp"
        good = ra >= 0.1 and rm >= 0.1
        ok &= good
        lines.append(f"layer {l}: attention moves the residual by {100 * ra:.0f}%, {kind} by {100 * rm:.0f}%"
                     f"{'' if good else '  <-- below 10%'}")
    top2 = torch.topk(logits, 2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1])
    eps = 1e-2 * logits.std(dim=-1)
    lines.append(f"teacher-forced top-1 margin: median {margin.median().item():.3f}, min {margin.min().item():.4f}; "
                 f"positions below eps (1e-2 x std): {(margin < eps).sum().item()}/{len(margin)}")
    with torch.no_grad():
        g = model.generate(ids[:, :8], max_new_tokens=gen_len, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, 8:].tolist()
    distinct = len(set(g))
    periodic = [p for p in range(1, 5) if all(g[t] == g[t - p] for t in range(len(g) - 16, len(g)))]
    good = distinct >= len(g) // 2 and not periodic
    ok &= good
    lines.append(f"greedy continuation ({len(g)} tokens): {distinct} distinct, "
                 f"period<=4 in the last 16: {periodic or 'none'}{'' if good else '  <-- degenerate'}")
    lines.append(f"greedy tokens: {g}")
    return ok, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="moe")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=None)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default=None)
    ap.add_argument("--check", action="store_true", help="run the FIDELITY.md fixture checks (torch + transformers)")
    a = ap.parse_args()
    generate(a.out_dir, a.preset, a.seed, a.shards, a.dtype)
    print(f"wrote {a.preset} checkpoint (seed {a.seed}) to {a.out_dir}")
    if a.check:
        ok, lines = check(a.out_dir, a.seed)
        for line in lines:
            print("  " + line)
        print("fixture checks: " + ("ok" if ok else "FAILED"))
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
