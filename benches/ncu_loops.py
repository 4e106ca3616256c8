#!/usr/bin/env python3
"""Where a kernel's instructions and stalls go, loop by loop, from ncu's SASS source page.

    ncu --section SourceCounters --section WarpStateStats -k regex:NAME --launch-count 1 -o prof CMD
    ncu -i prof.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 benches/ncu_loops.py sass.csv [--rows R]

A loop is the address range from a backward branch's target to the branch; ranges nest
(an outer loop's share includes its inner loops'). For each: its SASS length, its share of
the executed warp instructions and of the warp stall samples, its most frequent opcodes,
and (with --rows) executed warp instructions per row of the launch.
"""
import argparse
import collections
import csv
import re
import sys


def column(header, *names):
    for name in names:
        for i, h in enumerate(header):
            if h.strip().lower() == name.lower():
                return i
    for name in names:
        for i, h in enumerate(header):
            if name.lower() in h.lower():
                return i
    sys.exit(f"no column like {names} in {header}")


def number(text):
    text = text.replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--rows", type=int, default=0, help="rows (programs' work items) in the profiled launch")
    ap.add_argument("--min-share", type=float, default=2.0, help="loops under this share of instructions are left out")
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    # ncu prints a "Kernel Name" line before the table: the header is the row naming the
    # address column.
    at = next((i for i, r in enumerate(rows) if r[0].strip() == "Address"), None)
    if at is None:
        sys.exit(f"{args.csv}: no row starting with Address (not ncu's source page as CSV?)")
    header, body = rows[at], rows[at + 1:]
    c_addr = column(header, "Address")
    c_src = column(header, "Source")
    c_exec = column(header, "Warp Instructions Executed", "Instructions Executed")
    c_samp = column(header, "Warp Stall Sampling (All Samples)", "Sampling Data (All)", "Stall Sampling")
    instrs = []
    for r in body:
        try:
            addr = int(r[c_addr], 16)
        except ValueError:
            continue
        instrs.append((addr, r[c_src].strip(), number(r[c_exec]), number(r[c_samp])))
    instrs.sort()
    total_exec = sum(i[2] for i in instrs) or 1.0
    total_samp = sum(i[3] for i in instrs) or 1.0
    print(f"{len(instrs)} SASS instructions, {total_exec:.0f} warp instructions executed, {total_samp:.0f} stall samples")
    if args.rows:
        print(f"per row: {total_exec / args.rows:.0f} warp instructions")
    loops = []
    for addr, src, _, _ in instrs:
        m = re.search(r"\bBRA\b.*?(0x[0-9a-fA-F]+)", src)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target <= addr:
            loops.append((target, addr))
    loops = sorted(set(loops))
    base = instrs[0][0] if instrs else 0
    # Each instruction's innermost loop: the shortest range holding it.
    own = collections.defaultdict(list)
    for i in instrs:
        holding = [l for l in loops if l[0] <= i[0] <= l[1]]
        own[min(holding, key=lambda l: l[1] - l[0]) if holding else None].append(i)
    print("loop (offsets from the kernel's start): SASS length; share of executed warp "
          "instructions and of stall samples, all inside it / its own (not in an inner loop)")
    for lo, hi in loops:
        inside = [i for i in instrs if lo <= i[0] <= hi]
        ex = sum(i[2] for i in inside)
        sa = sum(i[3] for i in inside)
        mine = own[(lo, hi)]
        ex_own = sum(i[2] for i in mine)
        sa_own = sum(i[3] for i in mine)
        if 100 * ex / total_exec < args.min_share:
            continue
        ops = collections.Counter()
        for i in mine:
            op = re.sub(r"^@!?U?P\w+\s+", "", i[1]).split(" ")[0].split(".")[0]
            ops[op] += i[2]
        top = ", ".join(f"{op} {100 * n / max(ex_own, 1):.0f}%" for op, n in ops.most_common(6))
        print(f"{lo - base:6x}-{hi - base:6x}: {len(inside):5d} instr, dyn {100 * ex / total_exec:5.1f}% / "
              f"{100 * ex_own / total_exec:5.1f}%, samples {100 * sa / total_samp:5.1f}% / "
              f"{100 * sa_own / total_samp:5.1f}%  | {top}")
    rest = own[None]
    print(f"outside every loop: dyn {100 * sum(i[2] for i in rest) / total_exec:.1f}%, "
          f"samples {100 * sum(i[3] for i in rest) / total_samp:.1f}%")

if __name__ == "__main__":
    main()
