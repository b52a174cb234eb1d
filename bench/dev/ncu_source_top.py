#!/usr/bin/env python3
"""Dev: the SASS instructions with the most warp-state samples in an `ncu --page source --csv --print-source sass`
export (bench/dev/ncu_source.sh), with each one's largest stall reasons, and the sample totals per reason.
Usage: ncu_source_top.py src.csv[.gz] [how_many]"""
import csv
import gzip
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as fh:
        rows = list(csv.reader(fh))
    head_at = next((i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r)), None)
    if head_at is None:
        print(f"   no header with a 'Source' column in {path}; first rows: {rows[:3]}")
        return
    head = [c.strip() for c in rows[head_at]]
    body = [r for r in rows[head_at + 1:] if len(r) == len(head)]
    src = head.index("Source")
    addr = head.index("Address") if "Address" in head else None
    total_col = next((i for i, h in enumerate(head) if h.startswith("Warp Stall Sampling (All")), None)
    reason_cols = [i for i, h in enumerate(head) if h.lower().startswith("stall_") or h.startswith("smsp__pcsamp")]
    if total_col is None:
        print("   columns:", head)
        return
    total = sum(number(r[total_col]) or 0 for r in body)
    print(f"   {len(body)} instructions, {total:.0f} samples; per reason (share of all samples):")
    sums = sorted(((sum(number(r[i]) or 0 for r in body), head[i]) for i in reason_cols), reverse=True)
    print("   " + ", ".join(f"{name} {s / max(total, 1):.3f}" for s, name in sums[:12] if s > 0))
    ranked = sorted(body, key=lambda r: number(r[total_col]) or 0, reverse=True)[:top]
    for r in ranked:
        n = number(r[total_col]) or 0
        reasons = sorted(((number(r[i]) or 0, head[i]) for i in reason_cols), reverse=True)[:3]
        why = ", ".join(f"{name.replace('stall_', '')} {v:.0f}" for v, name in reasons if v > 0)
        where = r[addr] if addr is not None else ""
        print(f"   {where:>8} {n / max(total, 1):6.3f} {r[src].strip()[:70]:<70} {why}")


if __name__ == "__main__":
    main()
