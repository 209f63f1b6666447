#include "checkpoint/rows.hpp"

#include <algorithm>
#include <cstdlib>

#include "h5ddp/error.hpp"

namespace h5ddp::ckpt {

void select_rows(hid_t space, const std::vector<int64_t>& shape, uint64_t begin, uint64_t end) {
  if (begin == end) {
    H5DDP_CHECK_H5(H5Sselect_none(space));
    return;
  }
  if (shape.empty()) {
    H5DDP_CHECK_H5(H5Sselect_all(space));
    return;
  }
  std::vector<hsize_t> start(shape.size(), 0), count(shape.begin(), shape.end());
  start[0] = begin;
  count[0] = end - begin;
  H5DDP_CHECK_H5(H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr));
}

uint64_t max_transfer_bytes() {
  static const uint64_t v = [] {
    const char* e = std::getenv("H5DDP_MAX_TRANSFER_BYTES");
    const uint64_t n = e ? std::strtoull(e, nullptr, 10) : 0;
    return n > 0 ? std::min(n, kMaxTransferBytes) : kMaxTransferBytes;
  }();
  return v;
}

size_t transfer_count(const DatasetPlan& d, uint64_t begin, uint64_t end) {
  const uint64_t per = std::max<uint64_t>(1, d.row_bytes() ? max_transfer_bytes() / d.row_bytes() : 1);
  return static_cast<size_t>((end - begin + per - 1) / per);
}

void read_rows(hid_t ds, const DatasetPlan& d, uint64_t begin, uint64_t end, void* buf, hid_t dxpl, size_t min_calls) {
  h5::Handle type = d.file_type();
  h5::Handle fspace = h5::dataspace(H5Dget_space(ds));
  const uint64_t per = std::max<uint64_t>(1, d.row_bytes() ? max_transfer_bytes() / d.row_bytes() : 1);
  const size_t calls = std::max<size_t>({min_calls, transfer_count(d, begin, end), 1});
  for (size_t i = 0; i < calls; ++i) {
    const uint64_t b = std::min(end, begin + i * per), e = std::min(end, b + per);
    select_rows(fspace, d.shape, b, e);
    std::vector<int64_t> mshape = d.shape;
    if (!mshape.empty()) mshape[0] = static_cast<int64_t>(e - b);
    h5::Handle mspace = h5::make_space(mshape);
    if (b == e) H5DDP_CHECK_H5(H5Sselect_none(mspace));
    H5DDP_CHECK_H5(H5Dread(ds, type, mspace, fspace, dxpl, static_cast<char*>(buf) + (b - begin) * d.row_bytes()));
  }
}

}  // namespace h5ddp::ckpt
