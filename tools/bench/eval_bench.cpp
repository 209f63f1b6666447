// h5ddp-bench-eval: CPU time per image of the evaluation forward (score_rows, the code of h5ddp-ckpt eval and
// h5ddp-train's evaluations) at several batch sizes, beside a training step's forward (train mode, autograd on,
// the per-rank batch of the default job) and forward + backward, on the same model and the same images, one
// process, one thread, alternating rounds. Results: docs/BENCHMARKS_TRAINING.md "Evaluation speed".
//   h5ddp-bench-eval [--model cnn|mlp] [--images N] [--rounds R] [--train-batch B] [--data-dir DIR] [--heap
//   keep|default]
// --heap keep (the default): keep_freed_memory_in_heap(), as h5ddp-ckpt eval and a replicated h5ddp-train do;
// default: glibc's own thresholds (what the evaluation cost before).
#include <sys/resource.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "train/batch.hpp"
#include "train/data.hpp"
#include "train/dataset.hpp"
#include "train/models.hpp"

namespace {

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

std::vector<int64_t> rows(int64_t begin, int64_t end) {
  std::vector<int64_t> v;
  for (int64_t i = begin; i < end; ++i) v.push_back(i);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace h5ddp;
  std::map<std::string, std::string> opt{{"model", "cnn"},
                                         {"images", "10000"},
                                         {"rounds", "3"},
                                         {"train-batch", "60"},
                                         {"data-dir", kDefaultFashionMnistDir},
                                         {"heap", "keep"}};
  for (int i = 1; i + 1 < argc; i += 2) opt[std::string(argv[i]).substr(2)] = argv[i + 1];
  if (opt["heap"] == "keep") keep_freed_memory_in_heap();
  torch::set_num_threads(1);
  ModelSpec spec;
  spec.name = opt["model"];
  TrainModel model = build_train_model(spec);
  auto data = images_dataset(read_fashion_mnist(opt["data-dir"], "t10k"), "t10k");
  const int64_t n = std::min<int64_t>(std::stoll(opt["images"]), data->size());
  const int64_t train_batch = std::stoll(opt["train-batch"]);
  const int rounds = std::stoi(opt["rounds"]);

  // name -> CPU seconds summed over the rounds
  std::vector<std::pair<std::string, double>> total;
  auto add = [&](const std::string& name, double s) {
    for (auto& [k, v] : total)
      if (k == name) return void(v += s);
    total.emplace_back(name, s);
  };
  for (int r = 0; r < rounds; ++r) {
    model.module->eval();
    std::set<int64_t> sizes = {16, 60, 1000, score_batch_rows(data->spec())};
    for (int64_t b : sizes) {
      const double t0 = cpu_seconds();
      score_rows(model.forward, *data, 0, n, b);
      add("eval forward, batch " + std::to_string(b) + (b == score_batch_rows(data->spec()) ? " (default)" : ""),
          cpu_seconds() - t0);
    }
    model.module->train();
    for (const bool backward : {false, true}) {
      const double t0 = cpu_seconds();
      for (int64_t b = 0; b < n; b += train_batch) {
        auto [x, y] = batch_tensors(*data, rows(b, std::min(n, b + train_batch)));
        auto loss = batch_loss(data->spec(), model.forward(x), y);
        if (backward) {
          loss.backward();
          for (auto& p : model.module->parameters()) p.mutable_grad() = torch::Tensor();
        }
      }
      add(std::string(backward ? "training forward + backward" : "training forward (autograd on)") + ", batch " +
              std::to_string(train_batch),
          cpu_seconds() - t0);
    }
  }
  std::printf("model %s, %lld images, %d rounds, 1 thread, heap %s\n", opt["model"].c_str(), static_cast<long long>(n),
              rounds, opt["heap"].c_str());
  std::printf("%-45s %s\n", "what", "CPU ms per image");
  for (const auto& [name, s] : total)
    std::printf("%-45s %.4f\n", name.c_str(), 1e3 * s / static_cast<double>(n * rounds));
  return 0;
}
