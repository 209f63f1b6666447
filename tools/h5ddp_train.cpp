// h5ddp-train: parse options -> start MPI -> run_training(config) -> exit code (0 done, 75 requeue me,
// 130 interrupted, 1 error (agreed by all ranks: through MPI_Finalize; known to one rank: MPI_Abort),
// 2 bad options, 70 watchdog).
#include <cstdio>

#include "h5ddp/log.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/mpi_env.hpp"
#include "train/config.hpp"
#include "train/goodput.hpp"
#include "train/trainer.hpp"

int main(int argc, char** argv) {
  h5ddp::note_main_entry();  // the goodput account's process start where /proc/self/stat cannot say it
  // Every rank parses the same argv, so every rank reaches the same verdict without communicating.
  const h5ddp::ParsedArgs args = h5ddp::parse_train_args(argc, argv);
  if (!args.config) {
    // --help or bad options, before MPI starts: the job's first process prints and exits with the code, the
    // others exit 0 at once. mpirun ends a job at its first non-zero exit: had every rank exited 2, a quick one
    // could get rank 0 killed before it printed (seen on a busy machine). The job's exit code is rank 0's.
    if (!h5ddp::first_process_of_job()) return 0;
    std::fprintf(args.exit_code == 0 ? stdout : stderr, "%s\n", args.message.c_str());
    return args.exit_code;
  }
  h5ddp::log::init_from_env();
  h5ddp::MpiEnv env(&argc, &argv);
  try {
    auto comm = h5ddp::MpiComm::dup(MPI_COMM_WORLD);
    h5ddp::TrainConfig config = *args.config;
    config.local_rank = env.local_rank();
    config.local_size = env.local_size();
    return h5ddp::run_training(config, *comm).exit_code;
  } catch (const std::exception& e) {
    // An error every rank agreed on: one message, exit 1 through MPI_Finalize; otherwise MPI_Abort.
    return h5ddp::exit_code_for(e, "h5ddp-train");
  }
}
