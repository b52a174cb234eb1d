"""ddtree_kernels: Python bindings (ctypes) for ddtree-engine's kernel C ABI (kernels/include/ddtree/kernels.h).

How an engine such as SGLang or vLLM would call these kernels, and how the tests compare them against
independent references. Arrays are numpy arrays (host, CPU twins) or PyTorch tensors (CUDA tensors run
the CUDA kernels on the current stream; CPU tensors run the CPU twins). Outputs are allocated with the
input's library and device. Errors raise DDTreeError with the library's message.

    import ddtree_kernels as dk
    vals, ids, lse = dk.topk_shard(logits, k=64)            # [rows, vocab] -> [rows, k], [rows, k], [rows]
    lp, ids = dk.topk_combine(vals[None], ids[None], lse[None])
    tree = dk.tree_build(lp.reshape(B, L, k), ids.reshape(B, L, k), roots, prefix_lens, budget=64)
    keys = dk.sample_keys(target_logits, tree["positions"], seeds, temperature=0.0)
    out = dk.accept(keys, tree, max_path=L + 1, max_new=max_new, stop_ids=stops)
    dk.kv_compact(kv, page_table, prefix_lens, out["path"], out["path_len"])  # in place, every layer
    o, lse, st = dk.verify_attn(q, kv, page_table, prefix_lens, node_offsets, vis, softmax_scale, page_size)

The library is found through $DDTREE_KERNELS_LIB, else build*/lib/libddtree_kernels.so under the repo.
PyTorch tensors need torch >= 2.3 (unsigned dtypes torch.uint32 / torch.uint64 for keys and status words).
"""
from __future__ import annotations

import ctypes
import glob
import os

import numpy as np

try:  # optional: PyTorch tensors (GPU machine)
    import torch  # type: ignore
except Exception:  # pragma: no cover - torch is optional
    torch = None

_c_float_p = ctypes.c_void_p


class DDTreeError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"{message} (status {status})")
        self.status = status


class _TopkShard(ctypes.Structure):
    _fields_ = [("logits", ctypes.c_void_p), ("ld", ctypes.c_int64), ("rows", ctypes.c_int), ("vocab", ctypes.c_int),
                ("vocab_offset", ctypes.c_int), ("k", ctypes.c_int), ("out_values", ctypes.c_void_p),
                ("out_ids", ctypes.c_void_p), ("out_lse", ctypes.c_void_p), ("status", ctypes.c_void_p)]


class _TopkCombine(ctypes.Structure):
    _fields_ = [("values", ctypes.c_void_p), ("ids", ctypes.c_void_p), ("lse", ctypes.c_void_p),
                ("shards", ctypes.c_int), ("rows", ctypes.c_int), ("k", ctypes.c_int),
                ("out_logprobs", ctypes.c_void_p), ("out_ids", ctypes.c_void_p)]


class _TreeBuild(ctypes.Structure):
    _fields_ = [("logprobs", ctypes.c_void_p), ("token_ids", ctypes.c_void_p), ("root_tokens", ctypes.c_void_p),
                ("prefix_lens", ctypes.c_void_p), ("batch", ctypes.c_int), ("depth", ctypes.c_int),
                ("k", ctypes.c_int), ("budget", ctypes.c_int)] + [
                   (n, ctypes.c_void_p) for n in ("tokens", "parents", "depths", "scores", "slots", "positions", "vis",
                                                  "first_child", "next_sibling", "node_count", "status")]


class _SampleKeys(ctypes.Structure):
    _fields_ = [("logits", ctypes.c_void_p), ("ld", ctypes.c_int64), ("batch", ctypes.c_int), ("nodes", ctypes.c_int),
                ("vocab", ctypes.c_int), ("vocab_offset", ctypes.c_int), ("positions", ctypes.c_void_p),
                ("seeds", ctypes.c_void_p), ("temperature", ctypes.c_float), ("out_keys", ctypes.c_void_p),
                ("status", ctypes.c_void_p)]


class _Accept(ctypes.Structure):
    _fields_ = [("keys", ctypes.c_void_p), ("tokens", ctypes.c_void_p), ("parents", ctypes.c_void_p),
                ("node_count", ctypes.c_void_p), ("batch", ctypes.c_int), ("n", ctypes.c_int),
                ("max_path", ctypes.c_int), ("max_new", ctypes.c_void_p), ("stop_ids", ctypes.c_void_p),
                ("num_stop", ctypes.c_int)] + [
                   (n, ctypes.c_void_p) for n in ("path", "path_len", "new_tokens", "num_new", "bonus", "finished",
                                                  "status")]


class _KvCompact(ctypes.Structure):
    _fields_ = [("kv", ctypes.c_void_p), ("layer_stride", ctypes.c_int64), ("num_layers", ctypes.c_int),
                ("row_bytes", ctypes.c_int), ("page_size", ctypes.c_int), ("num_pages", ctypes.c_int64),
                ("page_table", ctypes.c_void_p), ("max_pages", ctypes.c_int), ("prefix_lens", ctypes.c_void_p),
                ("path", ctypes.c_void_p), ("path_len", ctypes.c_void_p), ("batch", ctypes.c_int),
                ("max_path", ctypes.c_int), ("remap", ctypes.c_int), ("status", ctypes.c_void_p)]


class _VerifyAttn(ctypes.Structure):
    _fields_ = [("q", ctypes.c_void_p), ("kv_cache", ctypes.c_void_p), ("page_table", ctypes.c_void_p),
                ("prefix_lens", ctypes.c_void_p), ("node_offsets", ctypes.c_void_p), ("vis", ctypes.c_void_p),
                ("batch", ctypes.c_int), ("total_nodes", ctypes.c_int), ("heads", ctypes.c_int),
                ("page_size", ctypes.c_int), ("max_pages", ctypes.c_int), ("num_pages", ctypes.c_int64),
                ("vis_words", ctypes.c_int), ("softmax_scale", ctypes.c_float), ("out", ctypes.c_void_p),
                ("lse", ctypes.c_void_p), ("status", ctypes.c_void_p), ("p_precision", ctypes.c_int)]


_lib = None


def library_path() -> str:
    env = os.environ.get("DDTREE_KERNELS_LIB")
    if env:
        return env
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    found = sorted(glob.glob(os.path.join(root, "build*", "lib", "libddtree_kernels.so")), key=os.path.getmtime)
    if not found:
        raise FileNotFoundError("libddtree_kernels.so not found: build the project or set DDTREE_KERNELS_LIB")
    return found[-1]


def lib():
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL(library_path())
        _lib.ddt_last_error_message.restype = ctypes.c_char_p
        _lib.ddt_status_string.restype = ctypes.c_char_p
        _lib.ddt_gumbel.restype = ctypes.c_float
        _lib.ddt_gumbel.argtypes = [ctypes.c_uint64, ctypes.c_int64, ctypes.c_int32]
        for name in ("topk_shard", "topk_combine", "tree_build", "sample_keys", "accept", "verify_attn", "kv_compact"):
            getattr(_lib, f"ddt_{name}_cpu").argtypes = [ctypes.c_void_p]
            getattr(_lib, f"ddt_{name}_cuda").argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        _lib.ddt_verify_attn_portable_workspace.argtypes = [ctypes.c_void_p, ctypes.c_int,
                                                             ctypes.POINTER(ctypes.c_size_t)]
        for name in ("portable", "sm90"):
            getattr(_lib, f"ddt_verify_attn_{name}_cuda").argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                                                      ctypes.c_size_t, ctypes.c_void_p]
        _lib.ddt_verify_attn_sm90_plan_bytes.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_size_t)]
        _lib.ddt_verify_attn_sm90_plan_cuda.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                                                        ctypes.c_void_p]
        _lib.ddt_verify_attn_sm90_plan_cpu.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        _lib.ddt_verify_attn_sm90_planned_cuda.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                                           ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                                           ctypes.c_void_p]
    return _lib


def cuda_available() -> bool:
    return bool(lib().ddt_cuda_available())


# ---- array helpers: numpy or torch, host or device ----
def _is_torch(x) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def _is_cuda(x) -> bool:
    return _is_torch(x) and x.is_cuda


_NP = {"f32": np.float32, "i32": np.int32, "u64": np.uint64, "u32": np.uint32, "bf16": np.uint16}


def _torch_dtype(kind):
    return {"f32": torch.float32, "i32": torch.int32, "u64": torch.uint64, "u32": torch.uint32,
            "bf16": torch.bfloat16}[kind]


def _like(ref, shape, kind, fill=None):
    if _is_torch(ref):
        if fill == 0:
            return torch.zeros(shape, dtype=_torch_dtype(kind), device=ref.device)
        t = torch.empty(shape, dtype=_torch_dtype(kind), device=ref.device)
        if fill is not None:
            t.fill_(fill)
        return t
    a = np.empty(shape, dtype=_NP[kind])
    if fill is not None:
        a.fill(fill)
    return a


def _as(ref, x, kind):
    """x converted to the library/device of ref with dtype kind, contiguous."""
    if _is_torch(ref):
        if not _is_torch(x):
            x = torch.as_tensor(np.asarray(x, dtype=_NP[kind]))
        return x.to(device=ref.device, dtype=_torch_dtype(kind)).contiguous()
    if _is_torch(x):
        x = x.cpu().numpy()
    return np.ascontiguousarray(x, dtype=_NP[kind])


def _ptr(x) -> int:
    if x is None:
        return 0
    return x.data_ptr() if _is_torch(x) else x.ctypes.data


def _call(name: str, params, ref):
    L = lib()
    if _is_cuda(ref):
        with torch.cuda.device(ref.device):  # the kernels launch on the current device
            stream = torch.cuda.current_stream(ref.device).cuda_stream
            rc = getattr(L, f"ddt_{name}_cuda")(ctypes.byref(params), ctypes.c_void_p(stream))
    else:
        rc = getattr(L, f"ddt_{name}_cpu")(ctypes.byref(params))
    if rc != 0:
        raise DDTreeError(rc, f"ddt_{name}: {L.ddt_status_string(rc).decode()}: {L.ddt_last_error_message().decode()}")


def _status_word(ref):
    return _like(ref, (1,), "u32", 0)


def to_numpy(x) -> np.ndarray:
    """Host numpy copy of a numpy array or torch tensor (unsigned torch dtypes through a same-size view)."""
    if not _is_torch(x):
        return np.asarray(x)
    x = x.detach().cpu()
    if x.dtype == torch.bfloat16:  # bf16 bit patterns as uint16 (bf16_to_f32 widens them)
        return x.view(torch.int16).numpy().view(np.uint16)
    if x.dtype == torch.uint64:
        return x.view(torch.int64).numpy().view(np.uint64)
    if x.dtype == torch.uint32:
        return x.view(torch.int32).numpy().view(np.uint32)
    return x.numpy()


def status_value(st) -> int:
    return int(to_numpy(st)[0])


# ---- kernels ----
def topk_shard(logits, k: int, vocab_offset: int = 0, status=None):
    """[rows, vocab] f32 -> (values [rows, k] f32, ids [rows, k] i32, lse [rows] f32). Rows may be strided."""
    rows, vocab = logits.shape
    is_f32 = (logits.dtype == torch.float32) if _is_torch(logits) else (logits.dtype == np.float32)
    unit_stride = logits.stride(1) == 1 if _is_torch(logits) else logits.strides[1] == logits.itemsize
    if not (is_f32 and unit_stride):  # any other dtype or column stride: a contiguous f32 copy
        logits = _as(logits, logits, "f32")
    ld = logits.stride(0) if _is_torch(logits) else logits.strides[0] // logits.itemsize
    vals, ids, lse = _like(logits, (rows, k), "f32"), _like(logits, (rows, k), "i32"), _like(logits, (rows,), "f32")
    st = status if status is not None else _status_word(logits)
    p = _TopkShard(_ptr(logits), ld, rows, vocab, vocab_offset, k, _ptr(vals), _ptr(ids), _ptr(lse), _ptr(st))
    _call("topk_shard", p, logits)
    return vals, ids, lse


def topk_combine(values, ids, lse):
    """[S, rows, k] values / ids and [S, rows] lse -> (logprobs [rows, k], ids [rows, k])."""
    S, rows, k = values.shape
    values, ids, lse = _as(values, values, "f32"), _as(values, ids, "i32"), _as(values, lse, "f32")
    out_lp, out_ids = _like(values, (rows, k), "f32"), _like(values, (rows, k), "i32")
    p = _TopkCombine(_ptr(values), _ptr(ids), _ptr(lse), S, rows, k, _ptr(out_lp), _ptr(out_ids))
    _call("topk_combine", p, values)
    return out_lp, out_ids


def tree_build(logprobs, token_ids, root_tokens, prefix_lens, budget: int, status=None) -> dict:
    """[batch, depth, k] log-probs / ids + [batch] roots, prefix lens -> dict of tree arrays (N = budget + 1)."""
    batch, depth, k = logprobs.shape
    ref = logprobs
    logprobs, token_ids = _as(ref, logprobs, "f32"), _as(ref, token_ids, "i32")
    root_tokens, prefix_lens = _as(ref, root_tokens, "i32"), _as(ref, prefix_lens, "i32")
    n = budget + 1
    w = (n + 63) // 64
    out = {name: _like(ref, (batch, n), "i32") for name in
           ("tokens", "parents", "depths", "slots", "positions", "first_child", "next_sibling")}
    out["scores"] = _like(ref, (batch, n), "f32")
    out["vis"] = _like(ref, (batch, n, w), "u64")
    out["node_count"] = _like(ref, (batch,), "i32")
    st = status if status is not None else _status_word(ref)
    p = _TreeBuild(_ptr(logprobs), _ptr(token_ids), _ptr(root_tokens), _ptr(prefix_lens), batch, depth, k, budget,
                   *[_ptr(out[f]) for f in ("tokens", "parents", "depths", "scores", "slots", "positions", "vis",
                                            "first_child", "next_sibling", "node_count")], _ptr(st))
    _call("tree_build", p, ref)
    out["status"] = st
    return out


def sample_keys(logits, positions, seeds, temperature: float, vocab_offset: int = 0, status=None):
    """[batch, nodes, vocab] f32 logits + [batch, nodes] positions + [batch] seeds -> [batch, nodes] u64 keys."""
    batch, nodes, vocab = logits.shape
    logits = _as(logits, logits, "f32")
    positions = _as(logits, positions, "i32")
    seeds = _as(logits, seeds, "u64") if seeds is not None else None
    keys = _like(logits, (batch, nodes), "u64")
    st = status if status is not None else _status_word(logits)
    p = _SampleKeys(_ptr(logits), vocab, batch, nodes, vocab, vocab_offset, _ptr(positions), _ptr(seeds),
                    float(temperature), _ptr(keys), _ptr(st))
    _call("sample_keys", p, logits)
    return keys


def accept(keys, tree: dict, max_path: int, max_new, stop_ids=(), status=None) -> dict:
    """Walks each tree with the per-node target keys. Returns path, path_len, new_tokens, num_new, bonus, finished."""
    batch, n = keys.shape
    ref = keys
    keys = _as(ref, keys, "u64")
    tokens, parents = _as(ref, tree["tokens"], "i32"), _as(ref, tree["parents"], "i32")
    count = _as(ref, tree["node_count"], "i32")
    if tuple(tokens.shape) != (batch, n) or tuple(parents.shape) != (batch, n) or tuple(count.shape) != (batch,):
        raise ValueError(f"accept: tree arrays must be [batch, n] = [{batch}, {n}] and node_count [batch]")
    max_new = _as(ref, np.broadcast_to(to_numpy(max_new), (batch,)).copy(), "i32")  # (a writable copy for torch)
    stop_list = [int(x) for x in to_numpy(stop_ids).reshape(-1)] if len(stop_ids) else []
    stops = _as(ref, stop_list, "i32") if stop_list else None
    out = {"path": _like(ref, (batch, max_path), "i32"), "new_tokens": _like(ref, (batch, max_path), "i32")}
    for f in ("path_len", "num_new", "bonus", "finished"):
        out[f] = _like(ref, (batch,), "i32")
    st = status if status is not None else _status_word(ref)
    p = _Accept(_ptr(keys), _ptr(tokens), _ptr(parents), _ptr(count), batch, n, max_path, _ptr(max_new), _ptr(stops),
                len(stop_list), _ptr(out["path"]), _ptr(out["path_len"]), _ptr(out["new_tokens"]),
                _ptr(out["num_new"]), _ptr(out["bonus"]), _ptr(out["finished"]), _ptr(st))
    _call("accept", p, ref)
    out["status"] = st
    return out


def kv_compact(kv, page_table, prefix_lens, path, path_len, remap: bool = False, status=None):
    """The accepted path's KV compaction, in place (ddtree/kernels.h section 5): kv [layers, num_pages, page_size, ...]
    of any dtype (each slot's row is opaque bytes), page_table [batch, max_pages] i32, prefix_lens [batch], path
    [batch, max_path] and path_len [batch] (accept's outputs). Moves row prefix + path[k] to prefix + k in every
    layer; remap=True (page_size 1) swaps page-table entries instead. kv and page_table are written in place, so they
    must already be contiguous, on one device, page_table int32. Returns the status word."""
    if len(kv.shape) < 3:
        raise ValueError("kv_compact: kv must be [layers, num_pages, page_size, ...]")
    layers, num_pages, page_size = (int(d) for d in kv.shape[:3])
    contiguous = kv.is_contiguous() if _is_torch(kv) else kv.flags["C_CONTIGUOUS"]
    table_ok = (page_table.dtype == torch.int32 and page_table.is_contiguous()) if _is_torch(page_table) else (
        page_table.dtype == np.int32 and page_table.flags["C_CONTIGUOUS"])
    writeable = _is_torch(kv) or (kv.flags["WRITEABLE"] and page_table.flags["WRITEABLE"])
    if not contiguous or not table_ok or not writeable or _is_torch(kv) != _is_torch(page_table) or (
            _is_torch(kv) and kv.device != page_table.device):
        raise ValueError("kv_compact: kv and page_table are written in place: both contiguous, writeable, on one "
                         "device, page_table int32")
    itemsize = kv.element_size() if _is_torch(kv) else kv.itemsize
    row_bytes = int(np.prod(kv.shape[3:], dtype=np.int64)) * itemsize
    batch, max_pages = (int(d) for d in page_table.shape)
    ref = kv
    prefix_lens, path, path_len = _as(ref, prefix_lens, "i32"), _as(ref, path, "i32"), _as(ref, path_len, "i32")
    if len(path.shape) != 2 or int(path.shape[0]) != batch or tuple(prefix_lens.shape) != (batch,) or tuple(
            path_len.shape) != (batch,):
        raise ValueError(f"kv_compact: page_table has {batch} rows: prefix_lens and path_len must be [{batch}], path "
                         f"[{batch}, max_path]")
    st = status if status is not None else _status_word(ref)
    p = _KvCompact(_ptr(kv), num_pages * page_size * row_bytes, layers, row_bytes, page_size, num_pages,
                   _ptr(page_table), max_pages, _ptr(prefix_lens), _ptr(path), _ptr(path_len), batch,
                   int(path.shape[1]), 1 if remap else 0, _ptr(st))
    _call("kv_compact", p, ref)
    return st


def key_token(keys):
    """Token id packed in argmax keys (u64)."""
    keys = to_numpy(keys)
    return (np.uint64(0xFFFFFFFF) - (np.asarray(keys, dtype=np.uint64) & np.uint64(0xFFFFFFFF))).astype(np.int64)


# ---- tree-verify MLA attention (kernels.h section 4) ----
ATTN_DIM_QK = 576  # 512 latent (c_kv / absorbed q_nope) + 64 rope
ATTN_DIM_V = 512
# verify_attn's p_precision (kernels.h): "hilo" (the default bar) or "bf16" (opt-in: P as one bf16 in the flash
# kernels, one PV product, its own bar; the oracle and the CPU twin compute at the default precision).
ATTN_P_PRECISIONS = {"hilo": 0, "bf16": 1}


def bf16_from_f32(x) -> np.ndarray:
    """float array -> bf16 bit patterns (np.uint16), round to nearest even, NaN stays NaN (as the library)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    r = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    r[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return r


def bf16_to_f32(h) -> np.ndarray:
    """bf16 bit patterns (uint16 array, or a torch.bfloat16 tensor) -> float32 (exact)."""
    h = to_numpy(h)
    return (np.ascontiguousarray(h, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _aligned(x, align: int):
    """x itself when its data is `align`-byte aligned, else an aligned copy (the kernels need 16 bytes)."""
    if _ptr(x) % align == 0:
        return x
    if _is_torch(x):
        return x.clone()
    buf = np.empty(x.nbytes + align, dtype=np.uint8)
    off = (-buf.ctypes.data) % align
    y = buf[off:off + x.nbytes].view(x.dtype).reshape(x.shape)
    y[...] = x
    return y


def _as_bf16(ref, x, name: str):
    """bf16 data on ref's library/device: torch -> torch.bfloat16 (other float dtypes are rounded);
    numpy -> uint16 bit patterns (float arrays are rounded with bf16_from_f32)."""
    if _is_torch(ref):
        if not _is_torch(x):
            a = np.asarray(x)
            x = torch.from_numpy(np.ascontiguousarray(a.view(np.int16) if a.dtype == np.uint16 else bf16_from_f32(a).view(np.int16))).view(torch.bfloat16)
        elif x.dtype != torch.bfloat16:
            if x.dtype in (torch.int16, torch.uint16):
                x = x.view(torch.bfloat16)
            else:
                x = x.to(torch.bfloat16)
        return _aligned(x.to(device=ref.device).contiguous(), 16)
    if _is_torch(x):
        x = to_numpy(x)
    a = np.asarray(x)
    if a.dtype != np.uint16:
        if not np.issubdtype(a.dtype, np.floating):
            raise TypeError(f"verify_attn: {name} must be bf16 bits (uint16) or floats, got {a.dtype}")
        a = bf16_from_f32(a)
    return _aligned(np.ascontiguousarray(a), 16)


def _verify_attn_inputs(q, kv_cache, page_table, prefix_lens, node_offsets, vis, softmax_scale, page_size, status,
                        p_precision="hilo"):
    """verify_attn's argument checks and conversions: (ref, params, out, lse, status, the converted arrays
    (kept alive while params points at them))."""
    if p_precision not in ATTN_P_PRECISIONS:
        raise ValueError(f"verify_attn: p_precision must be 'hilo' or 'bf16', got {p_precision!r}")
    if len(q.shape) != 3 or q.shape[2] != ATTN_DIM_QK:
        raise ValueError(f"verify_attn: q must be [total_nodes, heads, {ATTN_DIM_QK}], got {tuple(q.shape)}")
    total_nodes, heads = int(q.shape[0]), int(q.shape[1])
    ref = q
    q = _as_bf16(ref, q, "q")
    kv = _as_bf16(ref, kv_cache, "kv_cache")
    if kv.shape[-1] != ATTN_DIM_QK or len(kv.shape) not in (2, 3):
        raise ValueError(f"verify_attn: kv_cache must be [num_pages, page_size, {ATTN_DIM_QK}] or [slots, {ATTN_DIM_QK}]")
    if len(kv.shape) == 3 and int(kv.shape[1]) != page_size:
        raise ValueError(f"verify_attn: kv_cache.shape[1] = {kv.shape[1]} != page_size {page_size}")
    slots = int(np.prod([int(d) for d in kv.shape[:-1]]))
    if page_size < 1 or slots % page_size:
        raise ValueError(f"verify_attn: {slots} cache slots are not a whole number of pages of {page_size}")
    page_table = _as(ref, page_table, "i32")
    if len(page_table.shape) != 2:
        raise ValueError("verify_attn: page_table must be [batch, max_pages]")
    batch, max_pages = int(page_table.shape[0]), int(page_table.shape[1])
    prefix_lens = _as(ref, prefix_lens, "i32").reshape(-1)
    node_offsets = _as(ref, node_offsets, "i32").reshape(-1)
    if prefix_lens.shape[0] != batch or node_offsets.shape[0] != batch + 1:
        raise ValueError(f"verify_attn: prefix_lens must be [{batch}] and node_offsets [{batch + 1}]")
    vis = _as(ref, vis, "u64")
    if len(vis.shape) != 2 or vis.shape[0] != total_nodes:
        raise ValueError(f"verify_attn: vis must be [total_nodes = {total_nodes}, W]")
    out = _aligned(_like(ref, (total_nodes, heads, ATTN_DIM_V), "bf16"), 16)
    lse = _like(ref, (total_nodes, heads), "f32")
    st = status if status is not None else _status_word(ref)
    p = _VerifyAttn(_ptr(q), _ptr(kv), _ptr(page_table), _ptr(prefix_lens), _ptr(node_offsets), _ptr(vis), batch,
                    total_nodes, heads, page_size, max_pages, slots // page_size, int(vis.shape[1]),
                    float(softmax_scale), _ptr(out), _ptr(lse), _ptr(st), ATTN_P_PRECISIONS[p_precision])
    return ref, p, out, lse, st, (q, kv, page_table, prefix_lens, node_offsets, vis)


class VerifyAttnPlan:
    """The sm_90a kernel's per-step plan (verify_attn_plan): bytes (a torch uint8 tensor on the GPU, or a numpy
    uint8 array from the CPU twin) for one split_keys. Valid for every layer of a step while batch, heads, the
    capacities and the contents of node_offsets, prefix_lens and page_table stay the same (kernels.h)."""

    def __init__(self, data, split_keys: int):
        self.data = data
        self.split_keys = split_keys

    def __len__(self):
        return int(self.data.numel() if _is_torch(self.data) else self.data.size)


def verify_attn_plan(q, kv_cache, page_table, prefix_lens, node_offsets, vis, softmax_scale: float, page_size: int,
                     split_keys: int = 512) -> VerifyAttnPlan:
    """Makes the per-step plan of the sm_90a kernel (ddt_verify_attn_sm90_plan_cuda on CUDA tensors, on the current
    stream; its CPU twin ddt_verify_attn_sm90_plan_cpu on host arrays: the same bytes) from verify_attn's
    arguments. Pass it as verify_attn(..., kernel="sm90-plan", plan=...) for each layer of the step (q, kv_cache,
    vis and softmax_scale may change from layer to layer); a plan made for other scalars poisons every row and
    sets DDT_DATA_BAD_PLAN (4) in the status word."""
    ref, p, _, _, _, keep = _verify_attn_inputs(q, kv_cache, page_table, prefix_lens, node_offsets, vis,
                                                softmax_scale, page_size, None)
    plan = _plan_from_params(ref, p, split_keys)
    del keep
    return plan


def _plan_from_params(ref, p, split_keys: int) -> VerifyAttnPlan:
    """The plan of verify_attn_plan from already converted inputs (ref: their reference tensor or array; p: the
    _VerifyAttn params whose arrays the caller keeps alive until this returns)."""
    L = lib()
    need = ctypes.c_size_t(0)
    rc = L.ddt_verify_attn_sm90_plan_bytes(ctypes.byref(p), int(split_keys), ctypes.byref(need))
    if rc != 0:
        raise DDTreeError(rc, f"ddt_verify_attn_sm90_plan_bytes: {L.ddt_last_error_message().decode()}")
    if _is_cuda(ref):
        data = torch.empty(max(int(need.value), 16), dtype=torch.uint8, device=ref.device)  # fresh: 256-byte aligned
        with torch.cuda.device(ref.device):
            stream = torch.cuda.current_stream(ref.device).cuda_stream
            rc = L.ddt_verify_attn_sm90_plan_cuda(ctypes.byref(p), int(split_keys), ctypes.c_void_p(data.data_ptr()),
                                                  need.value, ctypes.c_void_p(stream))
        who = "ddt_verify_attn_sm90_plan_cuda"
    else:
        data = _aligned(np.zeros(max(int(need.value), 16), dtype=np.uint8), 16)
        rc = L.ddt_verify_attn_sm90_plan_cpu(ctypes.byref(p), int(split_keys), ctypes.c_void_p(data.ctypes.data),
                                             need.value)
        who = "ddt_verify_attn_sm90_plan_cpu"
    if rc != 0:
        raise DDTreeError(rc, f"{who}: {L.ddt_status_string(rc).decode()}: {L.ddt_last_error_message().decode()}")
    return VerifyAttnPlan(data[:int(need.value)], int(split_keys))


def verify_attn(q, kv_cache, page_table, prefix_lens, node_offsets, vis, softmax_scale: float, page_size: int,
                status=None, kernel: str = "oracle", split_keys: int = 512, plan: VerifyAttnPlan = None,
                p_precision: str = "hilo"):
    """Tree-verify MLA attention over a paged latent KV cache (semantics: kernels.h section 4).

    q [total_nodes, H, 576] and kv_cache [num_pages, page_size, 576] (or [num_pages * page_size, 576]) are bf16:
    torch.bfloat16 tensors (CUDA tensors run the CUDA oracle on the current stream, CPU tensors the CPU twin) or
    numpy uint16 bit patterns (float arrays are rounded to bf16 first; see bf16_from_f32). page_table
    [batch, max_pages] i32, prefix_lens [batch] i32, node_offsets [batch + 1] i32 (request r owns rows
    node_offsets[r] .. node_offsets[r+1]-1; rows past node_offsets[batch] are padding), vis [total_nodes, W] u64
    ancestor bitmask rows. Returns (out [total_nodes, H, 512] bf16 (torch.bfloat16 / numpy uint16), lse
    [total_nodes, H] f32 = ln sum exp(softmax_scale * q.k) over the visible keys, status word [1] u32:
    DDT_DATA_BAD_INDEX = 2 when a request's page indices / lengths were bad; its rows are then NaN). A given
    status array is OR-ed into and returned. kernel (CUDA tensors only): "oracle" (the simple reference kernel) or
    "portable" (the mma.sync flash kernel) or "sm90" (the wgmma flash kernel, compute capability 9.0 only) or
    "sm90-plan" (ddt_verify_attn_sm90_planned_cuda with `plan`, a verify_attn_plan made once per step and reused
    for every layer, or, without one, a plan made right before the call; bitwise the "sm90" result); the flash
    kernels' workspace is allocated here with torch on the tensors' device; split_keys: their split length, 0 =
    never split, else a multiple of 32: keep one value per deployment, see kernels.h). p_precision: "hilo" (the
    default: the correctness bar) or "bf16" (opt-in, FlashMLA's precision: the flash kernels round P to one bf16
    before PV, ~10% faster at T >= 8, out within the bar plus 2^-8 sum_j p_j |v_j| / l; the oracle and the CPU twin
    compute at the default precision; kernels.h DDT_ATTN_P_BF16)."""
    if kernel not in ("oracle", "portable", "sm90", "sm90-plan"):
        raise ValueError(f"verify_attn: kernel must be 'oracle', 'portable', 'sm90' or 'sm90-plan', got {kernel!r}")
    if kernel != "oracle" and not _is_cuda(q):
        raise ValueError(f"verify_attn: kernel={kernel!r} runs on CUDA tensors only")
    if plan is not None:
        if kernel != "sm90-plan":
            raise ValueError(f"verify_attn: a plan is for kernel='sm90-plan', not {kernel!r}")
        if not (_is_torch(plan.data) and plan.data.device == q.device):
            raise ValueError("verify_attn: the plan must live on the tensors' GPU (verify_attn_plan of CUDA tensors)")
        if plan.split_keys != int(split_keys):
            raise ValueError(f"verify_attn: the plan was made for split_keys {plan.split_keys}, not {split_keys}")
    ref, p, out, lse, st, keep = _verify_attn_inputs(q, kv_cache, page_table, prefix_lens, node_offsets, vis,
                                                    softmax_scale, page_size, status, p_precision)
    if kernel != "oracle":
        L = lib()
        need = ctypes.c_size_t(0)
        rc = L.ddt_verify_attn_portable_workspace(ctypes.byref(p), int(split_keys), ctypes.byref(need))
        if rc != 0:
            raise DDTreeError(rc, f"ddt_verify_attn_portable_workspace: {L.ddt_last_error_message().decode()}")
        ws = torch.empty(max(int(need.value), 16), dtype=torch.uint8, device=ref.device)  # fresh: 256-byte aligned
        with torch.cuda.device(ref.device):
            stream = torch.cuda.current_stream(ref.device).cuda_stream
            if kernel == "sm90-plan":
                if plan is None:  # (the inputs converted above: no second conversion, no unused out / lse)
                    plan = _plan_from_params(ref, p, split_keys)
                rc = L.ddt_verify_attn_sm90_planned_cuda(ctypes.byref(p), int(split_keys),
                                                         ctypes.c_void_p(plan.data.data_ptr()), len(plan),
                                                         ctypes.c_void_p(ws.data_ptr()), need.value,
                                                         ctypes.c_void_p(stream))
            else:
                fn = getattr(L, f"ddt_verify_attn_{kernel}_cuda")
                rc = fn(ctypes.byref(p), int(split_keys), ctypes.c_void_p(ws.data_ptr()), need.value,
                        ctypes.c_void_p(stream))
        if rc != 0:
            who = "ddt_verify_attn_sm90_planned_cuda" if kernel == "sm90-plan" else f"ddt_verify_attn_{kernel}_cuda"
            raise DDTreeError(rc, f"{who}: {L.ddt_status_string(rc).decode()}: "
                                  f"{L.ddt_last_error_message().decode()}")
        return out, lse, st
    _call("verify_attn", p, ref)
    return out, lse, st
