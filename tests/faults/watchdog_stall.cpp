// Test program for tests/faults/watchdog_test.py: every rank runs guarded "steps" with an allreduce;
// at step --stall-step, rank --stall-rank sleeps for --stall-seconds instead of calling the collective.
// With a watchdog of --watchdog-seconds, the job must end by MPI_Abort with the watchdog's message.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/mpi_env.hpp"
#include "h5ddp/watchdog.hpp"

int main(int argc, char** argv) {
  double watchdog_seconds = 2, stall_seconds = 60;
  int stall_rank = -1, stall_step = 3, steps = 6;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const double v = std::atof(argv[i + 1]);
    if (k == "--watchdog-seconds")
      watchdog_seconds = v;
    else if (k == "--stall-seconds")
      stall_seconds = v;
    else if (k == "--stall-rank")
      stall_rank = static_cast<int>(v);
    else if (k == "--stall-step")
      stall_step = static_cast<int>(v);
    else if (k == "--steps")
      steps = static_cast<int>(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    h5ddp::MpiEnv env(&argc, &argv);
    auto comm = h5ddp::MpiComm::dup(MPI_COMM_WORLD);
    if (stall_rank < 0) stall_rank = comm->size() - 1;
    h5ddp::Watchdog wd(watchdog_seconds);
    for (int step = 0; step < steps; ++step) {
      auto step_guard = wd.guard("step " + std::to_string(step));
      if (step == stall_step && comm->rank() == stall_rank) {
        std::fprintf(stderr, "rank %d stalls at step %d for %.0f s\n", comm->rank(), step, stall_seconds);
        std::this_thread::sleep_for(std::chrono::duration<double>(stall_seconds));
      }
      int64_t flag = 1;
      auto g = wd.guard("allreduce of step flags at step " + std::to_string(step));
      comm->allreduce(&flag, 1, h5ddp::DType::kI64, h5ddp::ReduceOp::kSum);
    }
    if (comm->rank() == 0) std::printf("completed %d steps\n", steps);
    comm.reset();
  } catch (const std::exception& e) {
    h5ddp::die_with_exception(e);
  }
  return 0;
}
