"""Summary of a tests/gpu/ab.sh run (its output directory as the argument), for the new library and each variant
against the base: the planned sm90 shapes that moved by more than 2%, the geomean of time over the fixed batches
and over batch 1 (planned and unplanned; also over T 1 and T >= 8 apart), the second samples side by side, and
any result not checked against the host reference. Only the standard library: it runs on the GPU machine."""
import math
import re
import statistics
import sys
from pathlib import Path

ROW = re.compile(r"^\| (\d+) \| (\d+) \| (\d+) \| (sm90(?:-plan)?|portable) \| ([\d.]+) \|")
# the --p-bf16 rows (p_precision DDT_ATTN_P_BF16), the hi + lo rows beside them, with their fraction of the roofline
ROW_BF16 = re.compile(r"^\| (\d+) \| (\d+) \| (\d+) \| (sm90(?:-plan)?|portable)-bf16 \| ([\d.]+) \| [\d.]+ \| [\d.]+ \| [\d.]+ \| ([\d.]+) \|")
HILO = re.compile(r"^\| (\d+) \| (\d+) \| (\d+) \| (sm90(?:-plan)?|portable) \| ([\d.]+) \| [\d.]+ \| [\d.]+ \| [\d.]+ \| ([\d.]+) \|")


def table(path):
    rows, unchecked = {}, 0
    for line in Path(path).read_text().splitlines():
        m = ROW.match(line)
        if m:
            p, t, b, kernel, us = m.groups()
            rows[(int(p), int(t), int(b), kernel)] = float(us)
        if m or ROW_BF16.match(line):  # (a bf16 row's check counts too)
            unchecked += "| yes" not in line
    return rows, unchecked


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def compare_rows(title, before, after, suffix, what):
    """before / after: {(P, T, batch, kernel): (us, fraction of the roofline)}. Prints each shape of both (us before ->
    after, ratio; fractions) and the geomean of after / before per kernel, over the fixed batches and batch 1, T 1 and
    T >= 8 apart; suffix goes after the kernel's name in the lines."""
    keys = sorted(set(before) & set(after), key=lambda k: (k[3], k[2] == "1", int(k[0]), int(k[1])))
    if not keys:
        return
    print(title)
    for k in keys:
        (h, fh), (b, fb) = before[k], after[k]
        print(f"  {k[3]}{suffix} P {k[0]} T {k[1]} b {k[2]}: {h} -> {b} ({b / h:.3f}); {fh:.3f} -> {fb:.3f}")
    for kernel in ("sm90-plan", "sm90", "portable"):
        for name, pick in (("fixed batches", lambda k: k[2] != "1"), ("batch 1", lambda k: k[2] == "1")):
            r1 = [after[k][0] / before[k][0] for k in keys if k[3] == kernel and pick(k) and k[1] == "1"]
            r8 = [after[k][0] / before[k][0] for k in keys if k[3] == kernel and pick(k) and int(k[1]) >= 8]
            if r1 or r8:
                print(f"geomean {what}, {kernel}{suffix}, {name}: T 1 {geomean(r1):.4f} ({len(r1)}), "
                      f"T >= 8 {geomean(r8):.4f} ({len(r8)})")


def main(out):
    out = Path(out)
    # every library timed beside the base: new, then the variants (sm90_<name>.txt or, with SKIP_SM90=1, only
    # portable_<name>.txt), in name order
    names = {f.stem.split("_", 1)[1] for pat in ("sm90_*.txt", "portable_*.txt") for f in out.glob(pat)}
    others = ["new"] + sorted(names - {"base", "new"})
    base, ub = table(out / "sm90_base.txt") if (out / "sm90_base.txt").exists() else ({}, 0)
    second = {}
    if (out / "second.txt").exists():
        for line in (out / "second.txt").read_text().splitlines():
            lib, rest = line.split(" ", 1)
            m = ROW.match(rest)
            if m and m.group(4) == "sm90-plan":
                second.setdefault(tuple(map(int, m.groups()[:3])), {}).setdefault(lib, []).append(float(m.group(5)))
    for lib in others:
        f = out / f"sm90_{lib}.txt"
        if not f.exists():
            continue
        new, un = table(f)
        print(f"== {lib} against base")
        if not new:
            print(f"NO ROWS in sm90_{lib}.txt: the bench failed for {lib} (see the file)")
            continue
        print(f"sm90 shapes: base {len(base)}, {lib} {len(new)}; not checked against the host reference: {ub} / {un}")
        common = sorted(set(base) & set(new))
        print(f"planned shapes that moved by more than 2% (us base -> {lib}, {lib} / base):")
        for k in common:
            if k[3] == "sm90-plan" and abs(new[k] / base[k] - 1) > 0.02:
                print(f"  P {k[0]} T {k[1]} b {k[2]}: {base[k]} -> {new[k]} ({new[k] / base[k]:.3f})")
        for kernel in ("sm90-plan", "sm90"):
            for name, pick in (("fixed batches", lambda k: k[2] != 1), ("batch 1", lambda k: k[2] == 1)):
                r = [new[k] / base[k] for k in common if k[3] == kernel and pick(k)]
                r1 = [new[k] / base[k] for k in common if k[3] == kernel and pick(k) and k[1] == 1]
                r8 = [new[k] / base[k] for k in common if k[3] == kernel and pick(k) and k[1] >= 8]
                print(f"geomean {lib} / base time, {kernel}, {name}: {geomean(r):.4f} over {len(r)} shapes "
                      f"(T 1 {geomean(r1):.4f}, T >= 8 {geomean(r8):.4f})")
        if second:
            print(f"second samples, planned us (base / {lib}; with SECOND_ROUNDS > 1 the medians, then the samples):")
            for k, v in second.items():
                if "base" in v and lib in v:
                    b0, n0 = statistics.median(v["base"]), statistics.median(v[lib])
                    each = ""
                    if len(v[lib]) > 1:
                        each = f" [{', '.join(map(str, v['base']))} / {', '.join(map(str, v[lib]))}]"
                    print(f"  P {k[0]} T {k[1]} b {k[2]}: {b0} / {n0} ({n0 / b0:.3f}){each}")
    for lib in others:  # P as one bf16 against hi + lo, the same library and run (bench --p-bf16)
        files = [out / f"{t}_{lib}.txt" for t in ("sm90", "portable")]
        lines = [line for f in files if f.exists() for line in f.read_text().splitlines()]
        if not lines:
            continue
        hilo = {m.groups()[:4]: (float(m.group(5)), float(m.group(6))) for m in map(HILO.match, lines) if m}
        bf16 = {m.groups()[:4]: (float(m.group(5)), float(m.group(6))) for m in map(ROW_BF16.match, lines) if m}
        bf16_base = {}
        for f in (out / "sm90_base.txt", out / "portable_base.txt"):
            if f.exists():
                bf16_base.update({m.groups()[:4]: (float(m.group(5)), float(m.group(6)))
                                  for m in map(ROW_BF16.match, f.read_text().splitlines()) if m})
        # (the bf16 rows of both libraries: BASE_BENCH_ARGS=--p-bf16)
        compare_rows(f"== {lib} against base, p_precision bf16 rows (us base -> {lib}, ratio; fraction of roofline)",
                     bf16_base, bf16, "-bf16", f"{lib} / base time")
        compare_rows(f"== {lib}: p_precision bf16 against hi + lo (us hi+lo -> bf16, ratio; fraction of roofline)",
                     hilo, bf16, "", "bf16 / hi+lo time")
    pbase = table(out / "portable_base.txt")[0] if (out / "portable_base.txt").exists() else {}
    for lib in ["base"] + others:
        f = out / f"portable_{lib}.txt"
        if f.exists():
            rows, _ = table(f)
            print(f"portable {lib} (P/T/batch us): " +
                  ", ".join(f"{k[0]}/{k[1]}/{k[2]} {us}" for k, us in sorted(rows.items()) if k[3] == "portable"))
            common = [k for k in sorted(set(pbase) & set(rows)) if k[3] == "portable"]
            if lib != "base" and common:
                r1 = [rows[k] / pbase[k] for k in common if k[1] == 1]
                r8 = [rows[k] / pbase[k] for k in common if k[1] >= 8]
                print(f"geomean portable {lib} / base time: {geomean([rows[k] / pbase[k] for k in common]):.4f} over "
                      f"{len(common)} shapes (T 1 {geomean(r1):.4f}, T >= 8 {geomean(r8):.4f})")


if __name__ == "__main__":
    main(sys.argv[1])
