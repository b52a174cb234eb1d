"""Dev harness (GPU machine): do two builds of the kernel library give byte-identical verify-attention results on the
same inputs? The problems of tests/python/test_verify_attn.py (its make_problem: poisoned slots, permuted pages,
peaked scores, decode rows, long prefixes) run through every CUDA kernel of the library DDTREE_KERNELS_LIB points at
(oracle, portable at split 512, sm90 at split 512 / 0 / 96, sm90-plan at 512; p_precision "hilo", and "bf16" with
--bf16); `save` writes out and lse to an .npz, `compare` reruns them with another library and reports, per (problem,
kernel), whether every byte of out and lse is equal. Used to show that a change left the default arithmetic's bits
alone (docs/PERF_NOTES.md). Usage: DDTREE_KERNELS_LIB=<old .so> python3 bench/dev/attn_lib_bytes.py save F.npz
[--bf16], then DDTREE_KERNELS_LIB=<new .so> python3 bench/dev/attn_lib_bytes.py compare F.npz [--bf16]."""
import importlib.util
import sys
from pathlib import Path

import numpy as np

root = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("tva", root / "tests/python/test_verify_attn.py")
tva = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tva)  # (its module-level setup: the library, torch, HAVE_SM90)
dk = tva.dk

PROBLEMS = [  # (seed, reqs, heads, page, q_scale)
    (1, [(63, 7, "star"), (0, 1, "chain"), (300, 64, "deep")], 8, 64, 1.0),
    (2, [(1, 128, "bushy"), (600, 1, "chain"), (2047, 2, "chain")], 8, 64, 6.0),
    (3, [(65, 9, "bushy"), (1000, 33, "deep")], 16, 1, 3.0),
    (4, [(32768, 16, "deep"), (32767, 1, "chain"), (12345, 65, "star")], 8, 64, 1.0),
]
KERNELS = [("oracle", 512), ("portable", 512), ("sm90", 512), ("sm90", 0), ("sm90", 96), ("sm90-plan", 512)]


def run_all(precision):
    res = {}
    for i, (seed, reqs, heads, page, qs) in enumerate(PROBLEMS):
        pb = tva.make_problem(seed, reqs, heads, page, q_scale=qs)
        q, kv, pt, pre, off, vis = tva.on("cuda", pb)
        for kernel, split in KERNELS:
            if kernel.startswith("sm90") and not tva.HAVE_SM90:
                continue
            out, lse, st = dk.verify_attn(q, kv, pt, pre, off, vis, tva.SCALE, page, kernel=kernel, split_keys=split,
                                          p_precision=precision)
            key = f"p{i}_{kernel}_s{split}"
            res[key + "_out"] = dk.to_numpy(out).view(np.uint16).copy()
            res[key + "_lse"] = dk.to_numpy(lse).view(np.uint32).copy()
            res[key + "_status"] = np.array([dk.status_value(st)], dtype=np.uint32)
    return res


def main():
    mode, path = sys.argv[1], sys.argv[2]
    precision = "bf16" if "--bf16" in sys.argv[3:] else "hilo"
    res = run_all(precision)
    if mode == "save":
        np.savez(path, **res)
        print(f"saved {len(res) // 3} results ({precision}) to {path}")
        return 0
    ref = np.load(path)
    bad = 0
    for key in sorted(k[:-4] for k in res if k.endswith("_out")):
        same = all(np.array_equal(res[key + s], ref[key + s]) for s in ("_out", "_lse", "_status"))
        differ_rows = int((res[key + "_out"] != ref[key + "_out"]).reshape(-1, 512).any(axis=1).sum())
        print(f"{key} ({precision}): {'bytes equal' if same else f'DIFFERENT ({differ_rows} rows of out)'}")
        bad += not same
    print(f"{bad} of {len(res) // 3} results differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
