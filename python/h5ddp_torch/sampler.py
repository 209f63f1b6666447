"""h5ddp's distributed sampler (include/h5ddp/sampler.hpp), bit for bit, so that a Python training loop and
h5ddp-train visit the same samples in the same order and resume each other's runs on the exact next sample.

Epoch e visits a Fisher-Yates shuffle of [0, n) driven by splitmix64 seeded from (seed, e). Global batch k is
perm[k*G, (k+1)*G); rank r of N takes the contiguous slice [r*G/N, (r+1)*G/N). The position in an epoch is
counted in global samples; the last n % G samples of an epoch are dropped.
"""
from dataclasses import dataclass

_MASK = (1 << 64) - 1


class SplitMix64:
    """splitmix64 (Steele, Lea, Flood 2014) with 64-bit wrap-around arithmetic."""

    def __init__(self, seed):
        self.state = seed & _MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def below(self, bound):
        """Uniform in [0, bound) by rejection (no modulo bias); bound > 0."""
        limit = _MASK - _MASK % bound
        while True:
            x = self.next()
            if x < limit:
                return x % bound


def mix_seed(a, b):
    """Two words into one seed (per-epoch and per-rank derived streams)."""
    g = SplitMix64((a ^ ((b * 0xD1B54A32D192ED03 + 0x8CB92BA72F3D8DD7) & _MASK)) & _MASK)
    g.next()
    return g.next()


def shuffled_indices(n, seed, epoch):
    """The permutation of [0, n) for (seed, epoch)."""
    p = list(range(n))
    g = SplitMix64(mix_seed(seed, epoch & _MASK))
    for i in range(n - 1, 0, -1):
        j = g.below(i + 1)
        p[i], p[j] = p[j], p[i]
    return p


@dataclass
class DataState:
    """Where the data order stands; saved as /data in every checkpoint."""
    seed: int = 42
    epoch: int = 0
    position: int = 0  # global samples consumed in this epoch
    global_batch: int = 120


class DistributedSampler:
    def __init__(self, num_samples, global_batch, seed, world_size, rank):
        if world_size <= 0 or not 0 <= rank < world_size:
            raise ValueError(f"sampler: rank {rank} not in a world of {world_size}")
        if global_batch <= 0 or global_batch % world_size:
            raise ValueError(f"global batch {global_batch} must be positive and divisible by the {world_size} ranks")
        if global_batch > num_samples:
            raise ValueError(f"global batch {global_batch} exceeds the {num_samples} samples")
        self.num_samples, self.global_batch, self.seed = num_samples, global_batch, seed
        self.world_size, self.rank = world_size, rank
        self._epoch, self._perm = None, None

    @property
    def local_batch(self):
        return self.global_batch // self.world_size

    @property
    def steps_per_epoch(self):
        return self.num_samples // self.global_batch

    def has_batch(self, position):
        return position >= 0 and position + self.global_batch <= self.num_samples

    def _permutation(self, epoch):
        if epoch != self._epoch:
            self._perm, self._epoch = shuffled_indices(self.num_samples, self.seed, epoch), epoch
        return self._perm

    def _check(self, position):
        if not self.has_batch(position):
            raise ValueError(f"sampler position {position} leaves no full global batch of {self.global_batch} "
                             f"in an epoch of {self.num_samples} samples")

    def global_indices(self, epoch, position):
        self._check(position)
        return self._permutation(epoch)[position:position + self.global_batch]

    def local_indices(self, epoch, position):
        """This rank's slice of the global batch that starts at `position` of epoch `epoch`."""
        self._check(position)
        begin = position + self.rank * self.local_batch
        return self._permutation(epoch)[begin:begin + self.local_batch]

    def advance(self, data):
        """After an optimizer step: moves data.position past one global batch, to the next epoch when no full
        batch is left. Returns True when an epoch ended."""
        data.position += self.global_batch
        if self.has_batch(data.position):
            return False
        data.epoch += 1
        data.position = 0
        return True
