#include "train/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "h5ddp/checkpoint.hpp"
#include "h5ddp/error.hpp"
#include "train/auto_interval.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace h5ddp {
namespace {

std::vector<int64_t> parse_widths(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v <= 0)
      throw ConfigError("--mlp-hidden expects positive integers separated by commas (e.g. 4096,4096), got '" + s + "'");
    out.push_back(v);
  }
  if (out.empty()) throw ConfigError("--mlp-hidden needs at least one width");
  return out;
}

std::string join_widths(const std::vector<int64_t>& w) {
  std::string s;
  for (size_t i = 0; i < w.size(); ++i) s += (i ? "," : "") + std::to_string(w[i]);
  return s;
}

// A --config file's text with a bare option name ("no-eval", a flag as on the command line) read as
// "no-eval = true", which is what Boost's config-file syntax needs.
std::string flags_as_true(std::istream& in) {
  std::string out, line;
  while (std::getline(in, line)) {
    const size_t first = line.find_first_not_of(" \t");
    const bool bare =
        first != std::string::npos && line[first] != '#' && line[first] != '[' && line.find('=') == std::string::npos;
    out += line + (bare ? " = true\n" : "\n");
  }
  return out;
}

template <class T>
void require(bool ok, const std::string& option, const T& value, const std::string& expected) {
  std::ostringstream os;
  os << value;
  if (!ok) throw ConfigError("--" + option + " " + os.str() + ": " + expected);
}

// Options given as their negation or parsed further after reading; applied to the TrainConfig by apply_switches.
struct Switches {
  std::string mlp_hidden, config_file, watchdog = "auto", every_steps = "0", mtbf;
  bool no_fsync = false, no_eval = false, no_final = false, no_metrics = false, shard_optimizer = false;
  // Word-valued options, turned into TrainConfig's enums by apply_choices.
  std::string optimizer = "adam", shard = "none", checkpoint_write = "auto", load_strategy = "every-rank-reads",
              on_save_error = "stop", resume = "auto", precision = "fp32", progress = "auto", shard_prefetch = "on";
};

// One option's words and the values they stand for.
template <class E>
using Words = std::vector<std::pair<const char*, E>>;

const Words<OptimizerKind> kOptimizers = {
    {"adam", OptimizerKind::kAdam}, {"adamw", OptimizerKind::kAdamW}, {"sgd", OptimizerKind::kSgd}};
const Words<ShardOption> kShards = {{"none", ShardOption::kNone},
                                    {"optimizer", ShardOption::kOptimizer},
                                    {"gradients", ShardOption::kGradients},
                                    {"parameters", ShardOption::kParameters}};
const Words<ProgressMode> kProgressModes = {
    {"auto", ProgressMode::kAuto}, {"tty", ProgressMode::kTty}, {"lines", ProgressMode::kLines}};

// The value `word` stands for; ConfigError "--optimizer lamb: unknown optimizer (adam | adamw | sgd)" for another word.
template <class E>
E choice(const std::string& option, const std::string& word, const Words<E>& words) {
  std::string list;
  for (const auto& [w, v] : words) {
    if (word == w) return v;
    list += (list.empty() ? "" : " | ") + std::string(w);
  }
  std::string noun = option;
  std::replace(noun.begin(), noun.end(), '-', ' ');
  throw ConfigError("--" + option + " " + word + ": unknown " + noun + " (" + list + ")");
}

template <class E>
const char* word_of(E value, const Words<E>& words) {
  for (const auto& [w, v] : words)
    if (v == value) return w;
  return "?";
}

po::options_description general_options(TrainConfig& c, Switches& sw) {
  po::options_description general("General");
  general.add_options()("help,h", "print this help and exit")(
      "config", po::value(&sw.config_file),
      "read options from FILE (key = value lines, same names as the "
      "long options; a flag alone on its line, or flag = true); the command line wins")(
      "data-dir", po::value(&c.data_dir)->default_value(c.data_dir),
      "directory with the Fashion-MNIST "
      "*-ubyte.gz files")("data", po::value(&c.data_file),
                          "train on an HDF5 data set (/train/x, /train/y, /test/x, /test/y; "
                          "docs/DATA.md) instead of Fashion-MNIST; each rank reads only its rows")(
      "context", po::value(&c.context)->default_value(c.context),
      "a token stream's window length T (--data with /train/tokens): a sample is T tokens and their T next "
      "tokens; 0 = the stream's context attribute")("run-dir", po::value(&c.run_dir)->default_value(c.run_dir),
                                                    "directory for checkpoints (created if missing)")(
      "threads", po::value(&c.threads)->default_value(c.threads), "LibTorch intra-op threads per rank")(
      "device", po::value(&c.device)->default_value(c.device),
      "auto | cpu | cuda: cuda trains each rank on its own GPU (the one it sees, or the one at its local rank) "
      "with NCCL gradient allreduce; auto = cuda when the build and the node have it")(
      "precision", po::value(&sw.precision)->default_value(sw.precision),
      "fp32 | bf16: bf16 runs forward and loss under autocast (weights, gradients, optimizer state stay fp32)")(
      "seed", po::value(&c.seed)->default_value(c.seed),
      "seed of the data order, initial weights and dropout "
      "(rank r uses seed + r for dropout)");
  return general;
}

po::options_description model_options(TrainConfig& c, Switches& sw) {
  po::options_description model("Model");
  model.add_options()("model", po::value(&c.model.name)->default_value(c.model.name), "cnn | mlp (see docs/MODELS.md)")(
      "dropout", po::value(&c.model.dropout)->default_value(c.model.dropout, "0.25"), "dropout probability in [0, 1)")(
      "mlp-hidden", po::value(&sw.mlp_hidden)->default_value(sw.mlp_hidden),
      "hidden layer widths of --model mlp, "
      "comma separated")("model-file", po::value(&c.model.file),
                         "train a TorchScript module saved from Python (torch.jit.script(m).save(path)) "
                         "instead of --model; its forward takes one batch tensor");
  return model;
}

// --shard and the options that tune it (part of the training options).
void add_shard_options(po::options_description& train, TrainConfig& c, Switches& sw) {
  train.add_options()("shard", po::value(&sw.shard)->default_value(sw.shard),
                      "how much training state is split between ranks (docs/SHARDING.md): none | optimizer "
                      "(ZeRO-1: each rank keeps the optimizer state of its range of every gradient bucket, rows "
                      "of tensors, so a large matrix is split) | gradients (ZeRO-2: and only its range of the "
                      "averaged gradients) | parameters (ZeRO-3: and only its range of the weights, each unit (a "
                      "submodule, --shard-unit-params) gathered before its forward and again before its "
                      "backward; a --model-file's forward may be any TorchScript). Gradients are reduce-scattered, "
                      "parameters all-gathered. Checkpoints are the same file at every stage and resume at any "
                      "stage on any number of ranks");
  train.add_options()("shard-unit-params", po::value(&c.shard_unit_params)->default_value(c.shard_unit_params),
                      "--shard parameters with a --model-file: a submodule holding at most N parameter elements "
                      "becomes a unit gathered as one (larger ones are split into their children; a layer "
                      "without children is one unit whatever its size); 0 = a quarter of the model");
  train.add_options()("shard-prefetch", po::value(&sw.shard_prefetch)->default_value(sw.shard_prefetch),
                      "--shard parameters: on | off. On, the gather of the unit the first forward ran next starts "
                      "while the current unit computes (and in the backward, of the unit that ran before it), so "
                      "communication overlaps compute; up to two units and the root are then gathered at once "
                      "instead of one and the root");
  train.add_options()("shard-optimizer", po::bool_switch(&sw.shard_optimizer), "the same as --shard optimizer");
}

po::options_description training_options(TrainConfig& c, Switches& sw) {
  po::options_description train("Training");
  train.add_options()("epochs", po::value(&c.epochs)->default_value(c.epochs), "epochs to train")(
      "max-steps", po::value(&c.max_steps)->default_value(c.max_steps),
      "stop after this many optimizer steps "
      "in total (0 = no limit)")("batch-size", po::value(&c.batch_size)->default_value(c.batch_size),
                                 "GLOBAL batch size over all ranks; "
                                 "must be divisible by the rank count")(
      "lr", po::value(&c.lr)->default_value(c.lr, "0.002"), "learning rate")(
      "optimizer", po::value(&sw.optimizer)->default_value(sw.optimizer), "adam | adamw | sgd")(
      "momentum", po::value(&c.momentum)->default_value(c.momentum, "0.9"), "SGD momentum")(
      "weight-decay", po::value(&c.weight_decay)->default_value(c.weight_decay),
      "weight decay (L2 for adam/sgd, "
      "decoupled for adamw)")("lr-schedule", po::value(&c.lr_schedule)->default_value(c.lr_schedule),
                              "constant | step | cosine "
                              "(cosine anneals to 0 over the run)")(
      "lr-step-size", po::value(&c.lr_step_size)->default_value(c.lr_step_size),
      "step schedule: multiply the lr "
      "by --lr-gamma every N steps (0 = every epoch)")(
      "lr-gamma", po::value(&c.lr_gamma)->default_value(c.lr_gamma, "0.1"), "step schedule: decay factor")(
      "step-sleep-ms", po::value(&c.step_sleep_ms)->default_value(c.step_sleep_ms),
      "sleep after each step "
      "(throttle for tests and demos)")("progress", po::value(&sw.progress)->default_value(sw.progress),
                                        "rank 0's progress display: auto | tty "
                                        "(one line rewritten with \\r) | lines (auto: "
                                        "tty on a terminal, lines under mpirun, whose "
                                        "output is a pseudo-terminal even when piped)")(
      "log-every", po::value(&c.log_every)->default_value(c.log_every),
      "progress line every N steps in lines mode "
      "(0 = auto: about 20 lines a run)")("no-eval", po::bool_switch(&sw.no_eval),
                                          "skip the evaluation on the test set at the end");
  train.add_options()("eval-every-steps", po::value(&c.eval_every_steps)->default_value(c.eval_every_steps),
                      "also evaluate on the test set every N steps during training, each rank a share (0 = off)");
  train.add_options()("eval-every-epoch", po::bool_switch(&c.eval_every_epoch),
                      "also evaluate at the end of every epoch");
  train.add_options()("lr-warmup-steps", po::value(&c.lr_warmup_steps)->default_value(c.lr_warmup_steps),
                      "linear warmup: the lr of step s < N is scaled by (s + 1) / N");
  train.add_options()("replan-lr-schedule", po::bool_switch(&c.replan_lr_schedule),
                      "on resume, plan the lr schedule from this run's options (default: the checkpoint's "
                      "schedule and horizon continue, so raising --epochs does not change the planned lrs)");
  train.add_options()("grad-accum", po::value(&c.grad_accum)->default_value(c.grad_accum),
                      "micro-batches per optimizer step: each rank's share of the global batch is split in K, "
                      "gradients accumulate locally (DDP no_sync) and are reduced once");
  train.add_options()("grad-clip", po::value(&c.grad_clip)->default_value(c.grad_clip),
                      "clip the global L2 norm of the averaged gradients to NORM (as torch.nn.utils."
                      "clip_grad_norm_; sharded: the norm of all shards); a non-finite norm skips the step on "
                      "every rank. 0 = off. The norm goes to metrics.jsonl as grad_norm");
  add_shard_options(train, c, sw);
  train.add_options()("no-metrics", po::bool_switch(&sw.no_metrics),
                      "do not append to RUN_DIR/metrics.jsonl (docs/METRICS.md)");
  return train;
}

po::options_description checkpoint_options(TrainConfig& c, Switches& sw) {
  po::options_description ckpt("Checkpoints");
  ckpt.add_options()("checkpoint-every-steps", po::value(&sw.every_steps)->default_value(sw.every_steps),
                     "save every N optimizer steps (0 = off), or auto: every round(sqrt(2 x save cost x MTBF) / step "
                     "time) steps (Young/Daly), from the measured blocking time of the saves and the step time, "
                     "re-estimated after every save; needs --mtbf (docs/GOODPUT.md)")(
      "mtbf", po::value(&sw.mtbf),
      "mean time between failures (kills, preemptions) of the job, for --checkpoint-every-steps auto: seconds, or "
      "a number with a unit s, m, h or d (e.g. 6h)")(
      "checkpoint-every-seconds", po::value(&c.checkpoint_every_seconds)->default_value(c.checkpoint_every_seconds),
      "save every T seconds (each rank checks its clock; one allreduce per step makes all ranks save together; 0 = "
      "off)")("keep-last", po::value(&c.keep_last)->default_value(c.keep_last),
              "keep the newest K checkpoints (0 = all)")(
      "keep-every", po::value(&c.keep_every)->default_value(c.keep_every),
      "also keep every checkpoint whose step "
      "is a multiple of M (0 = off)")("async-checkpoint", po::bool_switch(&c.async_checkpoint),
                                      "write periodic checkpoints in the background "
                                      "(training blocks only for a copy to host memory)")(
      "on-save-error", po::value(&sw.on_save_error)->default_value(sw.on_save_error),
      "stop | continue: a failed periodic save (disk full, I/O error) ends training with an error, or is "
      "reported and retried at the next trigger; the final save and a signal's save always stop")(
      "watchdog-seconds", po::value(&sw.watchdog)->default_value(sw.watchdog),
      "abort the whole job (MPI_Abort, exit code 70) with a message naming host, rank and operation when a "
      "step's collectives or a save stall: T seconds for a step, 10x T for a save; auto = 20x the slowest step "
      "and 10x the slowest save so far, at least 300 s and 900 s; 0 = off")(
      "no-fsync", po::bool_switch(&sw.no_fsync), "do not fsync checkpoint files (faster, not crash-safe)")(
      "verify-replicas", po::bool_switch(&c.verify_replicas),
      "on every save, every rank hashes every tensor in "
      "full and the hashes must agree (default: a sampled comparison; each tensor hashed by the rank writing it)")(
      "checkpoint-write", po::value(&sw.checkpoint_write)->default_value(sw.checkpoint_write),
      "auto | direct | mpiio: how each rank writes its share of a checkpoint: with O_DIRECT, around the page "
      "cache (no page-cache pages to allocate: a background save takes less CPU from training), or through "
      "MPI-IO and the page cache; auto = direct (falls back to the page cache where the file system refuses "
      "O_DIRECT)")(
      "load-strategy", po::value(&sw.load_strategy)->default_value(sw.load_strategy),
      "every-rank-reads | share-exchange: how a resume reads the checkpoint: every rank reads every byte, or "
      "each rank reads 1/N and the ranks exchange shares over MPI (fewer file-system reads: for a parallel "
      "file system shared by many nodes); either way every rank verifies every byte it keeps")(
      "mpiio-hint", po::value(&c.mpiio_hints)->composing(),
      "key=value (repeatable): an MPI_Info hint for opening checkpoints, over h5ddp's own, e.g. striping_factor=16 "
      "striping_unit=4194304 cb_nodes=8 romio_cb_write=enable (docs/SCALING.md); recorded in /meta mpiio_hints")(
      "h5-alignment", po::value(&c.h5_alignment)->default_value(c.h5_alignment),
      "checkpoint datasets of at least B bytes start on a multiple of B (H5Pset_alignment): set the file "
      "system's stripe size; 0 = no alignment; recorded in /meta h5_alignment")(
      "no-final-checkpoint", po::bool_switch(&sw.no_final), "do not save when training ends")(
      "keep-best", po::bool_switch(&c.keep_best),
      "keep the checkpoint with the best test accuracy (needs --eval-every-steps or --eval-every-epoch; saved "
      "when an evaluation improves on it; RUN_DIR/best names it) beside the newest --keep-last")(
      "resume", po::value(&sw.resume)->default_value(sw.resume),
      "auto: newest valid checkpoint in --run-dir, "
      "fresh start if none | none | PATH of a checkpoint")(
      "init-from", po::value(&c.init_from),
      "start a fresh run from this checkpoint's weights (new optimizer, step 0); in a run dir that "
      "already holds checkpoints only to continue the run started from this file (else an error)");

  return ckpt;
}

// The model's and the training's options in range.
void validate_training(const TrainConfig& c) {
  require(c.model.name == "cnn" || c.model.name == "mlp", "model", c.model.name, "unknown model (cnn | mlp)");
  require(c.model.dropout >= 0 && c.model.dropout < 1, "dropout", c.model.dropout, "must be in [0, 1)");
  require(c.batch_size > 0, "batch-size", c.batch_size, "must be positive (global batch over all ranks)");
  require(c.epochs > 0, "epochs", c.epochs, "must be positive");
  require(c.max_steps >= 0, "max-steps", c.max_steps, "must be >= 0");
  require(c.lr > 0, "lr", c.lr, "must be positive");
  require(c.momentum >= 0, "momentum", c.momentum, "must be >= 0");
  require(c.weight_decay >= 0, "weight-decay", c.weight_decay, "must be >= 0");
  require(c.lr_schedule == "constant" || c.lr_schedule == "step" || c.lr_schedule == "cosine", "lr-schedule",
          c.lr_schedule, "unknown schedule (constant | step | cosine)");
  require(c.lr_step_size >= 0, "lr-step-size", c.lr_step_size, "must be >= 0");
  require(c.threads > 0, "threads", c.threads, "must be positive");
  require(c.device == "auto" || c.device == "cpu" || c.device == "cuda", "device", c.device,
          "must be auto, cpu or cuda");
}

// The word-valued options as TrainConfig's enums (an unknown word: ConfigError listing the choices).
void apply_choices(TrainConfig& c, const Switches& sw) {
  c.optimizer = choice("optimizer", sw.optimizer, kOptimizers);
  c.shard = choice("shard", sw.shard, kShards);
  require(!sw.shard_optimizer || c.shard == ShardOption::kNone || c.shard == ShardOption::kOptimizer, "shard", sw.shard,
          "conflicts with --shard-optimizer (which means --shard optimizer)");
  if (sw.shard_optimizer) c.shard = ShardOption::kOptimizer;
  c.shard_prefetch = choice("shard-prefetch", sw.shard_prefetch, Words<bool>{{"on", true}, {"off", false}});
  require(c.shard_unit_params >= 0, "shard-unit-params", c.shard_unit_params, "must be 0 (automatic) or positive");
  c.checkpoint_write = choice(
      "checkpoint-write", sw.checkpoint_write,
      Words<WriteMode>{{"auto", WriteMode::kAuto}, {"direct", WriteMode::kDirect}, {"mpiio", WriteMode::kMpiio}});
  c.load_strategy = choice("load-strategy", sw.load_strategy,
                           Words<LoadStrategy>{{"every-rank-reads", LoadStrategy::kEveryRankReads},
                                               {"share-exchange", LoadStrategy::kShareExchange}});
  c.continue_on_save_error =
      choice("on-save-error", sw.on_save_error, Words<bool>{{"stop", false}, {"continue", true}});
  c.bf16 = choice("precision", sw.precision, Words<bool>{{"fp32", false}, {"bf16", true}});
  c.progress = choice("progress", sw.progress, kProgressModes);
  require(!sw.resume.empty(), "resume", sw.resume, "must be auto, none or a checkpoint path");
  c.resume = sw.resume == "auto" ? ResumeMode::kAuto : sw.resume == "none" ? ResumeMode::kNone : ResumeMode::kPath;
  if (c.resume == ResumeMode::kPath) c.resume_path = sw.resume;
  require(c.init_from.empty() || c.resume != ResumeMode::kPath, "init-from", c.init_from,
          "starts a fresh run from these weights; --resume " + sw.resume +
              " continues another checkpoint: pass one of the two");
}

// --checkpoint-every-steps N | auto and --mtbf DURATION, which only auto uses and auto needs.
void apply_checkpoint_interval(TrainConfig& c, const Switches& sw) {
  c.checkpoint_auto = sw.every_steps == "auto";
  if (!c.checkpoint_auto) {
    size_t used = 0;
    try {
      c.checkpoint_every_steps = std::stoll(sw.every_steps, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    require(used > 0 && used == sw.every_steps.size() && c.checkpoint_every_steps >= 0, "checkpoint-every-steps",
            sw.every_steps, "must be a number of steps >= 0 (0 = off) or auto");
  }
  if (!sw.mtbf.empty() || c.checkpoint_auto) {
    require(!sw.mtbf.empty(), "checkpoint-every-steps", sw.every_steps,
            "needs --mtbf DURATION, the mean time between failures of the job (e.g. --mtbf 6h)");
    c.mtbf_seconds = parse_duration(sw.mtbf, "mtbf");
    require(c.checkpoint_auto, "mtbf", sw.mtbf, "is only used by --checkpoint-every-steps auto; add that option");
  }
}

// The checkpointing, schedule and run options in range, and the options that need each other.
void validate_run(TrainConfig& c, const Switches& sw) {
  apply_checkpoint_interval(c, sw);
  require(c.checkpoint_every_seconds >= 0, "checkpoint-every-seconds", c.checkpoint_every_seconds, "must be >= 0");
  require(c.keep_last >= 0, "keep-last", c.keep_last, "must be >= 0");
  require(c.keep_every >= 0, "keep-every", c.keep_every, "must be >= 0");
  for (const auto& h : c.mpiio_hints) {
    try {
      parse_mpiio_hint(h);
    } catch (const std::invalid_argument&) {
      require(false, "mpiio-hint", h, "must be key=value (e.g. striping_factor=16)");
    }
  }
  if (sw.watchdog != "auto") {
    size_t used = 0;
    try {
      c.watchdog_seconds = std::stod(sw.watchdog, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    require(used == sw.watchdog.size() && used > 0 && c.watchdog_seconds >= 0, "watchdog-seconds", sw.watchdog,
            "must be auto, 0 (off) or a number of seconds");
  }
  require(c.step_sleep_ms >= 0, "step-sleep-ms", c.step_sleep_ms, "must be >= 0");
  require(c.eval_every_steps >= 0, "eval-every-steps", c.eval_every_steps, "must be >= 0");
  require(!c.keep_best || c.eval_every_steps > 0 || c.eval_every_epoch, "keep-best", "",
          "needs --eval-every-steps N or --eval-every-epoch (the score it keeps the best of)");
  require(c.lr_warmup_steps >= 0, "lr-warmup-steps", c.lr_warmup_steps, "must be >= 0");
  require(c.grad_accum >= 1, "grad-accum", c.grad_accum, "must be >= 1");
  require(c.grad_clip >= 0 && std::isfinite(c.grad_clip), "grad-clip", c.grad_clip, "must be a number >= 0 (0: off)");
  require(c.context >= 0, "context", c.context, "must be >= 0 (0: the stream's context attribute)");
}

}  // namespace

const char* option_word(OptimizerKind v) {
  return word_of(v, kOptimizers);
}
const char* option_word(ShardOption v) {
  return word_of(v, kShards);
}
const char* option_word(ProgressMode v) {
  return word_of(v, kProgressModes);
}

ParsedArgs parse_train_args(int argc, const char* const* argv) {
  TrainConfig c;
  Switches sw;
  sw.mlp_hidden = join_widths(c.model.mlp_hidden);
  const char* intro =
      "h5ddp-train: data-parallel training of LibTorch models on MPI, with parallel-HDF5 checkpoints.\n"
      "Usage: mpirun -np N h5ddp-train [options]\n"
      "Exit codes: 0 done, 75 saved after SIGUSR1/SIGTERM (requeue me), 130 saved after SIGINT, 1 error,\n"
      "2 bad options, 70 a step or save stalled (watchdog, --watchdog-seconds).\n";
  po::options_description all;
  all.add(general_options(c, sw)).add(model_options(c, sw)).add(training_options(c, sw)).add(checkpoint_options(c, sw));

  ParsedArgs out;
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, all), vm);
    if (vm.count("help")) {
      std::ostringstream os;
      os << intro << all;
      out.message = os.str();
      out.exit_code = 0;
      return out;
    }
    if (vm.count("config")) {
      const std::string file = vm["config"].as<std::string>();
      std::ifstream in(file);
      if (!in) throw ConfigError("cannot read --config file " + file);
      std::istringstream text(flags_as_true(in));
      po::store(po::parse_config_file(text, all), vm);
    }
    po::notify(vm);
    c.batch_size_set = !vm["batch-size"].defaulted();
    c.command_line.assign(argv, argv + argc);
    c.model.mlp_hidden = parse_widths(sw.mlp_hidden);
    c.fsync = !sw.no_fsync;
    c.evaluate = !sw.no_eval;
    c.final_checkpoint = !sw.no_final;
    c.metrics = !sw.no_metrics;
    validate_training(c);
    apply_choices(c, sw);
    validate_run(c, sw);
    out.config = c;
  } catch (const po::error& e) {
    out.message = std::string("h5ddp-train: ") + e.what() + " (see --help)";
    out.exit_code = 2;
  } catch (const ConfigError& e) {
    out.message = std::string("h5ddp-train: ") + e.what();
    out.exit_code = 2;
  }
  return out;
}

void validate_environment(const TrainConfig& c) {
  if (c.data_file.empty())
    check_fashion_mnist_dir(c.data_dir);
  else if (!fs::is_regular_file(c.data_file))
    throw DataError("--data " + c.data_file + ": no such file");
  if (!c.model.file.empty() && !fs::is_regular_file(c.model.file))
    throw ConfigError("--model-file " + c.model.file + ": no such file");
  std::error_code ec;
  fs::create_directories(c.run_dir, ec);
  if (ec || !fs::is_directory(c.run_dir))
    throw ConfigError("cannot create run directory " + c.run_dir + ": " + (ec ? ec.message() : "not a directory"));
  // Probe by creating a file: it tests exactly what a save will do (permissions, read-only mounts, quotas).
  const std::string probe = c.run_dir + "/.h5ddp-write-probe-" + std::to_string(::getpid());
  std::ofstream f(probe);
  if (!f || !(f << "x") || !(f.flush())) throw ConfigError("run directory " + c.run_dir + " is not writable");
  f.close();
  fs::remove(probe, ec);
  if (c.resume == ResumeMode::kPath && !fs::exists(c.resume_path))
    throw ConfigError("--resume " + c.resume_path + ": no such checkpoint");
  if (!c.init_from.empty() && !fs::exists(c.init_from))
    throw ConfigError("--init-from " + c.init_from + ": no such checkpoint");
}

}  // namespace h5ddp
