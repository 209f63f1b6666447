"""Turns h5ddp-bench-checkpoint RESULT lines into the markdown tables of docs/BENCHMARKS.md "## Checkpoint".
Best (minimum) time over repetitions per (case, op, method); ratios are throughput ratios (other time / h5ddp time).
The load table also gives the ratio of the medians (default strategy, every rank reads, against raw): on a disk
whose speed swings between runs, one lucky raw repetition decides the ratio of the bests."""
import collections
import statistics
import sys

best = {}
times = collections.defaultdict(list)
rss = collections.defaultdict(float)
for line in open(sys.argv[1]):
    if not line.startswith("RESULT"):
        continue
    kv = dict(item.split("=", 1) for item in line.split()[1:])
    key = (float(kv["gib"]), int(kv["ranks"]), int(kv["fsync"]), kv["op"], kv["method"])
    best[key] = min(best.get(key, 1e30), float(kv["seconds"]))
    times[key].append(float(kv["seconds"]))
    rss[key] = max(rss[key], float(kv["extra_rss_pct"]))

cases = sorted({k[:3] for k in best})


def t(case, op, method):
    return best.get(case + (op, method))


def fmt(x):
    return "-" if x is None else f"{x:.2f}"


def ratio(a, b):
    return "-" if a is None or b is None else f"{a / b:.2f}x"


print("### Save (seconds, best of repetitions; ratio = throughput relative to h5ddp's)\n")
print("| GiB | ranks | fsync | h5ddp | raw MPI-IO | folk pickle | h5ddp / raw | h5ddp vs folk | h5ddp extra RSS |")
print("|---|---|---|---|---|---|---|---|---|")
for c in cases:
    h, r, f = t(c, "save", "h5ddp"), t(c, "save", "raw_mpiio"), t(c, "save", "folk_pickle")
    print(f"| {c[0]:.0f} | {c[1]} | {c[2]} | {fmt(h)} | {fmt(r)} | {fmt(f)} | {ratio(r, h)} | {ratio(f, h)} | "
          f"{rss[c + ('save', 'h5ddp')]:.1f}% |")
print("\n### Load (seconds, cold page cache; every rank ends with the whole state)\n")
print("| GiB | ranks | fsync | share+exchange | every rank reads | raw MPI-IO + bcast | raw O_DIRECT + bcast | "
      "folk pickle | best h5ddp / raw | median every-rank-reads / raw | median every-rank-reads / raw O_DIRECT | "
      "best h5ddp vs folk |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for c in cases:
    se, ev = t(c, "load", "h5ddp_share_exchange"), t(c, "load", "h5ddp_every_rank_reads")
    r, rd, f = t(c, "load", "raw_mpiio"), t(c, "load", "raw_direct"), t(c, "load", "folk_pickle")
    h = min(x for x in (se, ev) if x is not None) if (se or ev) else None
    med = {m: statistics.median(times[c + ("load", m)]) if times[c + ("load", m)] else None
           for m in ("h5ddp_every_rank_reads", "raw_mpiio", "raw_direct")}
    print(f"| {c[0]:.0f} | {c[1]} | {c[2]} | {fmt(se)} | {fmt(ev)} | {fmt(r)} | {fmt(rd)} | {fmt(f)} | "
          f"{ratio(r, h)} | {ratio(med['raw_mpiio'], med['h5ddp_every_rank_reads'])} | "
          f"{ratio(med['raw_direct'], med['h5ddp_every_rank_reads'])} | {ratio(f, h)} |")
