"""Summary of a tests/gpu/ab.sh run (its output directory as the argument): the planned sm90 shapes that moved by
more than 2% between the base and the new library, the second samples side by side (us, from TB/s of the same
bytes), the geomean of new / base time over the fixed batches and over batch 1 (planned and unplanned), and any
result not checked against the host reference. Only the standard library: it runs on the GPU machine."""
import math
import re
import sys
from pathlib import Path

ROW = re.compile(r"^\| (\d+) \| (\d+) \| (\d+) \| (sm90(?:-plan)?|portable) \| ([\d.]+) \|")


def table(path):
    rows, unchecked = {}, 0
    for line in Path(path).read_text().splitlines():
        m = ROW.match(line)
        if m:
            p, t, b, kernel, us = m.groups()
            rows[(int(p), int(t), int(b), kernel)] = float(us)
            unchecked += "| yes" not in line
    return rows, unchecked


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main(out):
    out = Path(out)
    base, ub = table(out / "sm90_base.txt")
    new, un = table(out / "sm90_new.txt")
    print(f"sm90 shapes: base {len(base)}, new {len(new)}; not checked against the host reference: {ub} / {un}")
    common = sorted(set(base) & set(new))
    print("planned shapes that moved by more than 2% (us base -> new, new / base):")
    for k in common:
        if k[3] == "sm90-plan" and abs(new[k] / base[k] - 1) > 0.02:
            print(f"  P {k[0]} T {k[1]} b {k[2]}: {base[k]} -> {new[k]} ({new[k] / base[k]:.3f})")
    for kernel in ("sm90-plan", "sm90"):
        for name, pick in (("fixed batches", lambda k: k[2] != 1), ("batch 1", lambda k: k[2] == 1)):
            r = [new[k] / base[k] for k in common if k[3] == kernel and pick(k)]
            print(f"geomean new / base time, {kernel}, {name}: {geomean(r):.4f} over {len(r)} shapes")
    second = out / "second.txt"
    if second.exists():
        print("second samples, planned us (base / new):")
        pairs = {}
        for line in second.read_text().splitlines():
            lib, rest = line.split(" ", 1)
            m = ROW.match(rest)
            if m and m.group(4) == "sm90-plan":
                pairs.setdefault(tuple(map(int, m.groups()[:3])), {})[lib] = float(m.group(5))
        for k, v in pairs.items():
            if "base" in v and "new" in v:
                print(f"  P {k[0]} T {k[1]} b {k[2]}: {v['base']} / {v['new']} ({v['new'] / v['base']:.3f})")
    for lib in ("base", "new"):
        f = out / f"portable_{lib}.txt"
        if f.exists():
            rows, _ = table(f)
            print(f"portable {lib} (P/T/batch us): " +
                  ", ".join(f"{k[0]}/{k[1]}/{k[2]} {us}" for k, us in sorted(rows.items()) if k[3] == "portable"))


if __name__ == "__main__":
    main(sys.argv[1])
