// h5ddp-env: prints what each rank learned about its place in the job, one line per rank in rank order,
// so that launch-environment discovery (mpirun, `srun --mpi=pmix`, mpirun inside sbatch) can be checked
// by a script. The MPI fields come from MpiEnv (what h5ddp itself uses); the Slurm fields are printed
// next to them only for comparison ("-" when unset).
//
//   rank=0 size=2 local_rank=0 local_size=2 nodes=1 host=n1 slurm_procid=0 slurm_localid=0 ...
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/mpi_env.hpp"

namespace {

constexpr size_t kLineBytes = 512;

std::string env_or_dash(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : std::string("-");
}

std::string describe(const h5ddp::MpiEnv& env) {
  std::string line = "rank=" + std::to_string(env.rank()) + " size=" + std::to_string(env.size()) +
                     " local_rank=" + std::to_string(env.local_rank()) +
                     " local_size=" + std::to_string(env.local_size()) + " nodes=" + std::to_string(env.num_nodes()) +
                     " host=" + env.hostname();
  for (const char* name :
       {"SLURM_JOB_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_STEP_ID", "SLURM_RESTART_COUNT"}) {
    std::string key = name;
    for (auto& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    line += " " + key + "=" + env_or_dash(name);
  }
  return line;
}

// Collective: every rank's line, gathered and printed by rank 0 in rank order.
void run(const h5ddp::MpiEnv& env) {
  auto comm = h5ddp::MpiComm::dup(MPI_COMM_WORLD);
  std::string line = describe(env);
  std::vector<char> mine(kLineBytes, '\0');
  std::memcpy(mine.data(), line.data(), std::min(line.size(), kLineBytes - 1));
  std::vector<char> all(kLineBytes * static_cast<size_t>(comm->size()));
  comm->allgather(mine.data(), all.data(), kLineBytes, h5ddp::DType::kU8);
  if (comm->rank() == 0) {
    for (int r = 0; r < comm->size(); ++r) std::printf("%s\n", all.data() + kLineBytes * static_cast<size_t>(r));
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {  // takes no arguments: --help (or anything else) prints what it does
    const bool help = !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h");
    if (h5ddp::first_process_of_job())
      std::fprintf(help ? stdout : stderr,
                   "usage: [mpirun -np N | srun -n N --mpi=pmix] h5ddp-env\n"
                   "prints, one line per rank in rank order, what each rank learned about its place in the job\n"
                   "(rank, size, local rank, node count, host; SLURM_* variables beside them for comparison)\n");
    return help ? 0 : 2;
  }
  h5ddp::MpiEnv env(&argc, &argv);
  try {
    run(env);
  } catch (const std::exception& e) {
    h5ddp::die_with_exception(e);
  }
  return 0;
}
