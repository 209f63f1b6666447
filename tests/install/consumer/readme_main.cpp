// Runs the README's own-loop snippet (README_SNIPPET, extracted by install_test.sh) as written: a user's model
// and data around it, and a main. Usage: readme_loop STEPS (in a scratch directory: it writes runs/mine).
#include <torch/torch.h>

#include <cstdio>
#include <h5ddp/mpi_comm.hpp>
#include <h5ddp/mpi_env.hpp>
#include <string>

struct Net : torch::nn::Module {
  torch::nn::Linear fc1{register_module("fc1", torch::nn::Linear(12, 32))};
  torch::nn::Linear fc2{register_module("fc2", torch::nn::Linear(32, 3))};
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::dropout(torch::relu(fc1(x)), 0.2, is_training())); }
};

#include README_SNIPPET

int main(int argc, char** argv) {
  h5ddp::MpiEnv env(&argc, &argv);
  auto comm = h5ddp::MpiComm::dup(MPI_COMM_WORLD);
  torch::manual_seed(0);
  const torch::Tensor x = torch::randn({2048, 12}), y = x.slice(1, 0, 3).argmax(1);
  auto model = std::make_shared<Net>();
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
  torch::manual_seed(1 + comm->rank());
  const int rc = train(*comm, model, optimizer, x, y, std::stoll(argv[1]));
  if (comm->rank() == 0) std::printf("readme_loop: exit %d\n", rc);
  return rc;
}
