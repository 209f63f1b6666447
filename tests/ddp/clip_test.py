"""DistributedDataParallel::clip_grad_norm against PyTorch's torch.nn.utils.clip_grad_norm_ (issue 40): the same
averaged gradients (written by h5ddp-clip-probe under mpirun, before and after clipping) clipped in Python.
Replicated at 2 ranks: the gradients and the norm equal PyTorch's bit for bit, on every rank. ZeRO-1 (--shard) at 2
and 3 ranks: the shards together equal PyTorch's within 1e-6 relative (the norm is summed from the ranks' squared
norms in another order), and every rank returned the same norm. A max norm above the total changes nothing. A +inf
on one rank: every rank returns NaN and no gradient changes.

  /usr/bin/python3 tests/ddp/clip_test.py [NP CASE...]
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import h5ddp_test as ht  # noqa: E402


def probe(np_, tag, *args):
    d = ht.scratch(f"clip-{tag}")
    prefix = os.path.join(d, "grads")
    r = ht.mpirun(np_, [ht.tool("h5ddp-clip-probe"), prefix, *args], 120)
    ht.check(r.rc == 0, f"h5ddp-clip-probe {' '.join(args)} failed: {r}")
    return [torch.load(f"{prefix}.rank{k}.pt") for k in range(np_)]


def pytorch_clip(names, before, max_norm):
    """PyTorch's clip over parameters whose .grad is `before` (in DDP's parameter order); returns (norm, grads)."""
    params = []
    for g in before:
        p = torch.zeros_like(g, requires_grad=True)
        p.grad = g.clone()
        params.append(p)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return float(norm), [p.grad for p in params]


def merged(outs, key):
    """Name -> tensor over every rank's held gradients (sharded: row pieces, which must tile each parameter)."""
    pieces = {}
    for o in outs:
        for n, b, t in zip(o["names"], o["row_begin"], o[key]):
            pieces.setdefault(n, []).append((b, t))
    out = {}
    for n, parts in pieces.items():
        parts.sort(key=lambda p: p[0])
        row = 0
        for b, t in parts:
            ht.check(b == row, f"{n}: a piece starts at row {b}, the rows before end at {row} (gap or overlap)")
            row += t.shape[0] if t.dim() else 1
        out[n] = torch.cat([t for _, t in parts]) if parts[0][1].dim() else parts[0][1]
    return out


def test_replicated_bitwise():
    outs = probe(2, "rep", "--max-norm", "0.5")
    names = list(outs[0]["names"])
    norm, want = pytorch_clip(names, list(outs[0]["before"]), 0.5)
    ht.check(norm > 0.5, f"the test needs clipping to engage: total norm {norm} <= 0.5")
    for k, o in enumerate(outs):
        ht.check(o["norm"] == norm, f"rank {k}: norm {o['norm']!r}, PyTorch {norm!r}")
        for n, got, w in zip(o["names"], o["after"], want):
            ht.check(torch.equal(got, w), f"rank {k} {n}: clipped gradient differs from PyTorch's "
                                          f"(max abs {(got - w).abs().max().item()})")
    print(f"replicated: norm {norm:.6f}, {len(names)} gradients bitwise equal to clip_grad_norm_ on both ranks")


def sharded(np_):
    outs = probe(np_, f"shard{np_}", "--shard", "--max-norm", "0.2")
    ht.check(all(len(o["names"]) > 0 for o in outs), f"a rank owns no parameter at {np_} ranks; the test needs all")
    before, after = merged(outs, "before"), merged(outs, "after")
    rep = probe(np_, f"shardref{np_}", "--max-norm", "0.2")  # replicated run: the parameter order and all gradients
    order = list(rep[0]["names"])
    ht.check(sorted(order) == sorted(before), f"sharded ranks hold {sorted(before)}, the model has {order}")
    for n, g in zip(order, rep[0]["before"]):  # the same averaged gradients (reduce-scatter vs allreduce)
        ht.check(torch.allclose(before[n], g, rtol=1e-6, atol=1e-9), f"{n}: sharded gradient differs before clipping")
    norm, want = pytorch_clip(order, [before[n] for n in order], 0.2)
    ht.check(norm > 0.2, f"the test needs clipping to engage: total norm {norm} <= 0.2")
    norms = {o["norm"] for o in outs}
    ht.check(len(norms) == 1, f"ranks returned different norms {norms}")
    got = norms.pop()
    ht.check(abs(got - norm) <= 1e-6 * norm, f"sharded norm {got!r}, PyTorch {norm!r}")
    for n, w in zip(order, want):
        ht.check(torch.allclose(after[n], w, rtol=1e-6, atol=0), f"{n}: sharded clipped gradient differs")
    print(f"sharded at {np_} ranks: norm {got:.6f} (PyTorch {norm:.6f}); clipped shards within 1e-6")


def test_sharded_2():
    sharded(2)


def test_sharded_3():
    sharded(3)


def test_no_clip_above_norm():
    outs = probe(2, "big", "--max-norm", "1e6")
    for o in outs:
        for n, b, a in zip(o["names"], o["before"], o["after"]):
            ht.check(torch.equal(a, b), f"{n}: changed although the norm is below max_norm")


def test_nonfinite_agreed():
    for args in ((), ("--shard",)):
        outs = probe(2, "inf" + "".join(args).replace("-", ""), "--inf-on-rank", "1", *args)
        for k, o in enumerate(outs):
            ht.check(math.isnan(o["norm"]), f"rank {k} ({args}): norm {o['norm']!r}, expected NaN on every rank")
            for n, b, a in zip(o["names"], o["before"], o["after"]):
                ht.check(torch.equal(a, b), f"rank {k} {n}: a gradient changed although the step is to be skipped")


if __name__ == "__main__":
    sys.exit(ht.main([test_replicated_bitwise, test_sharded_2, test_sharded_3, test_no_clip_above_norm,
                      test_nonfinite_agreed]))
