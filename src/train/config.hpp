// The options of h5ddp-train as one plain struct, and their parsing (Boost.Program_options: command
// line plus an optional --config file). Torch-free, so tools and tests can build a config cheaply.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "h5ddp/checkpoint.hpp"
#include "train/data.hpp"

namespace h5ddp {

// The choices of h5ddp-train's word-valued options, parsed once at the command line (parse_train_args); the rest
// of the trainer compares enums. lr schedules stay strings: they are the format's /train/lr_scheduler types.
enum class OptimizerKind { kAdam, kAdamW, kSgd };
enum class ShardOption { kNone, kOptimizer, kGradients, kParameters };  // --shard: ZeRO stage 0-3
enum class ResumeMode { kAuto, kNone, kPath };                          // --resume auto | none | PATH
enum class ProgressMode { kAuto, kTty, kLines };
// The option's word for a value (for messages): "adamw", "gradients", "lines".
const char* option_word(OptimizerKind v);
const char* option_word(ShardOption v);
const char* option_word(ProgressMode v);

struct ModelSpec {
  std::string name = "cnn";                        // "cnn" | "mlp"
  double dropout = 0.25;                           // dropout probability in [0, 1)
  std::vector<int64_t> mlp_hidden = {1024, 1024};  // hidden widths of the MLP
  std::string file;                                // --model-file: a TorchScript module (replaces name)
};

struct TrainConfig {
  ModelSpec model;
  std::string data_dir = kDefaultFashionMnistDir;
  std::string data_file;  // --data: an HDF5 data set (docs/DATA.md) instead of Fashion-MNIST from data_dir
  int64_t context = 0;    // --context: a token stream's window length (0: the stream's attribute)
  int64_t epochs = 1;
  int64_t max_steps = 0;        // 0 = no limit: stop after `epochs` epochs
  int64_t batch_size = 120;     // GLOBAL batch over all ranks
  bool batch_size_set = false;  // given explicitly (a resume otherwise takes the checkpoint's)
  double lr = 2e-3;             // Adam at 2e-3 reaches 86.8% after one epoch of the default job (README)
  OptimizerKind optimizer = OptimizerKind::kAdam;
  double momentum = 0.9;  // sgd only
  double weight_decay = 0.0;
  std::string lr_schedule = "constant";  // constant | step | cosine
  int64_t lr_step_size = 0;              // step schedule: decay every N steps (0 = once per epoch)
  double lr_gamma = 0.1;                 // step schedule: factor
  uint64_t seed = 42;
  std::string run_dir = "runs/default";
  int64_t checkpoint_every_steps = 0;   // 0 = off
  bool checkpoint_auto = false;         // --checkpoint-every-steps auto: Young/Daly's interval (auto_interval.hpp)
  double mtbf_seconds = 0;              // --mtbf: mean time between failures (needed by auto, used by nothing else)
  double checkpoint_every_seconds = 0;  // 0 = off
  int keep_last = 3;
  int keep_every = 0;
  bool fsync = true;
  ShardOption shard = ShardOption::kNone;         // --shard (--shard-optimizer: kOptimizer)
  int64_t shard_unit_params = 0;                  // --shard-unit-params (0: a quarter of the model)
  bool shard_prefetch = true;                     // --shard-prefetch on | off (FsdpOptions::prefetch)
  bool verify_replicas = false;                   // every rank hashes every tensor on save and all hashes must agree
  WriteMode checkpoint_write = WriteMode::kAuto;  // --checkpoint-write auto | direct | mpiio
  LoadStrategy load_strategy = LoadStrategy::kEveryRankReads;  // --load-strategy
  std::vector<std::string> mpiio_hints;                        // key=value, repeatable (SaveOptions::mpiio_hints)
  uint64_t h5_alignment = uint64_t{1} << 20;                   // SaveOptions::alignment
  bool async_checkpoint = false;        // write checkpoints on a background thread (blocks only for a copy)
  bool continue_on_save_error = false;  // --on-save-error continue: a failed periodic save is reported and retried at
                                        // the next trigger (stop: it ends training; final saves always stop)
  // MPI_Abort (exit 70) with a message when a step or a save stalls: > 0 a step gets this many seconds and a
  // save 10 times as many; 0 off; kWatchdogAuto (the default) limits from measured step and save times.
  static constexpr double kWatchdogAuto = -1;
  double watchdog_seconds = kWatchdogAuto;
  ResumeMode resume = ResumeMode::kAuto;  // --resume auto | none | PATH (resume_path)
  std::string resume_path;                // --resume PATH
  std::string init_from;                  // weights-only initialisation from a checkpoint
  std::string device = "auto";            // auto | cpu | cuda (h5ddp/device.hpp)
  bool bf16 = false;                      // --precision bf16: autocast of forward and loss (fp32: off)
  int local_rank = 0, local_size = 1;     // this rank among the ranks of its node (set by main from MpiEnv)
  int threads = 1;                        // torch intra-op threads per rank
  int64_t step_sleep_ms = 0;              // sleep after every step (tests and demos)
  ProgressMode progress = ProgressMode::kAuto;
  int64_t log_every = 0;                  // progress line every N steps when stdout is not a TTY (0 = auto)
  bool evaluate = true;                   // evaluate on the test set at the end
  int64_t eval_every_steps = 0;           // also evaluate (distributed) every N steps during training (0 = off)
  bool eval_every_epoch = false;          // also evaluate at the end of every epoch
  bool keep_best = false;                 // keep the best-scoring checkpoint beside the newest --keep-last
  int64_t lr_warmup_steps = 0;            // linear warmup over the first N steps
  bool replan_lr_schedule = false;        // on resume: plan the schedule from this run's options, not the checkpoint's
  int64_t grad_accum = 1;                 // micro-batches per optimizer step (gradients accumulated under no_sync)
  double grad_clip = 0;                   // clip the global gradient norm to this (0: off)
  bool metrics = true;                    // append to RUN_DIR/metrics.jsonl (rank 0)
  bool final_checkpoint = true;           // save at the end of training
  std::vector<std::string> command_line;  // argv as given (for the "how to resume" hint)
};

// Result of parsing: either a config to run, or a message to print and an exit code (--help, errors).
struct ParsedArgs {
  std::optional<TrainConfig> config;
  std::string message;  // help text or error
  int exit_code = 0;
};

// Local (same on every rank: same argv). Parses argv and, with --config FILE, that file (command line wins).
// Validates values that need no I/O (batch size > 0, model name, optimizer, schedule, dropout range).
ParsedArgs parse_train_args(int argc, const char* const* argv);

// Local. Checks what needs the file system: the data directory and the run directory (creatable,
// writable). Throws ConfigError/DataError with a clear message. Call on every rank and agree on the
// outcome (Comm::raise_if_any) before any collective.
void validate_environment(const TrainConfig& config);

}  // namespace h5ddp
