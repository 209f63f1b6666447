// The training loop of h5ddp-train: sampler -> batch -> forward/backward (DDP) -> step -> triggers ->
// save; auto-resume, preemption signals, progress, evaluation.
#pragma once

#include <cstdint>
#include <string>

#include "h5ddp/mpi_comm.hpp"
#include "train/config.hpp"

namespace h5ddp {

struct TrainResult {
  int exit_code = 0;  // 0, stop_signal::kExitRequeue (75) or kExitInterrupted (130)
  int64_t step = 0;   // optimizer steps completed (global)
  int64_t epoch = 0;
  std::string resumed_from;     // checkpoint loaded at start, empty for a fresh run
  std::string last_checkpoint;  // newest checkpoint written by this run (empty if none)
  double test_accuracy = -1;    // in [0, 1]; -1 when not evaluated (or regression)
  double test_loss = -1;        // mean test loss; -1 when not evaluated
  double train_seconds = 0;
};

// Collective over `comm` (every rank with the same config; checkpoints go through MPI-IO over it).
// Validates the environment (all ranks agree before anything collective), resumes per config.resume,
// trains, saves, evaluates. Throws on errors; returns the exit code for signals. Installs the stop-signal
// handlers for its duration.
TrainResult run_training(const TrainConfig& config, MpiComm& comm);
}  // namespace h5ddp
