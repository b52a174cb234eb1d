#!/usr/bin/env python3
"""Tree-verify MLA attention: the portable flash kernel against a PyTorch implementation, same process, same GPU.

The PyTorch implementation is what a user without a custom kernel writes: gather each request's KV rows through
the page table (index_select), bf16 matmuls for Q K^T and P V (fp32 accumulation inside cuBLAS), mask from the
ancestor bits, fp32 softmax. Both are captured in CUDA graphs (no Python launch overhead in the timing) and
replayed after a 256 MB memset that flushes L2; median of 7 replays. The portable kernel's output is checked
against the PyTorch one (max abs difference printed; bf16 PyTorch is itself ~1e-2 off the exact result, so this
is a sanity check, not the correctness bar: that is tests/gpu and tests/python).

Shapes: reference/mla-verify-attention.md's (H = 8, page 64, bushy trees, shuffled pages): P in {2k, 32k} x
T in {1, 8, 16, 64} at the fixed batch (64 at 2k, 32 at 32k) and batch 1 at P = 32k (--full: P in {512, 2k, 8k,
32k, 128k} x T in {1, 8, 16, 32, 64, 128}, fixed batch and batch 1; shapes whose PyTorch working set would
exceed --max-gb are skipped).

usage: bench_verify_attn_torch.py [--full] [--max-gb G] [--split-keys N]   (needs torch with CUDA and the library)
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels", "python"))
import ddtree_kernels as dk  # noqa: E402

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

QK, V, H, PAGE = 576, 512, 8, 64
CEIL_BW, CEIL_FLOPS = 4.3e12, 790e12
SCALE = 0.1352337


def make_shape(P, T, batch, gen):
    dev = "cuda"
    keys = P + T
    max_pages = (keys + PAGE - 1) // PAGE
    num_pages = batch * max_pages
    kv = (torch.rand((num_pages, PAGE, QK), generator=gen, device=dev) * 4 - 2).to(torch.bfloat16)
    perm = torch.randperm(num_pages, generator=gen, device=dev).to(torch.int32)
    page_table = perm.view(batch, max_pages).contiguous()
    q = (torch.rand((batch * T, H, QK), generator=gen, device=dev) * 4 - 2).to(torch.bfloat16)
    rng = np.random.default_rng(P * 131 + T * 7 + batch)
    W = (T + 63) // 64
    vis = np.zeros((batch * T, W), dtype=np.uint64)
    mask = np.zeros((batch, T, T), dtype=bool)  # tree part: mask[r, i, j] = node j is an ancestor-or-self of i
    for r in range(batch):
        for i in range(T):
            if i > 0:
                par = int(rng.integers(0, i))
                vis[r * T + i] = vis[r * T + par]
                mask[r, i] = mask[r, par]
            vis[r * T + i, i // 64] |= np.uint64(1) << np.uint64(i % 64)
            mask[r, i, i] = True
    prefix = torch.full((batch,), P, dtype=torch.int32, device=dev)
    offsets = torch.arange(0, (batch + 1) * T, T, dtype=torch.int32, device=dev)
    vis_t = torch.from_numpy(vis.view(np.int64)).to(dev).view(torch.uint64)
    full_mask = torch.ones((batch, T, keys), dtype=torch.bool, device=dev)
    full_mask[:, :, P:] = torch.from_numpy(mask).to(dev)
    return dict(P=P, T=T, batch=batch, kv=kv, page_table=page_table, q=q, prefix=prefix, offsets=offsets, vis=vis_t,
                mask=full_mask)


def torch_attention(s):
    """The PyTorch implementation (see the module docstring): out [batch T, H, 512] bf16, lse [batch T, H] f32."""
    P, T, batch, keys = s["P"], s["T"], s["batch"], s["P"] + s["T"]
    slots = torch.arange(keys, device="cuda")
    rows = (s["page_table"][:, slots // PAGE].long() * PAGE + slots % PAGE)          # [batch, keys]
    K = s["kv"].view(-1, QK).index_select(0, rows.reshape(-1)).view(batch, keys, QK)  # [batch, keys, 576]
    Q = s["q"].view(batch, T * H, QK)                                                # [batch, T H, 576]
    scores = torch.bmm(Q, K.transpose(1, 2)).float().view(batch, T, H, keys) * SCALE
    scores = scores.masked_fill(~s["mask"][:, :, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.softmax(scores, dim=-1).to(torch.bfloat16).view(batch, T * H, keys)
    out = torch.bmm(p, K[:, :, :V])
    return out.view(batch * T, H, V), lse.view(batch * T, H)


def portable(s, split_keys):
    out, lse, st = dk.verify_attn(s["q"], s["kv"], s["page_table"], s["prefix"], s["offsets"], s["vis"], SCALE, PAGE,
                                  kernel="portable", split_keys=split_keys)
    return out, lse


def time_graph(fn, flush):
    fn()  # warm-up (cuBLAS handles, the kernel's one-time setup)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        res = fn()
    ms = []
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(7):
        flush.fill_(i)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        ms.append(e0.elapsed_time(e1))
    return float(np.median(ms)) * 1e3, res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--max-gb", type=float, default=40.0)
    ap.add_argument("--split-keys", type=int, default=512, help="the portable kernel's split length (0: never)")
    a = ap.parse_args()
    if torch is None or not torch.cuda.is_available() or not dk.cuda_available():
        print("bench_verify_attn_torch: no CUDA GPU / torch; nothing to measure")
        return 77
    torch.backends.cuda.matmul.allow_tf32 = False
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    print(f"# bench_verify_attn_torch on {torch.cuda.get_device_name()}: the portable kernel vs a PyTorch "
          f"implementation (gather + bf16 bmm + fp32 softmax), both in CUDA graphs, L2 flushed; H = {H}, page {PAGE}, "
          f"shuffled pages, bushy trees, portable split_keys {a.split_keys}; torch {torch.__version__}")
    print("| P | T | batch | PyTorch us | portable us | portable / PyTorch speedup | roofline us | PyTorch fraction | "
          "portable fraction | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    if a.full:
        Ps, Ts = [512, 2048, 8192, 32768, 131072], [1, 8, 16, 32, 64, 128]
        shapes = [(P, T, b) for P in Ps for b in ({512: 64, 2048: 64, 8192: 32, 32768: 32, 131072: 8}[P], 1) for T in Ts]
    else:
        shapes = [(P, T, {2048: 64, 32768: 32}[P]) for P in (2048, 32768) for T in (1, 8, 16, 64)]
        shapes += [(32768, T, 1) for T in (1, 8, 16, 64)]
    for P, T, batch in shapes:
        keys = P + T
        gb = batch * (keys * QK * 2 + T * H * keys * 4 * 3) / 1e9  # gathered K + fp32 scores, softmax, mask temps
        if gb > a.max_gb:
            print(f"| {P} | {T} | {batch} | skipped: ~{gb:.0f} GB working set > --max-gb | | | | | | |")
            continue
        s = make_shape(P, T, batch, gen)
        bytes_ = batch * (1152.0 * keys + 2176.0 * H * T)
        flops = batch * 2176.0 * H * T * keys
        roof_us = max(bytes_ / CEIL_BW, flops / CEIL_FLOPS) * 1e6
        t_torch, (o_t, _) = time_graph(lambda: torch_attention(s), flush)
        t_port, (o_p, _) = time_graph(lambda: portable(s, a.split_keys), flush)
        diff = (o_t.float() - o_p.float()).abs().max().item()
        print(f"| {P} | {T} | {batch} | {t_torch:.1f} | {t_port:.1f} | {t_torch / t_port:.1f} | {roof_us:.1f} | "
              f"{roof_us / t_torch:.3f} | {roof_us / t_port:.3f} | {diff:.2e} |", flush=True)
        del s, o_t, o_p
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
