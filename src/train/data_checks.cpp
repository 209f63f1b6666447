#include "train/data_checks.hpp"

#include <limits>
#include <string>

#include "h5ddp/error.hpp"

namespace h5ddp {

void check_data_fits_model(const TrainModel& model, const Dataset& train, const Dataset* test, const Compute& compute,
                           bool keep_best, Comm& comm) {
  const int64_t width = agreed(comm, [&] {
    model.module->eval();
    const int64_t w = check_model_accepts(model.forward, train, compute);
    model.module->train();
    if (keep_best && !train.spec().classification)
      throw ConfigError("--keep-best keeps the checkpoint of the best test accuracy; " + train.describe() +
                        " has float targets (regression), which have none");
    return w;
  });
  std::string err;
  if (!train.spec().classification) return;
  for (const Dataset* d : {&train, test}) {
    if (!d) continue;
    const int64_t n = d->size(), r = comm.rank(), w = comm.size();
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
    d->label_range(n * r / w, n * (r + 1) / w, lo, hi);
    comm.allreduce(&lo, 1, DType::kI64, ReduceOp::kMin);
    comm.allreduce(&hi, 1, DType::kI64, ReduceOp::kMax);
    const int64_t classes = d->spec().num_classes > 0 ? d->spec().num_classes : width;
    const std::string bound = d->spec().num_classes > 0 ? "the file's num_classes" : "the model's output width";
    if (d->spec().num_classes > width)
      err = d->label_source() + ": num_classes " + std::to_string(classes) + " but the model has " +
            std::to_string(width) + " outputs";
    else if (lo < 0 || hi >= classes)
      err = d->label_source() + ": label " + std::to_string(lo < 0 ? lo : hi) + " outside [0, " +
            std::to_string(classes) + ") (" + bound + ")";
    comm.raise_if_any(err);
  }
}

}  // namespace h5ddp
