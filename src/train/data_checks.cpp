#include "train/data_checks.hpp"

#include <limits>
#include <string>
#include <utility>

#include "h5ddp/error.hpp"

namespace h5ddp {

namespace {

using Range = std::pair<int64_t, int64_t>;

// Collective. The smallest and largest value over all ranks, each rank scanning its share of `d`'s rows with `scan`.
template <typename Scan>
Range global_range(const Dataset& d, Comm& comm, Scan scan) {
  const int64_t n = d.size(), r = comm.rank(), w = comm.size();
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  scan(n * r / w, n * (r + 1) / w, lo, hi);
  comm.allreduce(&lo, 1, DType::kI64, ReduceOp::kMin);
  comm.allreduce(&hi, 1, DType::kI64, ReduceOp::kMax);
  return {lo, hi};
}

// Collective. Token data: every id in [0, vocab_size), before the model ever sees one (an embedding would fail
// with an index error naming neither the file nor the dataset).
void check_token_ids(const Dataset& d, Comm& comm) {
  const SampleSpec& spec = d.spec();
  const auto [lo, hi] =
      global_range(d, comm, [&](int64_t b, int64_t e, int64_t& mn, int64_t& mx) { d.token_range(b, e, mn, mx); });
  std::string err;
  if (lo < 0 || hi >= spec.vocab_size)
    err = d.token_source() + ": token id " + std::to_string(lo < 0 ? lo : hi) + " outside [0, " +
          std::to_string(spec.vocab_size) + ") (the file's vocab_size)";
  comm.raise_if_any(err);
}

// Collective. Every label in [0, classes): the file's num_classes (per position: vocab_size), else the model's
// output width.
void check_labels(const Dataset& d, int64_t width, Comm& comm) {
  const SampleSpec& spec = d.spec();
  const auto [lo, hi] =
      global_range(d, comm, [&](int64_t b, int64_t e, int64_t& mn, int64_t& mx) { d.label_range(b, e, mn, mx); });
  std::string err;
  const int64_t declared = spec.per_position ? spec.vocab_size : spec.num_classes;
  const int64_t classes = declared > 0 ? declared : width;
  const std::string bound = spec.per_position ? "the file's vocab_size"
                            : declared > 0    ? "the file's num_classes"
                                              : "the model's output width";
  if (declared > width)
    err = d.label_source() + ": " + (spec.per_position ? "vocab_size " : "num_classes ") + std::to_string(declared) +
          " but the model has " + std::to_string(width) + " outputs" + (spec.per_position ? " per position" : "");
  else if (lo < 0 || hi >= classes)  // an empty split leaves lo = int64 max, hi = int64 min
    err = d.label_source() + ": label " + std::to_string(lo < 0 ? lo : hi) + " outside [0, " + std::to_string(classes) +
          ") (" + bound + ")" + (spec.per_position ? "; -100 marks an ignored position" : "");
  comm.raise_if_any(err);
}

}  // namespace

void check_data_fits_model(const TrainModel& model, const Dataset& train, const Dataset* test, const Compute& compute,
                           bool keep_best, Comm& comm) {
  for (const Dataset* d : {&train, test})
    if (d && d->spec().tokens) check_token_ids(*d, comm);
  const int64_t width = agreed(comm, [&] {
    model.module->eval();
    const int64_t w = check_model_accepts(model.forward, train, compute);
    model.module->train();
    if (keep_best && !train.spec().classification)
      throw ConfigError("--keep-best keeps the checkpoint of the best test accuracy; " + train.describe() +
                        " has float targets (regression), which have none");
    return w;
  });
  if (!train.spec().classification) return;
  for (const Dataset* d : {&train, test})
    if (d && !d->spec().stream) check_labels(*d, width, comm);  // a stream's labels are its tokens: checked above
}

}  // namespace h5ddp
