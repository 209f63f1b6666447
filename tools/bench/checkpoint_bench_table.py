"""Turns the RESULT lines of h5ddp-bench-checkpoint and tools/bench/torch_ckpt_peer.py (one run of
tools/bench/checkpoint_bench.sh) into the markdown tables of docs/BENCHMARKS.md "## Checkpoint".

Times are medians over repetitions; ratios are throughput ratios (other's median time / h5ddp's median time), and
"paired" lists the ratio of each repetition (the two programs ran back to back in it), so that one lucky run of
either side cannot decide a row. h5ddp's load is the default strategy (every rank reads); share + exchange is
shown beside it."""
import collections
import statistics
import sys

times = collections.defaultdict(list)
rss = collections.defaultdict(float)
previous = None
for line in open(sys.argv[1]):
    if not line.startswith("RESULT"):
        continue
    kv = dict(item.split("=", 1) for item in line.split()[1:])
    method, _, variant = kv["method"].partition("@")  # @LABEL: a VARIANTS run of checkpoint_bench.sh
    # h5ddp-bench-checkpoint loads with both strategies after each save, taking turns going first. The first
    # load of a process ran slower on these VMs whichever strategy it was, and a resume is a process's first
    # load (as torch_ckpt_peer.py's one torch.load per process is): the h5ddp columns use only the loads that
    # came first, the ones that came second are kept apart as "_second".
    if kv["op"] == "load" and method.startswith("h5ddp_") and previous != "h5ddp":
        method += "_second"
    previous = method
    if variant:
        method += "@" + variant
    key = (float(kv["gib"]), int(kv["ranks"]), int(kv["fsync"]), kv["op"], method)
    times[key].append(float(kv["seconds"]))
    rss[key] = max(rss[key], float(kv["extra_rss_pct"]))

cases = sorted({k[:3] for k in times})


def med(case, op, method):
    v = times.get(case + (op, method))
    return statistics.median(v) if v else None


def fmt(x):
    return "-" if x is None else f"{x:.2f}"


def ratio(other, h5):
    return "-" if other is None or h5 is None else f"{other / h5:.2f}x"


def paired(case, op, other, h5):
    a, b = times.get(case + (op, other), []), times.get(case + (op, h5), [])
    return " ".join(f"{x / y:.2f}" for x, y in zip(a, b)) or "-"


print("### Save (seconds, median of repetitions; ratio = throughput relative to h5ddp's)\n")
print("| GiB | ranks | fsync | h5ddp | torch.save (rank 0) | dd | raw MPI-IO | h5ddp vs torch.save | paired | "
      "h5ddp / dd | paired | h5ddp / raw | h5ddp extra RSS |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for c in cases:
    h, ts, dd, r = (med(c, "save", m) for m in ("h5ddp", "torch_save", "dd", "raw_mpiio"))
    print(f"| {c[0]:.2f} | {c[1]} | {c[2]} | {fmt(h)} | {fmt(ts)} | {fmt(dd)} | {fmt(r)} | **{ratio(ts, h)}** | "
          f"{paired(c, 'save', 'torch_save', 'h5ddp')} | **{ratio(dd, h)}** | {paired(c, 'save', 'dd', 'h5ddp')} | "
          f"{ratio(r, h)} | {rss[c + ('save', 'h5ddp')]:.1f}% |")
if any(k[3] == "save" and k[4] == "h5ddp_mpiio" for k in times):
    print("\n### Save: O_DIRECT writes (default) against MPI-IO through the page cache (`--methods h5ddp,mpiio`)\n")
    print("| GiB | ranks | fsync | h5ddp (direct) | h5ddp (mpiio) | mpiio / direct time | paired |")
    print("|---|---|---|---|---|---|---|")
    for c in cases:
        h, m = med(c, "save", "h5ddp"), med(c, "save", "h5ddp_mpiio")
        print(f"| {c[0]:.2f} | {c[1]} | {c[2]} | {fmt(h)} | {fmt(m)} | **{ratio(m, h)}** | "
              f"{paired(c, 'save', 'h5ddp_mpiio', 'h5ddp')} |")
print("\n### Load (seconds, median, cold page cache; every rank ends with the whole state)\n")
print("| GiB | ranks | fsync | h5ddp (every rank reads) | share+exchange | torch.load (every rank) | dd cold read | "
      "h5ddp vs torch.load | h5ddp / dd read | every rank reads, 2nd load | share+exchange, 2nd load | "
      "raw MPI-IO + bcast | raw O_DIRECT + bcast | torch.load extra RSS |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for c in cases:
    ev, se, tl, dd, ev2, se2, r, rd = (
        med(c, "load", m) for m in ("h5ddp_every_rank_reads", "h5ddp_share_exchange", "torch_load", "dd_cold_read",
                                    "h5ddp_every_rank_reads_second", "h5ddp_share_exchange_second", "raw_mpiio",
                                    "raw_direct"))
    print(f"| {c[0]:.2f} | {c[1]} | {c[2]} | {fmt(ev)} | {fmt(se)} | {fmt(tl)} | {fmt(dd)} | **{ratio(tl, ev)}** | "
          f"**{ratio(dd, ev)}** | {fmt(ev2)} | {fmt(se2)} | {fmt(r)} | {fmt(rd)} | "
          f"{rss[c + ('load', 'torch_load')]:.0f}% |")
labels = sorted({k[4].split("@")[1] for k in times if "@" in k[4]})
if labels:
    print("\n### Load variants (first load of each process, every rank reads; dd = cold read of the same bytes)\n")
    print("| GiB | ranks | fsync | default | " + " | ".join(labels) + " | default / dd | " +
          " | ".join(l + " / dd" for l in labels) + " | paired default vs " + ", ".join(labels) + " |")
    print("|---|---|---|---|" + "---|" * (2 * len(labels) + 2))
    for c in cases:
        d, dd = med(c, "load", "h5ddp_every_rank_reads"), med(c, "load", "dd_cold_read")
        vs = [med(c, "load", "h5ddp_every_rank_reads@" + l) for l in labels]
        pairs = "; ".join(paired(c, "load", "h5ddp_every_rank_reads@" + l, "h5ddp_every_rank_reads") for l in labels)
        print(f"| {c[0]:.2f} | {c[1]} | {c[2]} | {fmt(d)} | " + " | ".join(fmt(v) for v in vs) +
              f" | **{ratio(dd, d)}** | " + " | ".join(ratio(dd, v) for v in vs) + f" | {pairs} |")

