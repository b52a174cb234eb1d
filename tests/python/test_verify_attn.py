"""Tree-verify MLA attention through the Python module against references written here.

The references share no code with the library: the problem generator (trees as parent arrays, pages as a
random permutation, NaN poison in unused pages / slots past each request's length / out-of-range page-table
sentinels / vis bits past N), the mask (ancestors by walking the parent array, not the vis rows) and the
attention itself (numpy float64 on the host; PyTorch float32 einsum on the GPU for the large prefixes, P up
to 32k, which the CPU twin is too slow for). Backends: the CPU twin with numpy arrays (and torch CPU bf16
tensors when torch is installed), the CUDA oracle with torch CUDA tensors where a GPU exists (otherwise
reported as skipped). Tolerances: the correctness bar of reference/mla-verify-attention.md.
"""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "kernels", "python"))
import ddtree_kernels as dk  # noqa: E402

try:
    import torch
    HAVE_TORCH = True
    HAVE_CUDA = torch.cuda.is_available() and dk.cuda_available()
except Exception:
    torch = None
    HAVE_TORCH = False
    HAVE_CUDA = False
# The sm_90a kernel runs on compute capability 9.0 only (elsewhere its tests report a skip).
HAVE_SM90 = HAVE_CUDA and torch.cuda.get_device_capability() == (9, 0)

BACKENDS = ["cpu",
            pytest.param("torch_cpu", marks=pytest.mark.skipif(not HAVE_TORCH, reason="no torch")),
            pytest.param("cuda", marks=pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA GPU / torch"))]
QK, V = 576, 512
SCALE = 1.0 / np.sqrt(192.0)
BAD_INDEX = 2


def bf16_bits(x):
    """Independent float -> bf16 (round half to even) via float64 arithmetic on the f32 bit pattern."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    upper, lower = u >> 16, u & 0xFFFF
    up = (lower > 0x8000) | ((lower == 0x8000) & ((upper & 1) == 1))
    return (upper + up).astype(np.uint16)


def widen(h):
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def make_parents(rng, n, shape):
    par = [-1] * n
    for i in range(1, n):
        if shape == "chain":
            par[i] = i - 1
        elif shape == "star":
            par[i] = 0
        elif shape == "deep":
            par[i] = i - 1 if rng.random() < 0.85 else int(rng.integers(max(0, i - 4), i))
        else:  # bushy
            par[i] = int(rng.integers(0, i))
    return par


def make_problem(seed, reqs, heads, page_size, extra_rows=0, q_scale=1.0):
    """reqs: [(P, N, shape)]. Returns a dict of numpy arrays (bf16 as uint16) plus the parent arrays."""
    rng = np.random.default_rng(seed)
    batch = len(reqs)
    need = [-(-(p + n) // page_size) for p, n, _ in reqs]
    max_pages = max(need + [1]) + 2
    num_pages = sum(need) + 3
    perm = rng.permutation(num_pages).astype(np.int32)
    sentinels = np.array([-1, num_pages, 2**31 - 1, -2**31], dtype=np.int64)
    page_table = sentinels[rng.integers(0, 4, size=(batch, max_pages))].astype(np.int32)
    kv = np.full((num_pages, page_size, QK), 0x7FC0, dtype=np.uint16)  # NaN everywhere not used
    nxt = 0
    for r, (p, n, _) in enumerate(reqs):
        page_table[r, :need[r]] = perm[nxt:nxt + need[r]]
        nxt += need[r]
        slots = np.arange(p + n)
        kv[page_table[r, slots // page_size], slots % page_size] = bf16_bits(rng.standard_normal((p + n, QK)))
    offsets = np.concatenate([[0], np.cumsum([n for _, n, _ in reqs])]).astype(np.int32)
    total = int(offsets[-1]) + extra_rows
    W = max([(n + 63) // 64 for _, n, _ in reqs] + [1])
    vis = rng.integers(0, 2**63, size=(total, W), dtype=np.int64).astype(np.uint64)  # garbage; rows set below
    parents = []
    for r, (p, n, shape) in enumerate(reqs):
        par = make_parents(rng, n, shape)
        parents.append(par)
        for i in range(n):
            row = vis[offsets[r] + i]
            bits = set()
            a = i
            while a >= 0:
                bits.add(a)
                a = par[a]
            for b in range(64 * W):  # garbage stays only past N
                word, bit = b // 64, np.uint64(1) << np.uint64(b % 64)
                if b in bits:
                    row[word] |= bit
                elif b < n:
                    row[word] &= ~bit
    q = bf16_bits(q_scale * rng.standard_normal((total, heads, QK)))
    return dict(q=q, kv=kv, page_table=page_table, prefix=np.array([p for p, _, _ in reqs], dtype=np.int32),
                offsets=offsets, vis=vis, parents=parents, reqs=reqs, page_size=page_size, heads=heads, total=total)


def visibility(pb, r):
    """[n, p + n] bool: key j visible to node i of request r (the whole prefix, then the node's ancestors and
    itself, walked through the parent array: independent of the vis bit rows the kernels read)."""
    p, n, _ = pb["reqs"][r]
    mask = np.zeros((n, p + n), dtype=bool)
    mask[:, :p] = True
    for i in range(n):
        a = i
        while a >= 0:
            mask[i, p + a] = True
            a = pb["parents"][r][a]
    return mask


def reference_np(pb, with_mass=False):
    """float64 attention: dense gather through the page table, mask from the parent arrays. with_mass: also
    mass [total, H, 512] = sum_j p_j |v_jd| / l, the scale of a rounded P's error (the bf16-P bar)."""
    H, total = pb["heads"], pb["total"]
    out = np.zeros((total, H, V))
    mass = np.zeros((total, H, V))
    lse = np.full((total, H), -np.inf)
    for r, (p, n, _) in enumerate(pb["reqs"]):
        if n == 0:
            continue
        slots = np.arange(p + n)
        K = widen(pb["kv"][pb["page_table"][r, slots // pb["page_size"]], slots % pb["page_size"]]).astype(np.float64)
        mask = visibility(pb, r)
        rows = slice(pb["offsets"][r], pb["offsets"][r] + n)
        Q = widen(pb["q"][rows]).astype(np.float64)                 # [n, H, 576]
        s = SCALE * np.einsum("nhd,kd->nhk", Q, K)
        s = np.where(mask[:, None, :], s, -np.inf)
        m = s.max(axis=2, keepdims=True)
        e = np.exp(s - m)
        out[rows] = np.einsum("nhk,kd->nhd", e, K[:, :V]) / e.sum(axis=2, keepdims=True)
        mass[rows] = np.einsum("nhk,kd->nhd", e, np.abs(K[:, :V])) / e.sum(axis=2, keepdims=True)
        lse[rows] = m[:, :, 0] + np.log(e.sum(axis=2))
    return (out, lse, mass) if with_mass else (out, lse)


def check_bar(out_bits, lse, ref_out, ref_lse, rows=None, mass=None):
    """reference/mla-verify-attention.md: out abs 8e-4 or rel 2/128, cosine diff < 5e-6; lse abs 1e-6 or
    rel 8/65536. Padding rows: exactly 0 / -inf. mass (reference_np's): the bf16-P bar (kernels.h
    DDT_ATTN_P_BF16): out within the bar plus 2^-8 x mass."""
    o = widen(dk.to_numpy(out_bits)).astype(np.float64)
    lse = dk.to_numpy(lse).astype(np.float64)
    if rows is not None:
        o, lse, ref_out, ref_lse = o[rows], lse[rows], ref_out[rows], ref_lse[rows]
        mass = None if mass is None else mass[rows]
    assert not np.isnan(o).any() and not np.isnan(lse).any(), "unexpected NaN in the output"
    err = np.abs(o - ref_out)
    slack = 0.0 if mass is None else mass / 256
    ok = err <= np.maximum(8e-4, (2 / 128) * np.abs(ref_out)) + slack
    assert ok.all(), f"{(~ok).sum()} elements off; worst abs err {err.max():.3g}"
    cos = 1 - (o * ref_out).sum() / np.sqrt((o * o).sum() * (ref_out * ref_out).sum())
    assert cos < 5e-6, f"cosine difference {cos:.3g}"
    fin = np.isfinite(ref_lse)
    assert (lse[~fin] == ref_lse[~fin]).all()
    lerr = np.abs(lse[fin] - ref_lse[fin])
    assert ((lerr <= 1e-6) | (lerr <= 8 / 65536 * np.abs(ref_lse[fin]))).all(), f"lse worst err {lerr.max():.3g}"
    return err.max(), cos


def on(backend, pb):
    """The problem's arrays for a backend: numpy for cpu, torch tensors (CPU / CUDA) otherwise."""
    names = ("q", "kv", "page_table", "prefix", "offsets", "vis")
    if backend == "cpu":
        return [pb[k] for k in names]
    dev = "cuda" if backend == "cuda" else "cpu"
    t = []
    for k in names:
        a = np.ascontiguousarray(pb[k])
        if a.dtype == np.uint16:
            t.append(torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(dev))
        elif a.dtype == np.uint64:
            t.append(torch.from_numpy(a.view(np.int64)).to(dev).view(torch.uint64))
        else:
            t.append(torch.from_numpy(a).to(dev))
    return t


def run(backend, pb, scale=SCALE, kernel="oracle", p_precision="hilo"):
    q, kv, pt, pre, off, vis = on(backend, pb)
    return dk.verify_attn(q, kv, pt, pre, off, vis, scale, pb["page_size"], kernel=kernel, p_precision=p_precision)


CASES = [  # (seed, reqs, heads, page_size, extra_rows)
    (1, [(0, 1, "chain")], 1, 1, 0),
    (2, [(63, 7, "star")], 16, 7, 0),
    (3, [(65, 9, "bushy"), (0, 64, "deep"), (1, 2, "chain"), (300, 0, "chain"), (64, 65, "bushy")], 8, 64, 3),
    (4, [(300, 63, "deep")], 8, 1, 0),
    (5, [(1, 128, "bushy"), (64, 8, "chain")], 8, 5, 1),
]


@pytest.mark.parametrize("backend", BACKENDS + [
    pytest.param("cuda-portable", marks=pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA GPU / torch")),
    pytest.param("cuda-sm90", marks=pytest.mark.skipif(not HAVE_SM90, reason="no compute capability 9.0 GPU")),
    pytest.param("cuda-sm90-plan", marks=pytest.mark.skipif(not HAVE_SM90, reason="no compute capability 9.0 GPU"))])
@pytest.mark.parametrize("seed,reqs,heads,page,extra", CASES)
def test_verify_attn_against_float64_reference(backend, seed, reqs, heads, page, extra):
    pb = make_problem(seed, reqs, heads, page, extra)
    kernel = backend[5:] if backend.startswith("cuda-") else "oracle"
    backend = "cuda" if backend.startswith("cuda-") else backend
    out, lse, st = run(backend, pb, kernel=kernel)
    if backend != "cpu":
        assert out.dtype == torch.bfloat16 and out.device.type == ("cuda" if backend == "cuda" else "cpu")
    assert tuple(out.shape) == (pb["total"], heads, V) and tuple(lse.shape) == (pb["total"], heads)
    assert dk.status_value(st) == 0
    ref_out, ref_lse = reference_np(pb)
    check_bar(out, lse, ref_out, ref_lse)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_page_poisons_only_its_request(backend):
    pb = make_problem(11, [(40, 5, "bushy"), (100, 9, "deep"), (0, 3, "chain")], 4, 16)
    pb["page_table"][1, 3] = -1
    out, lse, st = run(backend, pb)
    assert dk.status_value(st) == BAD_INDEX
    o, l = widen(dk.to_numpy(out)), dk.to_numpy(lse)
    bad = slice(pb["offsets"][1], pb["offsets"][2])
    assert np.isnan(o[bad]).all() and np.isnan(l[bad]).all()
    good = np.r_[pb["offsets"][0]:pb["offsets"][1], pb["offsets"][2]:pb["offsets"][3]]
    ref_out, ref_lse = reference_np(make_problem(11, [(40, 5, "bushy"), (100, 9, "deep"), (0, 3, "chain")], 4, 16))
    check_bar(out, lse, ref_out, ref_lse, rows=good)


def test_float_inputs_are_rounded_and_errors_raise():
    pb = make_problem(21, [(10, 4, "chain")], 2, 4)
    a, la, _ = run("cpu", pb)
    qf, kvf = widen(pb["q"]), widen(pb["kv"])  # exact floats of the same bf16 values
    b, lb, _ = dk.verify_attn(qf, kvf, pb["page_table"], pb["prefix"], pb["offsets"], pb["vis"], SCALE, 4)
    assert (dk.to_numpy(a) == dk.to_numpy(b)).all() and np.array_equal(la, lb)
    with pytest.raises(dk.DDTreeError, match="softmax_scale"):
        dk.verify_attn(pb["q"], pb["kv"], pb["page_table"], pb["prefix"], pb["offsets"], pb["vis"], float("nan"), 4)
    with pytest.raises(ValueError):
        dk.verify_attn(pb["q"][:, :, :512], pb["kv"], pb["page_table"], pb["prefix"], pb["offsets"], pb["vis"], SCALE, 4)
    with pytest.raises(ValueError):
        dk.verify_attn(pb["q"], pb["kv"], pb["page_table"], pb["prefix"], pb["offsets"], pb["vis"], SCALE, 3)
    with pytest.raises(ValueError, match="CUDA tensors only"):  # the flash kernel has no CPU path
        dk.verify_attn(pb["q"], pb["kv"], pb["page_table"], pb["prefix"], pb["offsets"], pb["vis"], SCALE, 4,
                       kernel="portable")


def test_p_precision_is_checked_and_the_reference_kernels_ignore_it():
    """p_precision "bf16" lets the flash kernels round P; the CPU twin computes at the default precision for
    either value (bitwise the same); an unknown value raises before any call."""
    pb = make_problem(23, [(70, 33, "bushy"), (0, 5, "chain")], 8, 64, q_scale=6.0)
    a, la, _ = run("cpu", pb)
    b, lb, _ = run("cpu", pb, p_precision="bf16")
    assert np.array_equal(dk.to_numpy(a), dk.to_numpy(b)) and np.array_equal(la, lb)
    with pytest.raises(ValueError, match="p_precision"):
        run("cpu", pb, p_precision="fp8")


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA GPU / torch")
@pytest.mark.parametrize("kernel", ["portable", pytest.param(
    "sm90", marks=pytest.mark.skipif(not HAVE_SM90, reason="no compute capability 9.0 GPU")), pytest.param(
    "sm90-plan", marks=pytest.mark.skipif(not HAVE_SM90, reason="no compute capability 9.0 GPU"))])
def test_flash_p_bf16_meets_its_bar_and_keeps_lse(kernel):
    """p_precision "bf16" on peaked rows (a 128-node tree, and decode rows: the narrow path): the output changes
    (the mode took effect), meets the bf16-P bar against float64, misses the default bar somewhere (so the bar's
    extra term is what admits it), and lse is bitwise the default's."""
    pb = make_problem(29, [(1, 128, "bushy"), (600, 1, "chain"), (300, 2, "chain")], 8, 64, q_scale=6.0)
    ref_out, ref_lse, mass = reference_np(pb, with_mass=True)
    o0, l0, s0 = run("cuda", pb, kernel=kernel)
    o1, l1, s1 = run("cuda", pb, kernel=kernel, p_precision="bf16")
    assert dk.status_value(s0) == 0 and dk.status_value(s1) == 0
    check_bar(o0, l0, ref_out, ref_lse)
    err, cos = check_bar(o1, l1, ref_out, ref_lse, mass=mass)
    assert not np.array_equal(dk.to_numpy(o0), dk.to_numpy(o1)), "p_precision='bf16' had no effect"
    assert np.array_equal(dk.to_numpy(l0), dk.to_numpy(l1)), "lse changed with p_precision"
    with pytest.raises(AssertionError, match="elements off"):
        check_bar(o1, l1, ref_out, ref_lse)
    print(f"{kernel} bf16 P: max abs err {err:.3g}, cosine diff {cos:.3g}")


def test_bf16_helpers_round_half_to_even():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(100000).astype(np.float32) * np.float32(10.0) ** rng.integers(-30, 30, 100000)
    x = np.concatenate([x.astype(np.float32), np.array([1.00390625, 1.01171875, 3.3963e38, np.inf, -np.inf, 0.0, -0.0],
                                                        dtype=np.float32)])
    assert np.array_equal(dk.bf16_from_f32(x), bf16_bits(x))
    assert np.array_equal(widen(dk.bf16_from_f32(x)), dk.bf16_to_f32(dk.bf16_from_f32(x)))
    assert np.isnan(dk.bf16_to_f32(dk.bf16_from_f32(np.array([np.nan], dtype=np.float32)))).all()
    if HAVE_TORCH:  # PyTorch's own rounding agrees
        t = torch.from_numpy(x).to(torch.bfloat16)
        assert np.array_equal(dk.to_numpy(t), dk.bf16_from_f32(x))


# ---- large prefixes on the GPU against a PyTorch float32 reference ----
def reference_torch(pb, dev="cuda"):
    """float32 attention on the GPU (einsum), dense gather through the page table, mask from the parents."""
    H = pb["heads"]
    kv = torch.from_numpy(widen(pb["kv"]).reshape(-1, QK)).to(dev)
    q = torch.from_numpy(widen(pb["q"])).to(dev)
    out = torch.zeros((pb["total"], H, V), device=dev)
    lse = torch.full((pb["total"], H), float("-inf"), device=dev)
    for r, (p, n, _) in enumerate(pb["reqs"]):
        slots = np.arange(p + n)
        rows_in_cache = pb["page_table"][r, slots // pb["page_size"]].astype(np.int64) * pb["page_size"] + slots % pb["page_size"]
        K = kv[torch.from_numpy(rows_in_cache).to(dev)]                      # [keys, 576]
        mask = visibility(pb, r)
        Q = q[pb["offsets"][r]:pb["offsets"][r + 1]]                         # [n, H, 576]
        s = torch.einsum("nhd,kd->nhk", Q, K) * SCALE
        s = s.masked_fill(~torch.from_numpy(mask).to(dev)[:, None, :], float("-inf"))
        lse[pb["offsets"][r]:pb["offsets"][r + 1]] = torch.logsumexp(s, dim=-1)
        out[pb["offsets"][r]:pb["offsets"][r + 1]] = torch.einsum("nhk,kd->nhd", torch.softmax(s, dim=-1), K[:, :V])
    return out.double().cpu().numpy(), lse.double().cpu().numpy()


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA GPU / torch")
@pytest.mark.parametrize("kernel", ["oracle", "portable", pytest.param(
    "sm90", marks=pytest.mark.skipif(not HAVE_SM90, reason="no compute capability 9.0 GPU")), pytest.param(
    "sm90-plan", marks=pytest.mark.skipif(not HAVE_SM90, reason="no compute capability 9.0 GPU"))])
@pytest.mark.parametrize("reqs,heads,page", [
    ([(4096, 64, "bushy"), (2047, 8, "chain")], 8, 64),
    ([(32768, 16, "deep"), (32767, 1, "chain"), (12345, 65, "star")], 8, 64),
    ([(32768, 8, "bushy")], 16, 1),
    ([(20000, 128, "deep")], 8, 64),
])
def test_large_prefix_cuda_kernels_against_torch_fp32(reqs, heads, page, kernel):
    pb = make_problem(sum(p for p, _, _ in reqs), reqs, heads, page)
    torch.backends.cuda.matmul.allow_tf32 = False
    out, lse, st = run("cuda", pb, kernel=kernel)
    assert dk.status_value(st) == 0
    ref_out, ref_lse = reference_torch(pb)
    err, cos = check_bar(out, lse, ref_out, ref_lse)
    print(f"{kernel}: P={[p for p, _, _ in reqs]} N={[n for _, n, _ in reqs]} H={heads} page={page}: max abs err {err:.3g}, "
          f"cosine diff {cos:.3g}")


# ---- the sm_90a kernel's per-step plan object (verify_attn_plan) ----
BAD_PLAN = 4
PLAN_MAGIC = 0x4E4C5044  # "DPLN"
PLAN_REQS = [(700, 9, "bushy"), (64, 1, "chain"), (1500, 20, "deep"), (0, 3, "star")]


def plan_of(backend, pb, split_keys=512):
    q, kv, pt, pre, off, vis = on(backend, pb)
    return dk.verify_attn_plan(q, kv, pt, pre, off, vis, SCALE, pb["page_size"], split_keys=split_keys)


def plan_bytes(plan):
    return np.asarray(dk.to_numpy(plan.data), dtype=np.uint8)


def plan_listed(plan):
    """The defined bytes of a plan: the 64-byte header and its listed 32-byte items (the rest of the buffer, up to
    the capacity, is never written)."""
    b = plan_bytes(plan)
    return b[:64 + 32 * int(b[:64].view(np.int32)[8])]


def test_verify_attn_plan_cpu_twin_header():
    pb = make_problem(31, PLAN_REQS, 8, 64, extra_rows=2)
    plan = plan_of("cpu", pb)
    b = plan_bytes(plan)
    h = b[:64].view(np.int32)
    assert len(plan) == b.size and b.size >= 64 and (b.size - 64) % 32 == 0
    # magic, batch, heads, split_keys, total_nodes, page_size, max_pages, vis_words, items, offsets_bad, rows_end
    assert h[0] == PLAN_MAGIC
    assert list(h[1:8]) == [len(PLAN_REQS), 8, 512, pb["total"], 64, pb["page_table"].shape[1], pb["vis"].shape[1]]
    assert h[8] > 0 and 64 + 32 * h[8] <= b.size
    assert h[9] == 0 and h[10] == pb["offsets"][-1]
    assert np.array_equal(plan_listed(plan_of("cpu", pb)), plan_listed(plan))  # deterministic
    pb["prefix"][2] -= 700  # another step's lengths: another plan
    assert not np.array_equal(plan_listed(plan_of("cpu", pb)), plan_listed(plan))


def test_verify_attn_plan_errors_raise():
    pb = make_problem(32, PLAN_REQS, 8, 64)
    with pytest.raises(dk.DDTreeError):
        plan_of("cpu", pb, split_keys=100)  # not a multiple of 32
    if HAVE_CUDA:
        q, kv, pt, pre, off, vis = on("cuda", pb)
        host_plan = plan_of("cpu", pb)
        with pytest.raises(ValueError):  # a host plan for CUDA tensors
            dk.verify_attn(q, kv, pt, pre, off, vis, SCALE, 64, kernel="sm90-plan", plan=host_plan)


@pytest.mark.skipif(not HAVE_SM90, reason="no compute capability 9.0 GPU")
def test_verify_attn_plan_cuda_equals_cpu_twin_and_is_reused_across_layers():
    pb = make_problem(33, PLAN_REQS, 8, 64, extra_rows=2)
    plan = plan_of("cuda", pb)
    assert np.array_equal(plan_listed(plan), plan_listed(plan_of("cpu", pb)))
    rng = np.random.default_rng(34)
    q, kv, pt, pre, off, vis = on("cuda", pb)
    for layer in range(3):  # new q and KV values per layer (sign bits flipped at random; NaN poison stays NaN)
        if layer > 0:
            q = (q.view(torch.int16) ^ torch.from_numpy(
                (rng.integers(0, 2, q.shape) << 15).astype(np.int16)).cuda()).view(torch.bfloat16)
            kv = (kv.view(torch.int16) ^ torch.from_numpy(
                (rng.integers(0, 2, kv.shape) << 15).astype(np.int16)).cuda()).view(torch.bfloat16)
        o1, l1, s1 = dk.verify_attn(q, kv, pt, pre, off, vis, SCALE, 64, kernel="sm90-plan", plan=plan)
        o0, l0, s0 = dk.verify_attn(q, kv, pt, pre, off, vis, SCALE, 64, kernel="sm90")
        assert dk.status_value(s1) == dk.status_value(s0) == 0
        assert torch.equal(o1.view(torch.int16), o0.view(torch.int16)) and torch.equal(l1.view(torch.int32), l0.view(torch.int32))
    ref_out, ref_lse = reference_np({**pb, "q": dk.to_numpy(q.view(torch.int16)).view(np.uint16),
                                     "kv": dk.to_numpy(kv.view(torch.int16)).view(np.uint16)})
    check_bar(o1, l1, ref_out, ref_lse)


@pytest.mark.skipif(not HAVE_SM90, reason="no compute capability 9.0 GPU")
def test_verify_attn_plan_for_other_params_poisons_every_row():
    pb = make_problem(35, PLAN_REQS, 8, 64)
    other = make_problem(35, PLAN_REQS, 16, 64)  # other scalars (heads; a plan at least as large)
    plan = plan_of("cuda", other)
    q, kv, pt, pre, off, vis = on("cuda", pb)
    out, lse, st = dk.verify_attn(q, kv, pt, pre, off, vis, SCALE, 64, kernel="sm90-plan", plan=plan)
    assert dk.status_value(st) & BAD_PLAN
    assert torch.isnan(out.float()).all() and torch.isnan(lse).all()
    with pytest.raises(ValueError):  # made for another split length
        dk.verify_attn(q, kv, pt, pre, off, vis, SCALE, 64, kernel="sm90-plan", split_keys=256, plan=plan)
