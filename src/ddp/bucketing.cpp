#include "h5ddp/bucketing.hpp"

#include <algorithm>
#include <map>
#include <string>

#include "h5ddp/error.hpp"

namespace h5ddp {

std::vector<BucketSpec> assign_buckets(const std::vector<size_t>& nbytes, const std::vector<int>& group_key,
                                       size_t first_bucket_bytes, size_t bucket_cap_bytes) {
  H5DDP_CHECK(nbytes.size() == group_key.size(), "assign_buckets: " + std::to_string(nbytes.size()) + " sizes but " +
                                                     std::to_string(group_key.size()) + " group keys");
  H5DDP_CHECK(first_bucket_bytes > 0 && bucket_cap_bytes > 0, "assign_buckets: bucket limits must be positive");

  struct Open {
    BucketSpec spec;
    size_t limit;
  };
  // Each bucket remembers the reversed position of its first tensor; that is its launch order.
  std::vector<std::pair<size_t, BucketSpec>> closed;
  std::map<int, Open> open;  // per group key, the bucket being filled
  std::map<int, size_t> first_pos;

  auto close = [&](int key) {
    auto it = open.find(key);
    if (it == open.end() || it->second.spec.params.empty()) return;
    closed.emplace_back(first_pos[key], std::move(it->second.spec));
    it->second.spec = BucketSpec{};
    it->second.limit = bucket_cap_bytes;  // only the first bucket of a key is small
  };

  for (size_t pos = 0; pos < nbytes.size(); ++pos) {
    const size_t i = nbytes.size() - 1 - pos;
    const int key = group_key[i];
    auto it = open.find(key);
    if (it == open.end()) it = open.emplace(key, Open{BucketSpec{}, first_bucket_bytes}).first;
    // Close first if this tensor would push a non-empty bucket over its limit.
    if (!it->second.spec.params.empty() && it->second.spec.bytes + nbytes[i] > it->second.limit) close(key);
    if (it->second.spec.params.empty()) first_pos[key] = pos;
    it->second.spec.params.push_back(i);
    it->second.spec.bytes += nbytes[i];
    if (it->second.spec.bytes >= it->second.limit) close(key);
  }
  for (auto& [key, o] : open) close(key);

  std::stable_sort(closed.begin(), closed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<BucketSpec> out;
  out.reserve(closed.size());
  for (auto& c : closed) out.push_back(std::move(c.second));
  return out;
}

std::vector<int> assign_shards(const std::vector<size_t>& nbytes, int world) {
  std::vector<size_t> order(nbytes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return nbytes[a] > nbytes[b]; });
  std::vector<size_t> load(static_cast<size_t>(std::max(world, 1)), 0);
  std::vector<int> owner(nbytes.size(), 0);
  for (size_t i : order) {
    const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = static_cast<int>(r);
    load[r] += nbytes[i];
  }
  return owner;
}

std::vector<int64_t> split_bucket(const std::vector<int64_t>& numel, const std::vector<int64_t>& row_numel, int world) {
  int64_t total = 0;
  for (int64_t n : numel) total += n;
  std::vector<int64_t> cuts(static_cast<size_t>(world) + 1, total);
  cuts[0] = 0;
  size_t k = 0;
  int64_t start = 0;  // first element of tensor k
  for (int r = 1; r < world; ++r) {
    const int64_t ideal = static_cast<int64_t>((static_cast<__int128>(total) * r) / world);
    while (k < numel.size() && start + numel[k] <= ideal) start += numel[k++];
    int64_t at = total;
    if (k < numel.size()) {
      const int64_t row = std::max<int64_t>(1, row_numel[k]);
      const int64_t rows_in = (ideal - start + row / 2) / row;  // nearest row boundary
      at = start + std::min(rows_in * row, numel[k]);
    }
    cuts[r] = std::max(cuts[r - 1], at);
  }
  return cuts;
}

}  // namespace h5ddp
