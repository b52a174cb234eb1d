"""Kernels through the Python module (ctypes) against independent Python references.

The references here share no code with the library: a heapq DDTree builder written from
reference/ddtree.md, numpy top-K / log-softmax, a numpy re-implementation of the keyed Gumbel noise and
plain argmax sampling, and a direct tree walk. Every backend the machine has is checked: the CPU twins
always (numpy arrays); the CUDA kernels with PyTorch CUDA tensors where torch and a GPU exist (otherwise
those cases are reported as skipped).
"""
import heapq
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "kernels", "python"))
import ddtree_kernels as dk  # noqa: E402

try:
    import torch
    HAVE_CUDA = torch.cuda.is_available() and dk.cuda_available()
except Exception:
    torch = None
    HAVE_CUDA = False

BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA GPU / torch"))]
F32 = np.float32
NEG_INF = F32(-np.inf)


def on(backend, a):
    """Array for the backend: numpy for cpu, a torch CUDA tensor for cuda."""
    a = np.ascontiguousarray(a)
    if backend == "cpu":
        return a
    if a.dtype == np.uint64:
        return torch.from_numpy(a.view(np.int64)).cuda().view(torch.uint64)
    return torch.from_numpy(a).cuda()


def host(x):
    return dk.to_numpy(x)


def random_logits(rng, rows, vocab, tie=0.2, ninf=0.05, scale=3.0):
    x = rng.normal(0, scale, size=(rows, vocab)).astype(F32)
    u = rng.random(size=(rows, vocab))
    x = np.where(u < tie, np.round(x * 2) / 2, x).astype(F32)
    x[(u >= tie) & (u < tie + ninf)] = -np.inf
    return x


# ---------------- references ----------------
def ref_topk(x, k):
    """Stable sort by value descending (NaN as -inf): ties keep the smaller id first. lse in float64."""
    v = np.where(np.isnan(x), -np.inf, x).astype(np.float64)
    order = np.argsort(-v, axis=1, kind="stable")[:, :k]
    m = v.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        lse = (m + np.log(np.exp(v - np.where(np.isfinite(m), m, 0)).sum(axis=1, keepdims=True)))[:, 0]
    lse[~np.isfinite(m[:, 0])] = -np.inf
    return order, lse


def ref_tree_build(lp, ids, root, prefix, budget):
    """reference/ddtree.md's pseudocode with heapq; f32 sums root to leaf."""
    L, K = lp.shape
    n_max = budget + 1
    tok, par, dep, score = [root], [-1], [0], [F32(0)]
    heap, seq = [], 0

    def push(s, parent, d, r):
        nonlocal seq
        heapq.heappush(heap, (-float(s), seq, parent, d, r, s))
        seq += 1

    if lp[0, 0] > -np.inf:
        push(F32(F32(0) + lp[0, 0]), 0, 1, 0)
    while len(tok) - 1 < budget and heap:
        _, _, p, d, r, s = heapq.heappop(heap)
        i = len(tok)
        tok.append(int(ids[d - 1, r])); par.append(p); dep.append(d); score.append(s)
        if r + 1 < K and lp[d - 1, r + 1] > -np.inf:
            push(F32(score[p] + lp[d - 1, r + 1]), p, d, r + 1)
        if d < L and lp[d, 0] > -np.inf:
            push(F32(s + lp[d, 0]), i, d + 1, 0)
    count = len(tok)
    for i in range(count, n_max):
        tok.append(root); par.append(-1); dep.append(1); score.append(NEG_INF)
    W = (n_max + 63) // 64
    vis = np.zeros((n_max, W), dtype=np.uint64)
    for i in range(n_max):
        chain = [0, i] if (i >= count) else []
        j = i
        while i < count and j >= 0:
            chain.append(j); j = par[j]
        for j in chain:
            vis[i, j // 64] |= np.uint64(1) << np.uint64(j % 64)
    fc, ns = [-1] * n_max, [-1] * n_max
    last = {}
    for i in range(1, count):
        p = par[i]
        if p in last:
            ns[last[p]] = i
        else:
            fc[p] = i
        last[p] = i
    return dict(tokens=np.array(tok, np.int32), parents=np.array(par, np.int32), depths=np.array(dep, np.int32),
                scores=np.array(score, F32), slots=prefix + np.arange(n_max, dtype=np.int32),
                positions=(prefix + np.array(dep)).astype(np.int32), vis=vis, first_child=np.array(fc, np.int32),
                next_sibling=np.array(ns, np.int32), node_count=count)


M64 = (1 << 64) - 1


def mix64(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def portable_log(x):
    """numpy float32 re-implementation of kernels/common/numerics.h portable_log (IEEE f32 ops only)."""
    x = F32(x)
    u = int(np.array(x, F32).view(np.uint32))
    e = ((u >> 23) & 0xFF) - 127
    m = np.array((u & 0x7FFFFF) | 0x3F800000, np.uint32).view(F32)[()]
    if m > F32(1.41421356):
        m = F32(m * F32(0.5)); e += 1
    f = F32(m + F32(-1.0))
    s = F32(f / F32(F32(2.0) + f))
    s2 = F32(s * s)
    poly = F32(F32(s2 * F32(1.0 / 9.0)) + F32(1.0 / 7.0))
    poly = F32(F32(poly * s2) + F32(1.0 / 5.0))
    poly = F32(F32(poly * s2) + F32(1.0 / 3.0))
    poly = F32(F32(poly * s2) + F32(1.0))
    ln_m = F32(F32(F32(2.0) * s) * poly)
    return F32(F32(F32(e) * F32(0.693147182)) + ln_m)


def gumbel(seed, position, token):
    h = mix64(mix64(mix64(seed) ^ (position & M64)) ^ token)
    u = F32(F32((h >> 41) * 2 + 1) * F32(5.9604644775390625e-08))
    return F32(-portable_log(-portable_log(u)))


def plain_sample(logits_row, temperature, seed, position):
    if temperature == 0:
        v = np.where(np.isnan(logits_row), -np.inf, logits_row)
        return int(np.argmax(v))
    best, bv = -1, None
    for t, x in enumerate(logits_row):
        val = NEG_INF if np.isnan(x) else F32(F32(x / F32(temperature)) + gumbel(seed, position, t))
        if best < 0 or val > bv:
            best, bv = t, val
    return best


# ---------------- tests ----------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows,vocab,k", [(4, 1, 1), (6, 37, 5), (5, 3000, 64), (3, 163840, 512), (2, 9, 16)])
def test_topk_against_numpy(backend, rows, vocab, k):
    rng = np.random.default_rng(rows * vocab + k)
    x = random_logits(rng, rows, vocab, tie=0.4, ninf=0.05)
    vals, ids, lse = dk.topk_shard(on(backend, x), k, vocab_offset=10)
    order, ref_lse_ = ref_topk(x, k)
    ids, vals, lse = host(ids), host(vals), host(lse)
    kk = min(k, vocab)
    np.testing.assert_array_equal(ids[:, :kk], order + 10)
    np.testing.assert_array_equal(vals[:, :kk], np.take_along_axis(np.where(np.isnan(x), -np.inf, x), order, 1))
    assert (ids[:, kk:] == -1).all() and (vals[:, kk:] == -np.inf).all()
    np.testing.assert_allclose(lse, ref_lse_, rtol=0, atol=4e-6 * max(1.0, np.abs(ref_lse_[np.isfinite(ref_lse_)]).max()))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shards", [1, 2, 8])
def test_topk_combine_against_log_softmax(backend, shards):
    rng = np.random.default_rng(shards)
    rows, vocab, k = 8, 4096, 64
    x = random_logits(rng, rows, vocab, tie=0.3, ninf=0.02)
    parts = np.array_split(np.arange(vocab), shards)
    outs = [dk.topk_shard(on(backend, np.ascontiguousarray(x[:, p])), k, vocab_offset=int(p[0])) for p in parts]
    stack = (lambda i: np.stack([host(o[i]) for o in outs]))
    lp, ids = dk.topk_combine(on(backend, stack(0)), on(backend, stack(1)), on(backend, stack(2)))
    order, lse = ref_topk(x, k)
    np.testing.assert_array_equal(host(ids), order)
    want = np.take_along_axis(x.astype(np.float64), order, 1) - lse[:, None]
    got = host(lp)
    fin = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), fin) and not np.isnan(got).any()
    np.testing.assert_allclose(got[fin], want[fin], rtol=0, atol=8 * 2.0 ** -23 * max(1.0, np.abs(want[fin]).max()))


def _draft(rng, batch, depth, k, vocab, scale=2.0):
    x = random_logits(rng, batch * depth, vocab, tie=0.4, ninf=0.1, scale=scale)
    v, i, l = dk.topk_shard(x, k)
    lp, ids = dk.topk_combine(v[None], i[None], l[None])
    return lp.reshape(batch, depth, k), ids.reshape(batch, depth, k)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch,depth,k,budget,vocab", [
    (1, 1, 1, 1, 3), (3, 4, 8, 16, 30), (4, 8, 64, 64, 500), (2, 16, 256, 256, 2000), (2, 32, 512, 512, 5000),
    (1, 32, 2, 300, 2), (3, 3, 3, 100, 3)])
def test_tree_build_against_heapq_reference(backend, batch, depth, k, budget, vocab):
    rng = np.random.default_rng(batch * budget + depth)
    lp, ids = _draft(rng, batch, depth, k, vocab)
    roots = rng.integers(0, vocab, batch).astype(np.int32)
    prefix = rng.integers(0, 4000, batch).astype(np.int32)
    out = dk.tree_build(on(backend, lp), on(backend, ids), on(backend, roots), on(backend, prefix), budget)
    assert dk.status_value(out["status"]) == 0
    for b in range(batch):
        ref = ref_tree_build(lp[b], ids[b], int(roots[b]), int(prefix[b]), budget)
        assert host(out["node_count"])[b] == ref["node_count"]
        for f in ("tokens", "parents", "depths", "slots", "positions", "first_child", "next_sibling", "vis"):
            np.testing.assert_array_equal(host(out[f])[b], ref[f], err_msg=f"{f} request {b}")
        assert host(out["scores"])[b].tobytes() == ref["scores"].tobytes(), f"scores request {b}"


def test_gumbel_noise_reimplementation_is_bit_exact():
    L = dk.lib()
    for seed, pos, tok in [(0, 0, 0), (1, 2, 3), (2**63 + 5, 123456, 163839), (42, 7, 99)]:
        assert np.array(L.ddt_gumbel(seed, pos, tok), F32).tobytes() == np.array(gumbel(seed, pos, tok), F32).tobytes()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.6])
def test_accept_against_plain_decoding_walk(backend, temperature):
    rng = np.random.default_rng(int(temperature * 10) + 3)
    batch, depth, budget, vocab = 6, 5, 24, 40
    n, mp = budget + 1, depth + 1
    lp, ids = _draft(rng, batch, depth, budget, vocab, scale=4.0)
    roots = np.ones(batch, np.int32)
    prefix = rng.integers(0, 100, batch).astype(np.int32)
    tree = dk.tree_build(lp, ids, roots, prefix, budget)
    logits = rng.normal(0, 1, size=(batch, n, vocab)).astype(F32)
    for b in range(batch):
        for i in range(tree["node_count"][b]):
            c = tree["first_child"][b, i]
            if c >= 0 and rng.random() < 0.85:
                logits[b, i, tree["tokens"][b, c]] = 6.0
    seeds = rng.integers(0, 2**63, batch, dtype=np.uint64)
    max_new = np.full(batch, 100, np.int32)
    keys = dk.sample_keys(on(backend, logits), on(backend, tree["positions"]), on(backend, seeds), temperature)
    tree_dev = {f: on(backend, tree[f]) for f in ("tokens", "parents", "node_count")}
    out = dk.accept(keys, tree_dev, mp, on(backend, max_new))
    accepted = 0
    for b in range(batch):
        # Plain decoding, walked directly: sample at node cur for output position prefix + depth + 1.
        cur, path, toks = 0, [0], []
        while True:
            pos = int(prefix[b]) + len(path)
            x = plain_sample(logits[b, cur], temperature, int(seeds[b]), pos)
            toks.append(x)
            c = tree["first_child"][b, cur]
            while c != -1 and tree["tokens"][b, c] != x:
                c = tree["next_sibling"][b, c]
            if c == -1:
                break
            path.append(int(c)); cur = int(c)
        assert host(out["path_len"])[b] == len(path)
        np.testing.assert_array_equal(host(out["path"])[b, :len(path)], path)
        np.testing.assert_array_equal(host(out["new_tokens"])[b, :len(toks)], toks)
        assert host(out["bonus"])[b] == toks[-1]
        accepted += len(path) - 1
    assert accepted > 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", [1, 4])
def test_kv_compact_after_accept_against_numpy_gather(backend, page_size):
    """accept's path moves each accepted node's KV row down to prefix + depth, in every layer: against a numpy
    gather (all sources read first) through a shuffled page table; the remap at page size 1 against the same."""
    rng = np.random.default_rng(11 + page_size)
    batch, depth, budget, vocab, layers, row = 5, 6, 30, 40, 3, 24
    n, mp = budget + 1, depth + 1
    lp, ids = _draft(rng, batch, depth, budget, vocab, scale=4.0)
    prefix = rng.integers(0, 40, batch).astype(np.int32)
    tree = dk.tree_build(lp, ids, np.ones(batch, np.int32), prefix, budget)
    logits = rng.normal(0, 1, size=(batch, n, vocab)).astype(F32)
    for b in range(batch):  # make acceptance happen (deeper nodes than a chain, so rows really move)
        for i in range(tree["node_count"][b]):
            c = tree["first_child"][b, i]
            if c >= 0:
                logits[b, i, tree["tokens"][b, c]] = 6.0
    keys = dk.sample_keys(logits, tree["positions"], None, 0.0)
    out = dk.accept(keys, tree, mp, np.full(batch, 100, np.int32))
    pages_per = (int(prefix.max()) + n + page_size - 1) // page_size
    table = rng.permutation(batch * pages_per).astype(np.int32).reshape(batch, pages_per)
    kv = rng.normal(0, 1, size=(layers, batch * pages_per, page_size, row)).astype(F32)

    def slot_view(a, t):  # [layers, batch, slots, row] through the table
        return a[:, t].reshape(layers, batch, pages_per * page_size, row)

    want = slot_view(kv, table).copy()
    for b in range(batch):
        L = int(out["path_len"][b])
        src = prefix[b] + out["path"][b, :L]
        want[:, b, prefix[b]:prefix[b] + L] = slot_view(kv, table)[:, b, src]  # all sources read first
    moved = sum(int(np.any(out["path"][b, :out["path_len"][b]] != np.arange(out["path_len"][b])))
                for b in range(batch))
    assert moved > 0, "no accepted path moved a row: the test would prove nothing"
    kv_dev, table_dev = on(backend, kv.copy()), on(backend, table.copy())  # (in place: never the originals)
    st = dk.kv_compact(kv_dev, table_dev, on(backend, prefix), on(backend, out["path"]), on(backend, out["path_len"]))
    assert dk.status_value(st) == 0
    np.testing.assert_array_equal(slot_view(host(kv_dev), host(table_dev)), want)
    if page_size == 1:  # the remap: the same slots through the new table, no row moved
        kv_dev, table_dev = on(backend, kv.copy()), on(backend, table.copy())
        st = dk.kv_compact(kv_dev, table_dev, on(backend, prefix), on(backend, out["path"]),
                           on(backend, out["path_len"]), remap=True)
        assert dk.status_value(st) == 0
        np.testing.assert_array_equal(host(kv_dev), kv)
        got = slot_view(kv, host(table_dev))
        for b in range(batch):
            L = int(out["path_len"][b])
            np.testing.assert_array_equal(got[:, b, prefix[b]:prefix[b] + L], want[:, b, prefix[b]:prefix[b] + L])


def test_kv_compact_refuses_mismatched_rows():
    kv = np.zeros((1, 4, 2, 8), F32)
    table = np.arange(4, dtype=np.int32).reshape(2, 2)
    with pytest.raises(ValueError, match="rows"):
        dk.kv_compact(kv, table, [0], [[0, 1]], [2])  # page_table has 2 rows, the path 1
    with pytest.raises(ValueError, match="in place"):
        dk.kv_compact(kv, table.astype(np.int64), [0, 0], [[0], [0]], [1, 1])


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_topk_converts_other_dtypes(dtype):
    rng = np.random.default_rng(7)
    x = random_logits(rng, 3, 50, tie=0.0, ninf=0.0).astype(dtype)
    vals, ids, lse = dk.topk_shard(x, 5)
    order, _ = ref_topk(x.astype(np.float32), 5)
    np.testing.assert_array_equal(ids, order)


def test_errors_raise_with_message():
    x = np.zeros((2, 8), F32)
    with pytest.raises(dk.DDTreeError, match="k out of range"):
        dk.topk_shard(x, 0)
    lp = np.zeros((1, 2, 2), F32)
    with pytest.raises(dk.DDTreeError, match="budget"):
        dk.tree_build(lp, np.zeros((1, 2, 2), np.int32), [0], [0], budget=0)
    with pytest.raises(dk.DDTreeError, match="temperature"):
        dk.sample_keys(np.zeros((1, 1, 4), F32), [[0]], [1], temperature=-1.0)
