"""Scripted models for script_units_test.cpp.

python3 script_units_models.py OUTDIR writes OUTDIR/{gpt,nested,residual,cond}.pt (torch.jit.script, seeded
random weights):
  gpt       token + position embeddings added, an nn.ModuleList of blocks taking (x, mask) with residuals, a final
            LayerNorm, a head tied to the token embedding under two names (head.weight is tok.weight)
  nested    the blocks two levels down: `transformer` loops over its own ModuleList `blocks`
  residual  residual Linear layers, and modules that cannot be units: one returning a tuple, one called without a
            tensor, one never called
  cond      units called inside an `if` and a loop
  example   tools/examples/gpt.py's GPT, tied (lm_head.weight is wte.weight), with dropout
"""
import os
import sys
from typing import Tuple

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)

    def forward(self, x, mask):
        return x + torch.tanh(self.fc(self.ln(x))).masked_fill(mask, 0.0)


class Gpt(nn.Module):
    def __init__(self, vocab: int = 11, d: int = 8, n: int = 3, ctx: int = 6):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.h = nn.ModuleList([Block(d) for _ in range(n)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx):
        t = idx.size(1)
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        mask = (idx == 0).unsqueeze(-1)
        for block in self.h:
            x = block(x, mask)
        return self.head(self.ln_f(x))


class Trunk(nn.Module):
    def __init__(self, d: int, n: int):
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])
        self.ln = nn.LayerNorm(d)

    def forward(self, x, mask):
        for block in self.blocks:
            x = block(x, mask)
        return self.ln(x)


class Nested(nn.Module):
    def __init__(self, d: int = 8):
        super().__init__()
        self.emb = nn.Linear(d, d)
        self.transformer = Trunk(d, 2)
        self.out = nn.Linear(d, 3)

    def forward(self, x):
        mask = x[:, :, :1] > 1.5
        return self.out(self.transformer(self.emb(x), mask))


class Pair(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, d)

    def forward(self, x) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.a(x), self.b(x)


class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(0.5))

    def forward(self, n: int):
        return self.w * n


class Residual(nn.Module):
    def __init__(self, d: int = 6):
        super().__init__()
        self.l1 = nn.Linear(d, d)
        self.l2 = nn.Linear(d, d)
        self.pair = Pair(d)
        self.scale = Scale()
        self.unused = nn.Linear(d, d)

    def forward(self, x):
        y = x + torch.relu(self.l1(x))
        y = y + self.l2(y)
        a, b = self.pair(y)
        return a * b + self.scale(3)


class Cond(nn.Module):
    def __init__(self, d: int = 5):
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, d)

    def forward(self, x):
        if bool(x.sum() > 0):
            y = self.a(x)
        else:
            y = self.b(x)
        for _ in range(2):
            y = torch.tanh(self.b(y))
        return y


def example_gpt():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "examples"))
    import gpt  # noqa: E402 - tools/examples is not a package
    return gpt.GPT(vocab_size=32, context=8, layers=2, heads=2, dim=16, dropout=0.1, tie_weights=True)


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    models = [("gpt", Gpt()), ("nested", Nested()), ("residual", Residual()), ("cond", Cond()),
              ("example", example_gpt())]
    for name, model in models:
        torch.jit.script(model).save(os.path.join(out, name + ".pt"))


if __name__ == "__main__":
    main()
