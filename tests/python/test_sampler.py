"""h5ddp_torch's sampler is h5ddp's (include/h5ddp/sampler.hpp): splitmix64's reference outputs (the values
tests/train/sampler_test.cpp checks), permutations fixed by (seed, epoch), every sample once per epoch at any
world size, the rank slices of a global batch, the dropped remainder, resume at any position. That the whole order
equals the C++ one is shown end to end by test_cross_resume.py (identical losses need identical batches)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python"))
from h5ddp_torch.sampler import DataState, DistributedSampler, SplitMix64, shuffled_indices  # noqa: E402


def main():
    g = SplitMix64(0)
    assert [g.next() for _ in range(3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    p0 = shuffled_indices(1000, 7, 0)
    assert sorted(p0) == list(range(1000)) and p0 != list(range(1000))
    assert p0 == shuffled_indices(1000, 7, 0) and p0 != shuffled_indices(1000, 7, 1) != shuffled_indices(1000, 8, 0)

    n, batch = 103, 12
    reference = None
    for world in (1, 2, 3, 4):
        ranks = [DistributedSampler(n, batch, 5, world, r) for r in range(world)]
        data, seen, batches = DataState(5, 0, 0, batch), [], []
        while data.epoch == 0:
            parts = [s.local_indices(data.epoch, data.position) for s in ranks]
            glob = [i for part in parts for i in part]
            assert glob == ranks[0].global_indices(data.epoch, data.position)
            batches.append(glob)
            seen += glob
            ranks[0].advance(data)
        assert len(batches) == n // batch and len(set(seen)) == len(seen) == (n // batch) * batch
        reference = reference or batches
        assert batches == reference, f"world {world} visits another order"
    s = DistributedSampler(n, batch, 5, 1, 0)
    full = s.global_indices(0, 0) + s.global_indices(0, 12)
    assert s.global_indices(0, 5) == full[5:17], "a resume at any position continues with the next sample"
    for bad in ((100, 0, 1, 1, 0), (100, 10, 1, 4, 0), (100, 200, 1, 1, 0), (100, 10, 1, 2, 2)):
        try:
            DistributedSampler(*bad)
            raise AssertionError(f"accepted {bad}")
        except ValueError:
            pass
    print("PASS")


if __name__ == "__main__":
    main()
