// A dataset's rows in HDF5 transfers (private to h5ddp_checkpoint): hyperslab selection and the split of large
// transfers that the writer, the loader and verification share.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "checkpoint/plan.hpp"

namespace h5ddp::ckpt {

// Selects rows [begin, end) (dimension 0) of a dataspace of `shape`; all of a scalar; nothing when begin == end.
void select_rows(hid_t space, const std::vector<int64_t>& shape, uint64_t begin, uint64_t end);
// MPI-IO counts are int: one HDF5 transfer moves at most kMaxTransferBytes (more rows go in several calls).
// H5DDP_MAX_TRANSFER_BYTES (test-only) lowers it so that small tests exercise the multi-call paths.
inline constexpr uint64_t kMaxTransferBytes = 1ull << 30;
uint64_t max_transfer_bytes();
// Number of transfers needed for rows [begin, end) of `d`.
size_t transfer_count(const DatasetPlan& d, uint64_t begin, uint64_t end);
// Reads rows [row_begin, row_end) of `d` into `buf` (which receives row_begin first), with the given transfer
// list, in max(min_calls, transfer_count) calls (collective transfers: every rank must make the same number).
void read_rows(hid_t dset, const DatasetPlan& d, uint64_t row_begin, uint64_t row_end, void* buf, hid_t dxpl,
               size_t min_calls = 0);

}  // namespace h5ddp::ckpt
