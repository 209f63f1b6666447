// Checkpointer: what a LibTorch training loop needs to checkpoint correctly under DDP, in one object.
//
//   h5ddp::CheckpointerOptions options;
//   options.run_dir = "run";
//   options.every_steps = 100;
//   h5ddp::Checkpointer ckpt(*comm, *model, optimizer, options);
//   ckpt.resume();                                   // newest checkpoint that loads, or a fresh start
//   for (int64_t step = ckpt.step(); step < total;) {
//     ... forward, backward, ddp.finish_backward(), optimizer.step(), sampler.advance(ckpt.data()) ...
//     if (ckpt.step_end(++step).stop) return ckpt.exit_code();   // a signal: saved; 75 = requeue me
//   }
//   ckpt.finish();                                   // final save, background save committed
//
// State the loop tracks (track()) must be updated before step_end(): the save it may do takes the values
// as they are. tools/examples/own_loop.cpp is a complete program.
//
// It saves the model's parameters and buffers, the optimizer's state (type deduced from the object),
// every rank's random generators, the step counters, the data position and any tensor or scalar the
// caller tracks, into one HDF5 file written by all ranks (save_checkpoint), and restores all of it on
// any number of ranks. Every call documented "collective" must be made by all ranks of `comm`.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "h5ddp/checkpoint.hpp"
#include "h5ddp/comm.hpp"
#include "h5ddp/policy.hpp"
#include "h5ddp/train_state.hpp"

namespace h5ddp {

class ShardedOptimizer;  // h5ddp/sharded_optimizer.hpp

struct CheckpointerOptions {
  std::string run_dir = "run";  // ckpt-<step>.h5 files and `latest`; created when missing
  int64_t every_steps = 0;      // save when step % every_steps == 0 (0: off)
  double every_seconds = 0;     // save when this long has passed since the last save on any rank (0: off)
  // What each save keeps of run_dir (SaveOptions::retention, h5ddp/policy.hpp): the 3 newest files (keep_last; 0:
  // all), as h5ddp-train and h5ddp_torch; also every keep_every-th step, the keep_best files with the best
  // /meta[best_metric] (a meta string, set_meta, holding a number, e.g. "eval_accuracy"), keep_files (which
  // set_keep_files replaces).
  KeepPolicy retention = KeepPolicy::last(3);
  bool async = false;                       // training blocks only while the state is copied into host buffers
  bool fsync = true;                        // durable before `latest` moves (tests may turn it off)
  bool verify_replicas = false;             // every rank hashes every replicated tensor (SaveOptions::verify_replicas)
  WriteMode write_mode = WriteMode::kAuto;  // how tensor bytes reach the file (SaveOptions::write_mode)
  MpiioHints mpiio_hints;                   // SaveOptions::mpiio_hints (loads: set load.mpiio_hints too)
  uint64_t alignment = uint64_t{1} << 20;   // SaveOptions::alignment
  bool handle_signals = true;               // SIGUSR1/SIGTERM -> save, exit 75; SIGINT -> save, exit 130
  // A failed periodic save is reported on rank 0 and retried at the next trigger (the previous checkpoint
  // and `latest` stay as they were); false: it throws. Final and signal saves always throw.
  bool continue_on_save_error = false;
  // Whole parameters split between ranks by the caller: each rank's optimizer holds some of the model's parameters
  // (e.g. the owners assign_shards picks, bucketing.hpp), each parameter on one rank (set by the ShardedOptimizer
  // constructor too, whose pieces are row ranges). Each rank saves the state it holds into the same file a
  // replicated run writes, and a resume on any number of ranks, split or not, loads into each rank exactly the
  // state of the parameters its optimizer holds.
  bool shard_optimizer = false;
  LoadOptions load;
};

// What resume() found.
struct ResumeInfo {
  bool resumed = false;                     // false: a fresh start (nothing in run_dir loaded)
  std::string path;                         // the file loaded
  int64_t step = 0;                         // counters().step after the load
  int saved_world_size = 0;                 // ranks at save
  bool rng_exact = true;                    // every rank got the stream it had at save (false: more ranks than at save)
  std::map<std::string, std::string> meta;  // the file's meta strings
  SchedulerState scheduler;                 // the learning-rate schedule recorded in the file (type "none": none)
};

// The most recent save of this process (rank-local timings).
struct SaveStats {
  int64_t step = -1;
  bool async = false;
  double blocked_seconds = 0;  // what the training loop waited for (async: the copy to host buffers)
  double seconds = 0;          // the whole save (sync); for async, the previous background save's write
  uint64_t bytes = 0;          // tensor bytes of the file (all ranks)
  std::string path;            // sync: the committed file; async: the file being written
};

// What step_end() decided, the same on every rank.
struct StepOutcome {
  bool saved = false;     // a checkpoint was saved at this step (started, with async)
  bool stop = false;      // a stop signal reached some rank: the state is saved, leave the loop
  int exit_code = 0;      // with stop: 75 (SIGUSR1/SIGTERM, requeue me) or 130 (SIGINT)
  double value_mean = 0;  // mean over ranks of step_end's `value` (e.g. the loss), reduced with the decision
  bool save_due = false;  // agree_step(): step, time or signal trigger fired
};

class Checkpointer {
 public:
  // Collective (with async: duplicates the communicator). The model, optimizer and comm must outlive
  // the Checkpointer; every optimizer parameter must be a parameter of the model. Throws ConfigError for
  // an optimizer other than Adam, AdamW or SGD. `comm` is the MpiComm the files are written and read over
  // with MPI-IO (h5ddp/mpi_comm.hpp; e.g. MpiComm::dup(MPI_COMM_WORLD)).
  Checkpointer(MpiComm& comm, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
               CheckpointerOptions options = {});
  // Collective. ZeRO-1/2/3: the optimizer of a ShardedOptimizer (options.shard_optimizer is set from it); the
  // state of parameters split between ranks is saved and loaded as row pieces of the one file's datasets.
  Checkpointer(MpiComm& comm, torch::nn::Module& model, ShardedOptimizer& optimizer, CheckpointerOptions options = {});
  // Waits for a background save (a committed checkpoint is never abandoned); never throws.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Local, before resume(): the caller's own state, saved as /user/<name> and restored in place. The
  // tensor (its storage, updated in place) or the variable must outlive the Checkpointer; every rank
  // registers the same names, shapes and dtypes; the values must be equal on all ranks.
  void track(const std::string& name, torch::Tensor tensor);
  void track(const std::string& name, int64_t* value);
  void track(const std::string& name, double* value);
  // Local: a string stored in the file's /meta group (model description, hyperparameters).
  void set_meta(const std::string& key, const std::string& value);
  // Local: the files of run_dir that retention must keep (e.g. the best-scoring checkpoint), from the next
  // save on; replaces the previous list (at first, options.retention.keep_files).
  void set_keep_files(std::vector<std::string> file_names);
  // Local: the learning-rate schedule's state recorded with each save (called with the step).
  void set_scheduler_state(std::function<SchedulerState(int64_t step)> fn);

  // Progress the checkpoint carries. data(): the loop sets seed and global_batch before resume() and
  // advances the position (DistributedSampler::advance); resume() overwrites it with the file's.
  const Counters& counters() const { return counters_; }
  int64_t step() const { return counters_.step; }
  DataState& data() { return data_; }

  // Collective. Loads the newest ckpt-<step>.h5 of run_dir that loads in full (verified as it is read; a
  // damaged one is skipped with a warning on rank 0, the next one down tried). Restores model, optimizer,
  // every rank's generators, counters and data position. A failed candidate leaves nothing half-loaded: the
  // model, optimizer and generators are as before the call unless the returned info says resumed.
  // A file of another model, optimizer or tracked state throws CheckpointMismatchError/DisagreementError
  // on every rank, listing every difference.
  ResumeInfo resume();
  // Collective. The same from one given file; any problem throws on every rank (state as before the call).
  ResumeInfo resume_from(const std::string& path);
  // Collective. Only the model's weights of `path` (a fine-tune start); optimizer, counters and generators
  // are untouched. Its model must match exactly.
  void load_weights(const std::string& path);

  // Collective, once per optimizer step, after the step and the data advance: records `step`, agrees
  // (one allreduce carrying `value`) on stop signals and time triggers, saves when a trigger fires.
  StepOutcome step_end(int64_t step, double value = 0);
  // The two halves of step_end, for a caller that times or guards the save separately.
  StepOutcome agree_step(int64_t step, double value = 0);
  void save_if_due(StepOutcome& outcome);

  // Collective. Saves now (with async: starts the save). Returns the committed result (async: the previous one).
  SaveResult save();
  // Collective. End of training: waits for a background save (with continue_on_save_error a failure is
  // reported), then, with final_save, saves the current step unless it is saved already. Returns the last
  // committed checkpoint.
  SaveResult finish(bool final_save = true);
  // Collective. Waits for a background save in flight (no-op without async).
  SaveResult wait();

  int exit_code() const { return exit_code_; }
  const std::string& last_checkpoint() const { return last_path_; }
  int64_t last_saved_step() const { return last_saved_step_; }
  const SaveStats& last_save() const { return stats_; }
  const CheckpointerOptions& options() const { return options_; }
  // "adam", "adamw" or "sgd", from the optimizer's class.
  const std::string& optimizer_type() const;

 private:
  struct Impl;
  Checkpointer(MpiComm& comm, torch::nn::Module& model, torch::optim::Optimizer& optimizer, CheckpointerOptions options,
               const ShardedOptimizer* sharded);
  ResumeInfo load_resumed(const std::string& path);
  TrainState export_state();
  void save_guarded(bool final_save);

  MpiComm& comm_;
  CheckpointerOptions options_;
  std::unique_ptr<Impl> impl_;
  Counters counters_;
  DataState data_;
  int exit_code_ = 0;
  int64_t last_saved_step_ = -1;
  std::string last_path_;
  SaveStats stats_;
};

// Local. "adam", "adamw" or "sgd" for those LibTorch classes; throws ConfigError for any other.
std::string optimizer_type_of(const torch::optim::Optimizer& optimizer);

}  // namespace h5ddp
