// h5ddp-train: parse options -> start MPI -> run_training(config) -> exit code (0 done, 75 requeue me,
// 130 interrupted, 1 error on any rank via MPI_Abort, 2 bad options).
#include <cstdio>

#include "h5ddp/config.hpp"
#include "h5ddp/log.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/mpi_env.hpp"
#include "h5ddp/trainer.hpp"

int main(int argc, char** argv) {
  // Every rank parses the same argv, so every rank reaches the same verdict without communicating.
  const h5ddp::ParsedArgs args = h5ddp::parse_train_args(argc, argv);
  if (!args.config) {
    // --help or bad options: print once (on the first process of the job, as far as we can tell without
    // MPI) and leave before MPI starts.
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (!rank) rank = std::getenv("PMIX_RANK");
    if (!rank) rank = std::getenv("SLURM_PROCID");
    if (!rank || std::string(rank) == "0") std::fprintf(args.exit_code == 0 ? stdout : stderr, "%s\n", args.message.c_str());
    return args.exit_code;
  }
  h5ddp::log::init_from_env();
  h5ddp::MpiEnv env(&argc, &argv);
  int code = 0;
  try {
    auto comm = h5ddp::MpiComm::dup(MPI_COMM_WORLD);
    code = h5ddp::run_training(*args.config, *comm).exit_code;
  } catch (const std::exception& e) {
    h5ddp::die_with_exception(e);
  }
  return code;
}
