// Asynchronous checkpoints (issue 8): training is blocked only while the state is copied into reusable
// host buffers; the file is written by save_checkpoint on a background thread, over a communicator of
// its own, with the commit protocol unchanged (`latest` moves only once the file is durable).
//   AsyncCheckpointer async(comm);                    // collective: duplicates the communicator
//   async.start(state, run_dir, options);             // collective: waits for the previous save, copies, returns
//   ... every step: async.poll();                     // collective: a background failure throws on all ranks
//   async.wait();                                     // collective: final save done (end of run, signal)
// At most one save is in flight. While one is, the caller must not use HDF5 itself (the library is not
// thread-safe here): call wait() before loading or verifying. Needs MPI_THREAD_MULTIPLE; without it,
// start() saves synchronously on the calling thread (logged once).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "h5ddp/checkpoint.hpp"
#include "h5ddp/comm.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/train_state.hpp"

namespace h5ddp {

// Timing of the most recent start() on this rank.
struct AsyncSaveTiming {
  double blocked_seconds = 0;  // whole start(): what training lost to this checkpoint
  double wait_seconds = 0;     // part of it spent waiting for the previous save to finish
  double copy_seconds = 0;     // part of it spent copying tensors into the host buffers
  uint64_t bytes_copied = 0;
};

class AsyncCheckpointer {
 public:
  // Collective over `comm`: duplicates its MPI communicator for the background thread. `comm` must
  // outlive this object and is used (by the calling thread only) to agree on outcomes and, without
  // MPI_THREAD_MULTIPLE, to save synchronously.
  explicit AsyncCheckpointer(MpiComm& comm);
  // Waits for a save in flight (a committed checkpoint is never abandoned); logs its error, never throws.
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Collective. Waits for the previous save (throwing its failure on all ranks, before starting anything),
  // snapshots `state` (tensors into the reusable buffers, small fields by value) and starts writing it
  // with save_checkpoint(options) in the background. On return the caller may change the state's tensors.
  void start(const TrainState& state, const std::string& run_dir, const SaveOptions& options = {});

  // Collective (one allreduce of two flags). Cheap check at a step boundary: if the save in flight has
  // failed on any rank, waits for it everywhere and throws CheckpointError on all ranks.
  // Returns true while a save is still in flight on some rank.
  bool poll();

  // Collective. Waits for the save in flight, if any; throws its failure on all ranks. Returns the result
  // of the last completed save (path empty when none was started).
  SaveResult wait();

  // Local, but the same on every rank: true from start() until the wait() or poll() that found the save
  // finished on all ranks (so it may decide whether to call poll()).
  bool in_flight() const { return worker_.joinable(); }
  const AsyncSaveTiming& last_timing() const { return timing_; }
  // Number of times the host buffers were (re)allocated: stays at 1 while the state's layout is unchanged.
  int buffer_allocations() const;
  // Bytes of the host buffers (pinned host memory in CUDA builds).
  size_t buffer_bytes() const;

 private:
  struct Buffers;
  // Joins the worker (if any) and agrees on its outcome; throws on all ranks if it failed anywhere.
  void finish();
  // The phases of start(): the state's small fields by value and its tensors copied into buffers_ (the
  // snapshot's refs point there), then the worker thread that saves the snapshot.
  void take_snapshot(const TrainState& state, const std::string& run_dir, const SaveOptions& options);
  void copy_tensors();
  void launch_worker();

  MpiComm& comm_;
  std::unique_ptr<MpiComm> bg_comm_;  // used by the worker thread only
  std::unique_ptr<Buffers> buffers_;
  TrainState snapshot_;  // what the worker writes: tensors point into buffers_
  std::string run_dir_;
  SaveOptions options_;
  std::thread worker_;
  std::string worker_error_;       // set by the worker before it ends; read after join
  std::atomic<bool> done_{false};  // set by the worker as its last action
  SaveResult worker_result_, last_result_;
  bool threaded_ = true;
  AsyncSaveTiming timing_;
};

}  // namespace h5ddp
