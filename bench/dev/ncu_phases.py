#!/usr/bin/env python3
"""Dev: where the sm_90a attention kernel's warps spend their samples, by phase, from an `ncu --page source --csv
--print-source sass` export of one main-kernel launch (bench/dev/ncu_source.sh writes it as src_<lib>.csv.gz).
Phases are found without symbols: by execution count (a wide tile loop's instructions run tiles x 8 times, one per
math warp; a narrow one's tiles x 4 per warpgroup; an item's items x 4 or x 8) and, in the wide loop, by its landmarks
in address order (the S k-steps HGMMA.64x32, barriers B and C: the loop's last two BAR.SYNC, the first PV k-step).
The counts come from the shape: keys = P + T, rows = T x heads, row tiles = ceil(rows / 64) (wide) or 1 (narrow:
rows <= 16), splits = ceil(keys / split_keys), tiles = batch x row tiles x ceil(keys / 64).
Usage: ncu_phases.py src.csv[.gz] P,T,batch [split_keys (512)] [heads (8)]
Prints shares of all samples (every warp's, the producer's idle ones included). docs/PERF_NOTES.md has the tables."""
import csv
import gzip
import math
import sys


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as fh:
        rows = list(csv.reader(fh))
    head_at = next(i for i, r in enumerate(rows) if "Source" in [c.strip() for c in r])
    head = [c.strip() for c in rows[head_at]]
    body = [r for r in rows[head_at + 1:] if len(r) == len(head)]
    col = {name: head.index(name) for name in ("Address", "Source", "Warp Stall Sampling (All Samples)",
                                               "Instructions Executed")}
    out = []
    for r in body:
        samples = float(r[col["Warp Stall Sampling (All Samples)"]] or 0)
        executed = int(float(r[col["Instructions Executed"]] or 0))
        out.append((int(r[col["Address"]], 16), r[col["Source"]].strip(), samples, executed))
    return out


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    instrs = load(sys.argv[1])
    p, t, batch = (int(x) for x in sys.argv[2].split(","))
    split_keys = int(sys.argv[3]) if len(sys.argv) > 3 else 512
    heads = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    keys, rows = p + t, t * heads
    narrow = rows <= 16
    row_tiles = 1 if narrow else math.ceil(rows / 64)
    splits = math.ceil(keys / split_keys) if split_keys > 0 and keys > split_keys else 1
    tiles = batch * row_tiles * math.ceil(keys / 64)
    items = batch * row_tiles * splits
    total = sum(s for _, _, s, _ in instrs)

    def share(pick):
        return sum(s for a, src, s, e in instrs if pick(a, src, e)) / total

    print(f"shape P {p} T {t} batch {batch}: {'narrow' if narrow else 'wide'} path, {items} items, {tiles} tiles; "
          f"{int(total)} samples")
    loop_count = tiles * (4 if narrow else 8)
    loop = [(a, src, s, e) for a, src, s, e in instrs if e == loop_count]
    if not loop:
        print(f"no instruction ran {loop_count} times: another shape, split_keys or heads than the launch profiled?")
        return 1
    lo, hi = min(a for a, *_ in loop), max(a for a, *_ in loop)
    # (wide: the math warps' per-item code runs items x 8 times and the producer warpgroup's items x 4; narrow: each
    # math warpgroup's own code runs items x 4 times too, so the producer's per-item code is counted with the items)
    item_counts = (items * 4, items * 8) if narrow else (items * 8,)
    rows_out = [
        ("item prologue (before the tile loop)", share(lambda a, src, e: e in item_counts and a < lo)),
        ("item epilogue (after the tile loop)", share(lambda a, src, e: e in item_counts and a > hi)),
        ("producer, per tile (its copies)", share(lambda a, src, e: e in (tiles, tiles * 3))),
        ("try_wait spins (any role)", share(lambda a, src, e: e > 2 * loop_count)),
    ]
    if not narrow:
        rows_out.insert(3, ("producer, per item", share(lambda a, src, e: e == items * 4)))
    if narrow:
        rows_out.insert(0, ("tile loops (both math warpgroups)", share(lambda a, src, e: lo <= a <= hi and e == loop_count)))
    else:
        body = [x for x in instrs if lo <= x[0] <= hi]
        bars = [i for i, x in enumerate(body) if "BAR.SYNC" in x[1] and x[3] >= loop_count // 2]
        s_steps = [i for i, x in enumerate(body) if "HGMMA.64x32" in x[1]]
        pv = next((i for i, x in enumerate(body) if "HGMMA.64x128" in x[1] or "HGMMA.64x256" in x[1]), None)
        if len(bars) < 2 or not s_steps or pv is None:
            print("the wide loop's landmarks (S k-steps, barriers B and C, the first PV k-step) were not found")
            return 1
        cuts = [0, s_steps[0], s_steps[-1] + 1, bars[-2], bars[-1], pv, len(body)]
        names = ["tile loop head, tile wait, zeroing", "S k-steps issued (and their box-group waits)",
                 "S wait, scale, mask, row max", "barrier B, alpha, exp2, P stores", "barrier C, O rescale",
                 "PV issued, awaited, stage released"]
        for name, (a, b) in zip(names, zip(cuts, cuts[1:])):
            rows_out.insert(len(rows_out) - 5, (name, sum(x[2] for x in body[a:b]) / total))
    print("| phase | share of all samples |\n|---|---|")
    for name, value in rows_out:
        print(f"| {name} | {value:.3f} |")
    rest = 1 - sum(v for _, v in rows_out)
    print(f"| rest (idle producer warps, per-CTA start and exit, other) | {rest:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
