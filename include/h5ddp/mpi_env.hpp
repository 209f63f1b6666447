// The MPI environment of one process: initialises MPI (asking for MPI_THREAD_MULTIPLE), learns rank,
// size, local rank (ranks sharing this node), node count and host name, and finalises on destruction.
// Works under mpirun and under Slurm's `srun --mpi=pmix`: everything comes from MPI, not from env vars.
#pragma once

#include <mpi.h>

#include <string>

namespace h5ddp {

class MpiEnv {
 public:
  // Collective over MPI_COMM_WORLD. Sets MPI_ERRORS_RETURN on MPI_COMM_WORLD so failures throw.
  // If MPI is already initialised (e.g. by a test harness), adopts it and does not finalise it.
  MpiEnv(int* argc, char*** argv);
  ~MpiEnv();
  MpiEnv(const MpiEnv&) = delete;
  MpiEnv& operator=(const MpiEnv&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int num_nodes() const { return num_nodes_; }
  const std::string& hostname() const { return hostname_; }
  // The thread level MPI granted (MPI_THREAD_MULTIPLE requested).
  int thread_level() const { return thread_level_; }
  bool threads_ok() const { return thread_level_ >= MPI_THREAD_MULTIPLE; }
  // Communicator of the ranks on this node (owned; freed before finalize).
  MPI_Comm node_comm() const { return node_comm_; }

  // With CUDA: selects device local_rank % device_count and returns it; -1 in CPU builds or without GPUs.
  int select_cuda_device() const;

  // Ends the whole job from any one rank (prints nothing; the caller has already said why).
  [[noreturn]] static void abort(int exit_code);

 private:
  bool owns_init_ = false;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, num_nodes_ = 1;
  int thread_level_ = MPI_THREAD_SINGLE;
  std::string hostname_;
  MPI_Comm node_comm_ = MPI_COMM_NULL;
};

// Maps an exception escaping a tool's run() to a message with host and rank, then MPI_Abort
// so that the job ends instead of hanging in a collective on the other ranks. Returns the exit code
// to use when MPI is not running.
[[noreturn]] void die_with_exception(const std::exception& e, int exit_code = 1);

// For a tool's main while MpiEnv is alive, on every rank that caught `e`. An h5ddp::Error every rank raised
// together (Error::agreed) is printed once, by rank 0 ("<program>: error: <message>"), and every rank returns
// `exit_code` after a barrier on MPI_COMM_WORLD, so the job ends through MPI_Finalize without Open MPI's
// MPI_ABORT report. Anything else may be known to this rank alone: die_with_exception (MPI_Abort).
int exit_code_for(const std::exception& e, const char* program, int exit_code = 1);

// For a tool's main before MPI starts, when every process reached the same verdict on its command line (bad
// options, --help): true on the one process that should print it (the job's rank 0 as the launcher's
// environment tells: Open MPI, PMIx, Slurm; every process when none says).
bool first_process_of_job();

}  // namespace h5ddp
