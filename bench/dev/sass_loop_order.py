#!/usr/bin/env python3
"""The order of loads, exp2s, shuffles and FMAs in each loop body of a disassembled kernel (cuobjdump -sass output).

A loop is a backward branch (BRA to a lower address); its body is every instruction from the target to the branch,
nested loops included. Each loop with at least --min-loads global loads prints one line: L (LDG, 32-bit), L8 / L16
(LDG.U8 / U16), L64 / L128, EX (MUFU.EX2), s* (a run of SHFL), f* (a run of FFMA). It answers questions such as
"does every load of the round issue before the first instruction that waits on one of them" (docs/PERF_NOTES.md S73e:
the sliced combine's exp2 placed before a round's last loads).

Usage: cuobjdump -sass lib.o > k.sass; bench/dev/sass_loop_order.py k.sass [--kernel REGEX] [--min-loads N]
"""
import argparse
import re
import sys


def functions(path):
    """{mangled name: [(address, instruction text)]} of the listing."""
    out, cur = {}, None
    with open(path) as f:
        for line in f:
            m = re.search(r"Function : (\S+)", line)
            if m:
                cur = m.group(1)
                out[cur] = []
                continue
            m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
            if m and cur:
                out[cur].append((int(m.group(1), 16), m.group(2).strip()))
    return out


def token(text):
    """The symbol of one instruction, or None for the ones not shown."""
    op = text.split()[1] if text.startswith("@") else text.split()[0]
    if op.startswith("LDG"):
        for width, name in ((".U8", "L8"), (".U16", "L16"), (".128", "L128"), (".64", "L64")):
            if width in op:
                return name
        return "L"
    if op.startswith("MUFU.EX2"):
        return "EX"
    if op.startswith("SHFL"):
        return "s*"
    if op.startswith("FFMA"):
        return "f*"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sass")
    ap.add_argument("--kernel", default=".", help="regex on the mangled function name")
    ap.add_argument("--min-loads", type=int, default=4)
    a = ap.parse_args()
    found = False
    for name, ins in functions(a.sass).items():
        if not re.search(a.kernel, name):
            continue
        for addr, text in ins:
            m = re.search(r"BRA (?:P\d, )?(0x[0-9a-f]+)", text)
            if not m or int(m.group(1), 16) >= addr:
                continue
            target = int(m.group(1), 16)
            seq = []
            for _, t in ((x, t) for x, t in ins if target <= x <= addr):
                s = token(t)
                if s and not (s.endswith("*") and seq and seq[-1] == s):  # runs of s* / f* as one symbol
                    seq.append(s)
            if sum(s.startswith("L") for s in seq) >= a.min_loads:
                found = True
                short = re.sub(r"_GLOBAL__N__[0-9a-f]+_[0-9]+_[A-Za-z0-9_]+_cu_[0-9a-f]+", "ANON", name)
                print(f"{short} loop {target:#x}-{addr:#x}: {' '.join(seq)}")
    if not found:
        print("no loop with that many loads in a matching function", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
