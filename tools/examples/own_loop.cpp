// Your own model, data and loop, trained data-parallel and checkpointed with h5ddp (README "Use h5ddp in
// your own training loop"). Killed or signalled, the same command resumes where it stopped, bit-exactly.
//   mpirun -np 2 h5ddp-example-own-loop [RUN_DIR [STEPS [SLEEP_MS_PER_STEP]]]
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <h5ddp/h5ddp.hpp>
#include <string>
#include <thread>

struct Net : torch::nn::Module {  // any torch::nn::Module
  torch::nn::Linear fc1{register_module("fc1", torch::nn::Linear(16, 64))};
  torch::nn::Linear fc2{register_module("fc2", torch::nn::Linear(64, 4))};
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::dropout(torch::relu(fc1(x)), 0.1, is_training())); }
};

int train(h5ddp::MpiComm& comm, int argc, char** argv) {
  const int64_t total_steps = argc > 2 ? std::stoll(argv[2]) : 300;
  torch::manual_seed(0);  // the same data and initial weights on every rank
  const torch::Tensor x = torch::randn({4096, 16}), y = x.slice(1, 0, 4).argmax(1);
  auto model = std::make_shared<Net>();
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  h5ddp::DistributedDataParallel ddp(comm, *model);
  torch::Tensor ema = torch::cat({model->fc2->weight.flatten(), model->fc2->bias}).detach().clone();
  double loss_mean = 0;
  h5ddp::CheckpointerOptions options;
  options.run_dir = argc > 1 ? argv[1] : "runs/own-loop";
  options.every_steps = 50;
  options.retention.keep_last = 2;
  h5ddp::Checkpointer ckpt(comm, *model, optimizer, options);
  ckpt.track("fc2_ema", ema);  // your own state goes into the same file: update it before step_end
  ckpt.data().seed = 7;        // the sampler's shuffle; the position is kept by the checkpoint
  ckpt.data().global_batch = 64;
  torch::manual_seed(100 + comm.rank());  // each rank's dropout stream (restored on resume)
  const h5ddp::ResumeInfo resumed = ckpt.resume();
  if (resumed.resumed && comm.rank() == 0)
    std::printf("resumed from %s at step %lld\n", resumed.path.c_str(), static_cast<long long>(ckpt.step()));

  h5ddp::DistributedSampler sampler(x.size(0), ckpt.data().global_batch, ckpt.data().seed, comm.size(), comm.rank());
  for (int64_t step = ckpt.step(); step < total_steps;) {
    h5ddp::DataState& data = ckpt.data();
    const torch::Tensor idx = torch::tensor(sampler.local_indices(data.epoch, data.position));
    ddp.prepare_forward();
    auto loss = torch::nn::functional::cross_entropy(model->forward(x.index_select(0, idx)), y.index_select(0, idx));
    loss.backward();
    ddp.finish_backward();
    optimizer.step();
    optimizer.zero_grad();
    sampler.advance(data);
    {
      torch::NoGradGuard no_grad;
      ema.mul_(0.99).add_(torch::cat({model->fc2->weight.flatten(), model->fc2->bias}), 0.01);
    }
    const h5ddp::StepOutcome outcome = ckpt.step_end(++step, loss.item<double>());
    loss_mean = outcome.value_mean;              // the loss averaged over ranks
    if (outcome.stop) return outcome.exit_code;  // a signal: saved; 75 asks the scheduler to requeue
    if (argc > 3) std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(argv[3])));
  }
  const h5ddp::SaveResult last = ckpt.finish();
  if (comm.rank() == 0)
    std::printf("trained to step %lld, loss %.4f; checkpoint %s\n", static_cast<long long>(ckpt.step()), loss_mean,
                last.path.c_str());
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && argv[1][0] == '-') {  // --help, or an option this example does not take: not a run dir name
    const bool help = std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h";
    if (h5ddp::first_process_of_job())
      std::fprintf(help ? stdout : stderr, "usage: %s [RUN_DIR [STEPS [SLEEP_MS]]]\n", argv[0]);
    return help ? 0 : 2;
  }
  h5ddp::MpiEnv env(&argc, &argv);
  try {
    return train(*h5ddp::MpiComm::dup(MPI_COMM_WORLD), argc, argv);
  } catch (const std::exception& e) {
    return h5ddp::exit_code_for(e, "own-loop");  // an error all ranks raised: one message, exit 1
  }
}
