#include "h5ddp/mpi_env.hpp"

#include <unistd.h>

#include <csignal>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <string>

#include "h5ddp/error.hpp"
#include "h5ddp/log.hpp"

#ifdef H5DDP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace h5ddp {

namespace {

// glibc's malloc returns freed memory at the top of the heap to the kernel once more than 128 KiB is free
// (M_TRIM_THRESHOLD), and serves blocks above its mmap threshold with a fresh mmap: a training step that
// allocates and frees the same activations every step (LibTorch's CPU allocator is malloc) takes every page
// back from the kernel, zero-filled, each step. The default CNN at 64 samples per rank took ~3,000 page
// faults and a quarter of its CPU time in the kernel per step; with the heap kept, its step took about half
// the time, the same for PyTorch given the same settings (docs/DEFAULTS.md, "The allocator"). The cost:
// up to kTrim of freed memory stays resident per process. Left alone when the user tuned malloc
// (MALLOC_*_ variables) or set H5DDP_MALLOC_TUNE=0.
void tune_malloc() {
#ifdef __GLIBC__
  const char* off = std::getenv("H5DDP_MALLOC_TUNE");
  if (off && std::string(off) == "0") return;
  for (const char* v : {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_ARENA_MAX"})
    if (std::getenv(v)) return;
  constexpr int kMmapThreshold = 32 << 20;  // glibc's largest (64-bit): bigger blocks are still mmapped
  constexpr int kTrim = 512 << 20;
  constexpr int kTopPad = 64 << 20;  // address space asked of the kernel per heap growth; untouched pages cost nothing
  mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
  mallopt(M_TRIM_THRESHOLD, kTrim);
  mallopt(M_TOP_PAD, kTopPad);
#endif
}

// A rank started by Open MPI's mpirun (or its orted on another node) dies with it. mpirun answers a second
// Ctrl-C by exiting at once, without waiting for its ranks: they lived on, orphaned, and could commit a
// checkpoint after the shell prompt was back, racing the next run (docs/TRAINING.md "Stopping"). The kernel sends
// SIGKILL to this process when the launcher exits; a half-written checkpoint is a `*.partial`, never read.
// Ranks under srun (slurmstepd) or started by hand are left alone. H5DDP_DIE_WITH_LAUNCHER=0 turns it off.
// Returns the launcher's name when armed, "" otherwise.
std::string die_with_launcher() {
#ifdef __linux__
  const char* off = std::getenv("H5DDP_DIE_WITH_LAUNCHER");
  if (off && std::string(off) == "0") return "";
  const pid_t parent = ::getppid();
  std::FILE* f = std::fopen(("/proc/" + std::to_string(parent) + "/comm").c_str(), "r");
  if (!f) return "";
  char comm[64] = {0};
  const bool read = std::fgets(comm, sizeof comm, f) != nullptr;
  std::fclose(f);
  const std::string name = read ? std::string(comm).substr(0, std::string(comm).find('\n')) : "";
  if (name != "mpirun" && name != "mpiexec" && name != "orterun" && name != "orted" && name != "prterun" &&
      name != "prted")
    return "";
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::raise(SIGKILL);  // the launcher ended before the request took hold
  return name + " (pid " + std::to_string(parent) + ")";
#else
  return "";
#endif
}

}  // namespace

MpiEnv::MpiEnv(int* argc, char*** argv) {
  tune_malloc();
  const std::string launcher = die_with_launcher();
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // Open MPI 4's openib BTL (verbs; UCX replaced it for InfiniBand) is opened by default even where no
    // device exists, and with it loaded every process computed more slowly: the default CNN's training step
    // took 94-99 ms against 77-80 ms with `--mca btl ^openib`, the same LibTorch kernels, alternating runs
    // on one machine (docs/DEFAULTS.md). Excluded unless the user chose the BTLs (OMPI_MCA_btl, which
    // `mpirun --mca btl ...` also sets) or sets H5DDP_KEEP_OPENIB=1.
    if (!std::getenv("OMPI_MCA_btl") && !std::getenv("H5DDP_KEEP_OPENIB")) setenv("OMPI_MCA_btl", "^openib", 0);
    int provided = MPI_THREAD_SINGLE;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
      std::fprintf(stderr, "h5ddp: MPI_Init_thread failed\n");
      std::exit(1);
    }
    owns_init_ = true;
    thread_level_ = provided;
  } else {
    MPI_Query_thread(&thread_level_);
  }
  H5DDP_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  H5DDP_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  H5DDP_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));

  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  H5DDP_CHECK_MPI(MPI_Get_processor_name(name, &len));
  hostname_.assign(name, len);
  detail::set_process_identity(hostname_, rank_, size_);
  log::detail::set_rank(rank_);
  log::init_from_env();

  H5DDP_CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_comm_));
  H5DDP_CHECK_MPI(MPI_Comm_set_errhandler(node_comm_, MPI_ERRORS_RETURN));
  H5DDP_CHECK_MPI(MPI_Comm_rank(node_comm_, &local_rank_));
  H5DDP_CHECK_MPI(MPI_Comm_size(node_comm_, &local_size_));
  int leader = local_rank_ == 0 ? 1 : 0;
  H5DDP_CHECK_MPI(MPI_Allreduce(&leader, &num_nodes_, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));

  if (!launcher.empty()) log::debug("started by " + launcher + ": dies with it (PR_SET_PDEATHSIG SIGKILL)");
  if (thread_level_ < MPI_THREAD_MULTIPLE && rank_ == 0)
    log::warn("MPI granted thread level " + std::to_string(thread_level_) +
              " (< MPI_THREAD_MULTIPLE): asynchronous work runs on the calling thread");
  else
    log::debug("MPI granted MPI_THREAD_MULTIPLE");
}

MpiEnv::~MpiEnv() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (node_comm_ != MPI_COMM_NULL) MPI_Comm_free(&node_comm_);
  if (owns_init_) MPI_Finalize();
}

int MpiEnv::select_cuda_device() const {
#ifdef H5DDP_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return -1;
  const int device = local_rank_ % count;
  H5DDP_CHECK_CUDA(cudaSetDevice(device));
  return device;
#else
  return -1;
#endif
}

void MpiEnv::abort(int exit_code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

void die_with_exception(const std::exception& e, int exit_code) {
  const auto* err = dynamic_cast<const Error*>(&e);
  // h5ddp::Error already starts with the process tag.
  std::string text = err ? std::string(e.what()) : process_tag() + " " + e.what();
  std::fprintf(stderr, "h5ddp: fatal: %s\n", text.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  MpiEnv::abort(exit_code);
}

}  // namespace h5ddp

namespace h5ddp {

int exit_code_for(const std::exception& e, const char* program, int exit_code) {
  const auto* err = dynamic_cast<const Error*>(&e);
  if (!err || !err->agreed()) die_with_exception(e, exit_code);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    std::fflush(stderr);
  }
  std::fflush(stdout);
  // Every rank leaves after rank 0 has written its message: a launcher that ends the job at the first
  // non-zero exit cannot cut rank 0 off before it spoke.
  if (MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS) MpiEnv::abort(exit_code);
  return exit_code;
}

bool first_process_of_job() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* v = std::getenv(var)) return std::string(v) == "0";
  return true;
}

}  // namespace h5ddp
