// h5ddp-clip-probe: the gradients before and after DistributedDataParallel::clip_grad_norm, for
// tests/ddp/clip_test.py to compare with torch.nn.utils.clip_grad_norm_ in Python (issue 40).
//
//   mpirun -np N h5ddp-clip-probe OUT_PREFIX [--shard] [--max-norm X] [--inf-on-rank R]
//
// A small MLP under DDP (ZeRO-1 with --shard); each rank a batch of its own; after finish_backward every rank writes
// OUT_PREFIX.rank<r>.pt: {"names": the parameters this rank holds averaged gradients of (all; --shard: its pieces,
// rows of parameters), "row_begin": each one's first row, "before": their gradients, "after": the same after
// clip_grad_norm(X), "norm": what it returned}.
// --inf-on-rank R: rank R puts +inf into its first gradient before clipping (the verdict must be NaN everywhere).
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>

#include "h5ddp/ddp.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/mpi_env.hpp"
#include "h5ddp/sharded_ddp.hpp"

namespace {

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(20, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 64));
    fc3 = register_module("fc3", torch::nn::Linear(64, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc3(torch::tanh(fc2(torch::tanh(fc1(x))))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

}  // namespace

int main(int argc, char** argv) {
  h5ddp::MpiEnv env(&argc, &argv);
  auto comm_ptr = h5ddp::MpiComm::dup(MPI_COMM_WORLD);
  h5ddp::MpiComm& comm = *comm_ptr;
  if (argc < 2) {
    std::fprintf(stderr, "usage: h5ddp-clip-probe OUT_PREFIX [--shard] [--max-norm X] [--inf-on-rank R]\n");
    return 2;
  }
  const std::string prefix = argv[1];
  bool shard = false;
  double max_norm = 0.5;
  int inf_rank = -1;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--shard")) shard = true;
    if (!std::strcmp(argv[i], "--max-norm") && i + 1 < argc) max_norm = std::stod(argv[++i]);
    if (!std::strcmp(argv[i], "--inf-on-rank") && i + 1 < argc) inf_rank = std::stoi(argv[++i]);
  }
  torch::set_num_threads(1);
  torch::manual_seed(7);
  auto net = std::make_shared<Net>();
  h5ddp::DdpOptions options;
  options.first_bucket_bytes = 4096;  // several buckets, so sharding splits the parameters over ranks
  options.bucket_cap_bytes = 8192;
  std::unique_ptr<h5ddp::DataParallel> wrapper;
  if (shard)
    wrapper = std::make_unique<h5ddp::ShardedDataParallel>(comm, *net, h5ddp::ShardStage::kOptimizer, options);
  else
    wrapper = std::make_unique<h5ddp::DistributedDataParallel>(comm, *net, options);
  h5ddp::DataParallel& ddp = *wrapper;
  torch::manual_seed(100 + comm.rank());  // each rank its own batch
  const auto x = torch::randn({32, 20}) * 3;
  const auto y = torch::randint(0, 10, {32});
  ddp.prepare_forward();
  torch::nn::functional::cross_entropy(net->forward(x), y).backward();
  ddp.finish_backward();

  // What this rank holds averaged gradients of: every parameter, or (--shard) its pieces, rows of parameters.
  const auto& names = ddp.parameter_names();
  c10::List<std::string> held;
  c10::List<int64_t> row_begin;
  std::vector<torch::Tensor> mine;
  for (size_t i = 0; i < ddp.parameters().size() && !shard; ++i) {
    held.push_back(names[i]);
    row_begin.push_back(0);
    mine.push_back(ddp.parameters()[i]);
  }
  static const std::vector<h5ddp::OwnedPiece> kNone;
  auto* sharded = dynamic_cast<h5ddp::ShardedDataParallel*>(&ddp);
  for (const auto& piece : sharded ? sharded->owned_pieces() : kNone) {
    held.push_back(names[piece.index]);
    row_begin.push_back(piece.row_begin);
    mine.push_back(piece.tensor);
  }
  c10::List<torch::Tensor> before, after;
  if (comm.rank() == inf_rank && !mine.empty())
    mine.front().grad().view(-1)[0].fill_(std::numeric_limits<float>::infinity());
  for (const auto& t : mine) before.push_back(t.grad().clone());
  const double norm = ddp.clip_grad_norm(max_norm);
  for (const auto& t : mine) after.push_back(t.grad().clone());

  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("names", held);
  out.insert("row_begin", row_begin);
  out.insert("before", before);
  out.insert("after", after);
  out.insert("norm", norm);
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(out));
  std::ofstream f(prefix + ".rank" + std::to_string(comm.rank()) + ".pt", std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return f ? 0 : 1;
}
