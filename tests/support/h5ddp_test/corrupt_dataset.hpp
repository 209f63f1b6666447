// Test helper: damage one dataset of a checkpoint in place, so that a load fails at its checksum.
#pragma once

#include <string>

namespace h5ddp::test {

// Collective over test::world(): rank 0 flips one byte in the middle of `dataset`'s stored data.
void corrupt_dataset(const std::string& path, const std::string& dataset);

}  // namespace h5ddp::test
