#include "train/trainer.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "checkpoint/format.hpp"
#include "core/log.hpp"
#include "core/watchdog.hpp"
#include "h5/h5.hpp"
#include "h5ddp/checkpoint.hpp"
#include "h5ddp/checkpointer.hpp"
#include "h5ddp/ddp.hpp"
#include "h5ddp/device.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/nccl_comm.hpp"  // declares NcclComm in CUDA builds only
#include "h5ddp/sampler.hpp"
#include "h5ddp/stop_signal.hpp"
#include "torch/torch_state.hpp"
#include "train/batch.hpp"
#include "train/data.hpp"
#include "train/dataset.hpp"
#include "train/lr_schedule.hpp"
#include "train/metrics.hpp"
#include "train/models.hpp"

namespace h5ddp {
namespace {

using Clock = std::chrono::steady_clock;

// /meta key of a run started with --init-from: the file its weights came from (docs/METRICS.md).
constexpr const char* kInitFromMeta = "init_from";

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainConfig& c, const std::vector<torch::Tensor>& p) {
  if (c.optimizer == "sgd")
    return std::make_unique<torch::optim::SGD>(
        p, torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay));
  if (c.optimizer == "adamw")
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& g : opt.param_groups()) g.options().set_lr(lr);
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%02ld:%02ld", t / 60, t % 60);
  return buf;
}

std::string shell_join(const std::vector<std::string>& args) {
  std::string out;
  for (const auto& a : args) {
    const bool plain = !a.empty() && a.find_first_of(" \t\n'\"\\$`;&|<>()*?[]{}~!#") == std::string::npos;
    out += (out.empty() ? "" : " ") + (plain ? a : "'" + a + "'");
  }
  return out;
}

// `args` less each option in `names` with its value ("--name V" or "--name=V").
std::vector<std::string> without_options(const std::vector<std::string>& args, const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    bool drop = false;
    for (const auto& n : names) {
      if (args[i] == n) {
        drop = true;
        ++i;  // its value
      } else if (args[i].rfind(n + "=", 0) == 0) {
        drop = true;
      }
      if (drop) break;
    }
    if (!drop) out.push_back(args[i]);
  }
  return out;
}

// Local. The strings of a checkpoint's /meta group; empty when the file cannot be read.
std::map<std::string, std::string> read_checkpoint_meta(const std::string& path) {
  std::map<std::string, std::string> meta;
  h5::SilenceErrors quiet;
  const hid_t raw = H5Fopen(path.c_str(), H5F_ACC_RDONLY, h5::serial_file_access());
  if (raw < 0) return meta;
  try {
    h5::Handle file = h5::file(raw);
    if (!h5::exists(file, format::kMetaGroup)) return meta;
    h5::Handle group = h5::group(H5Gopen2(file, format::kMetaGroup, H5P_DEFAULT));
    for (const auto& name : h5::attr_names(group)) meta[name] = h5::read_attr_string(group, name);
  } catch (const Error&) {
    meta.clear();
  }
  return meta;
}

struct EvalResult {
  double accuracy = -1;  // fraction of the test set classified correctly (-1: regression, no accuracy)
  double loss = 0;       // mean cross-entropy (regression: mean squared error)
};

// Collective. Each rank scores a contiguous share of the test set; one allreduce sums the shares.
EvalResult evaluate(const TrainModel& model, const Dataset& test, Comm& comm, const Compute& compute) {
  model.module->eval();
  const int64_t n = test.size(), r = comm.rank(), w = comm.size();
  const ScoreSums s = score_rows(model.forward, test, n * r / w, n * (r + 1) / w, 1000, compute);
  double sums[2] = {s.correct, s.loss};
  comm.allreduce(sums, 2, DType::kF64, ReduceOp::kSum);
  model.module->train();
  return EvalResult{test.spec().classification ? sums[0] / static_cast<double>(n) : -1,
                    sums[1] / static_cast<double>(n)};
}

// Rank 0's progress display: '\r'-updated line on a terminal, a line every `every` steps otherwise.
class Progress {
 public:
  Progress(bool enabled, const std::string& mode, int64_t total_steps, int64_t log_every)
      : enabled_(enabled),
        tty_(enabled && use_tty(mode)),
        total_(total_steps),
        every_(log_every > 0 ? log_every : std::max<int64_t>(1, total_steps / 20)) {}

  // Open MPI hands its ranks a pseudo-terminal even when mpirun's own output is a pipe or a file, so
  // under mpirun "auto" means lines; --progress tty (e.g. from a launch script that saw a terminal) forces it.
  static bool use_tty(const std::string& mode) {
    if (mode != "auto") return mode == "tty";
    return ::isatty(STDOUT_FILENO) && !std::getenv("OMPI_COMM_WORLD_SIZE");
  }

  void start(int64_t step) {
    start_step_ = step;
    start_ = last_print_ = Clock::now();
  }

  void update(int64_t step, int64_t epoch, int64_t epochs, double loss, int64_t global_batch, bool last) {
    if (!enabled_) return;
    loss_sum_ += loss;
    ++loss_n_;
    const bool due = tty_ ? (seconds_since(last_print_) > 0.25 || last) : (step % every_ == 0 || last);
    if (!due) return;
    const double el = seconds_since(start_);
    const double sps = el > 0 ? static_cast<double>(step - start_step_) / el : 0;
    const double eta = sps > 0 ? static_cast<double>(total_ - step) / sps : NAN;
    std::printf("%sstep %lld/%lld  epoch %lld/%lld  loss %.4f  %.0f samples/s  elapsed %s  ETA %s%s", tty_ ? "\r" : "",
                static_cast<long long>(step), static_cast<long long>(total_),
                static_cast<long long>(std::min(epoch + 1, epochs)), static_cast<long long>(epochs),
                loss_sum_ / std::max<int64_t>(loss_n_, 1), sps * static_cast<double>(global_batch),
                format_duration(el).c_str(), format_duration(eta).c_str(), tty_ ? "   " : "\n");
    if (tty_ && last) std::printf("\n");
    std::fflush(stdout);
    loss_sum_ = 0;
    loss_n_ = 0;
    last_print_ = Clock::now();
  }

  void end_line() {
    if (tty_) {
      std::printf("\n");
      std::fflush(stdout);
    }
  }

 private:
  bool enabled_, tty_;
  int64_t total_, every_;
  int64_t start_step_ = 0;
  Clock::time_point start_, last_print_;
  double loss_sum_ = 0;
  int64_t loss_n_ = 0;
};

struct SignalScope {  // from the first line: a signal during the data load is not lost
  SignalScope() { stop_signal::install(); }
  ~SignalScope() { stop_signal::uninstall(); }
};

// --watchdog-seconds: a stalled step or save aborts the job with a message instead of hanging it. auto (the
// default): 20x the slowest step and 10x the slowest save this process has seen, with generous floors
// (tests: H5DDP_WATCHDOG_FLOOR_SECONDS sets the step floor, and the save floor to 3x it; a test-only hook,
// armed only with H5DDP_TEST_HOOKS=1, so a stray variable cannot abort a real run).
class StallWatch {
 public:
  enum class Kind { kStep, kSave };

  explicit StallWatch(double configured)
      : auto_(configured < 0),
        configured_(configured),
        step_floor_(floor_from_env()),
        step_limit_(step_floor_, 20),
        save_limit_(env_floor_ ? 3 * step_floor_ : kAutoWatchdogSaveFloor, 10),
        watchdog_(auto_ ? step_floor_ : configured) {}

  Watchdog::Guard watch(const std::string& what, Kind kind, int64_t step) {
    if (!watchdog_.enabled()) return Watchdog::Guard();
    const double limit = auto_ ? (kind == Kind::kStep ? step_limit_ : save_limit_).seconds()
                               : (kind == Kind::kStep ? 1 : 10) * configured_;
    return watchdog_.guard(what + " at step " + std::to_string(step + 1), limit);
  }
  void observe(Kind kind, double seconds) { (kind == Kind::kStep ? step_limit_ : save_limit_).observe(seconds); }

 private:
  double floor_from_env() {
    const char* hooks = std::getenv("H5DDP_TEST_HOOKS");
    const char* env = hooks && std::string(hooks) == "1" ? std::getenv("H5DDP_WATCHDOG_FLOOR_SECONDS") : nullptr;
    env_floor_ = env != nullptr;
    return env ? std::max(0.1, std::atof(env)) : kAutoWatchdogStepFloor;
  }

  bool auto_;
  double configured_;
  bool env_floor_ = false;
  double step_floor_;
  AutoLimit step_limit_, save_limit_;
  Watchdog watchdog_;
};

CheckpointerOptions checkpointer_options(const TrainConfig& c) {
  CheckpointerOptions o;
  o.run_dir = c.run_dir;
  o.every_steps = c.checkpoint_every_steps;
  o.every_seconds = c.checkpoint_every_seconds;
  o.keep_last = c.keep_last;
  o.keep_every = c.keep_every;
  o.async = c.async_checkpoint;
  o.fsync = c.fsync;
  o.verify_replicas = c.verify_replicas;
  o.shard_optimizer = c.shard_optimizer;
  o.load.strategy = c.load_strategy == "share-exchange" ? LoadStrategy::kShareExchange : LoadStrategy::kEveryRankReads;
  o.continue_on_save_error = c.on_save_error == "continue";
  return o;
}

// h5ddp-train's loop, one concern per function: options, data, model, resume, schedule, steps, end of run.
// The checkpointing (triggers, signals, saves, resume) is the Checkpointer's, as in a user's own loop.
class Trainer {
 public:
  Trainer(const TrainConfig& config, Comm& comm)
      : config_(config),
        comm_(comm),
        root_(comm.rank() == 0),
        watch_(config.watchdog_seconds),
        metrics_(config.run_dir, comm.rank() == 0 && config.metrics) {}

  TrainResult run() {
    try {
      validate_options();
      torch::set_num_threads(config_.threads);
      load_data();
      build_model();
      resume_or_init();
      plan();
      train();
      if (ckpt_->exit_code() != 0) return stopped();
      finish();
    } catch (const std::exception& e) {
      if (ckpt_) metrics_.write(JsonRecord("error").add("step", ckpt_->step()).add("message", e.what()));
      throw;
    }
    return result_;
  }

 private:
  bool evaluates() const { return config_.evaluate || config_.eval_every_steps > 0 || config_.eval_every_epoch; }

  // Collective. Every rank checks what needs no I/O and the ranks agree before anything else happens.
  void validate_options() {
    agreed(comm_, [&] {
      // The global batch the run will use: the checkpoint's, unless --batch-size is given (or nothing resumes).
      if (config_.batch_size_set || config_.resume == "none") check_global_batch(config_.batch_size, comm_.size());
      validate_environment(config_);
    });
  }

  // Collective. Fashion-MNIST: every rank holds the whole (small) set. --data FILE.h5: each rank opens the file
  // and later reads only the rows of its own batches (and its share of the test set). The sampler picks the rows.
  void load_data() {
    agreed(comm_, [&] {
      if (!config_.data_file.empty()) {
        train_set_ = open_h5_dataset(config_.data_file, "train");
        if (evaluates()) {
          if (!h5_dataset_has_split(config_.data_file, "test"))
            throw DataError("--data " + config_.data_file + " /test: missing; evaluation needs it (or pass --no-eval)");
          test_set_ = open_h5_dataset(config_.data_file, "test");
        }
      } else {
        train_set_ = images_dataset(read_fashion_mnist(config_.data_dir, "train"), "fashion-mnist train");
        if (evaluates()) test_set_ = images_dataset(read_fashion_mnist(config_.data_dir, "t10k"), "fashion-mnist t10k");
      }
      if (test_set_ && test_set_->spec().shape != train_set_->spec().shape)
        throw DataError("--data " + config_.data_file + ": /test samples are " + test_set_->spec().shape_text() +
                        " but /train samples are " + train_set_->spec().shape_text());
    });
    if (root_ && !config_.data_file.empty()) log::root_info("data: " + train_set_->describe());
  }

  // Collective. Same initial weights everywhere (DDP broadcasts rank 0's anyway), then per-rank dropout streams.
  void build_model() {
    torch::manual_seed(config_.seed);
    model_ = agreed(comm_, [&] { return build_train_model(config_.model); });
    select_device();
    check_data_fits_model();
    DdpOptions ddp_options;
    ddp_options.device_comm = device_comm_.get();
    ddp_options.reduce_bf16 = compute_.bf16 && compute_.device.is_cuda();  // NCCL sums bf16; MPI cannot
    ddp_options.shard_optimizer = config_.shard_optimizer;
    ddp_ = std::make_unique<DistributedDataParallel>(model_.module, comm_, ddp_options);
    // After the move to the device (state there); sharded: over this rank's parameters only.
    optimizer_ =
        make_optimizer(config_, config_.shard_optimizer ? ddp_->owned_parameters() : model_.module->parameters());
    ckpt_ = std::make_unique<Checkpointer>(comm_, *model_.module, *optimizer_, checkpointer_options(config_));
    seed_rank_rng(config_.seed, comm_.rank());
    if (root_) log::root_info("model: " + model_.description);
    for (const auto& [key, value] : model_.meta) ckpt_->set_meta(key, value);
    ckpt_->data().seed = config_.seed;
    ckpt_->data().global_batch = config_.batch_size;
  }

  // Collective. --device: every rank the same kind of device (h5ddp/device.hpp's rule), no two ranks of a host on
  // one GPU; with CUDA an NcclComm for the gradients (MPI stays for control traffic) and the model moved there.
  void select_device() {
    DeviceChoice choice = agreed(comm_, [&] {
      DeviceFacts facts;
#ifdef H5DDP_WITH_CUDA
      facts.cuda_compiled = true;
#endif
      facts.torch_cuda = facts.cuda_compiled && torch::cuda::is_available();
      facts.visible_gpus = facts.torch_cuda ? visible_cuda_devices() : 0;
      facts.local_rank = config_.local_rank;
      facts.local_size = config_.local_size;
      return choose_device(config_.device, facts);
    });
    int64_t all_cuda = choice.cuda ? 1 : 0;
    comm_.allreduce(&all_cuda, 1, DType::kI64, ReduceOp::kSum);
    if (all_cuda != 0 && all_cuda != comm_.size())
      comm_.raise_if_any("--device " + config_.device + ": " + std::to_string(all_cuda) + " of " +
                         std::to_string(comm_.size()) +
                         " ranks have a usable GPU and the others not; pass --device cpu, or give every rank a GPU");
    if (choice.cuda) set_cuda_device(choice.index);
    if (choice.cuda && !one_gpu_per_rank(choice.index)) choice = DeviceChoice{};  // --device auto: the CPU
    if (choice.cuda) {
#ifdef H5DDP_WITH_CUDA
      device_comm_ = NcclComm::create(comm_);
#endif
      compute_.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(choice.index));
      model_.module->to(compute_.device);
    }
    compute_.bf16 = config_.precision == "bf16";
    if (root_)
      log::root_info(
          "device: " +
          std::string(choice.cuda ? "cuda (one GPU per rank; rank 0 on " + choice.describe() + "), gradients over NCCL"
                                  : "cpu, gradients over MPI") +
          ", precision " + config_.precision);
  }

  // Collective, the same verdict everywhere. Two ranks of one host on one GPU (each sees one GPU, the same one)
  // would make NCCL fail later with a less clear error: compare "host bus-id" of every rank. A clash is an
  // error with --device cuda; with auto the job trains on the CPU (false).
  bool one_gpu_per_rank(int index) {
    constexpr size_t kLen = 160;
    char mine[kLen] = {};
    char host[64] = {};
    ::gethostname(host, sizeof host - 1);
    std::snprintf(mine, kLen, "%s %s", host, cuda_device_bus_id(index).c_str());
    std::vector<char> all(kLen * static_cast<size_t>(comm_.size()));
    comm_.allgather(mine, all.data(), kLen, DType::kU8);
    std::string err;
    std::map<std::string, int> seen;  // "host bus" -> first rank
    for (int r = 0; r < comm_.size() && err.empty(); ++r) {
      std::string tag(&all[kLen * r]);
      const std::string host = tag.substr(0, tag.find(' ')), bus = tag.substr(tag.rfind(' ') + 1);
      auto [it, fresh] = seen.emplace(host + " " + bus, r);
      if (!fresh)
        err = "--device cuda: ranks " + std::to_string(it->second) + " and " + std::to_string(r) + " on " + host +
              " both got the GPU at " + bus + "; give each rank its own (srun --gpus-per-task=1, or fewer ranks)";
    }
    if (!err.empty() && config_.device == "auto") {
      if (root_) log::root_info("note: " + err.substr(err.find(':') + 2) + "; --device auto trains on the CPU");
      return false;
    }
    comm_.raise_if_any(err);
    return true;
  }

  // Collective (the same verdict everywhere). The model takes the samples (a forward of two of them in eval
  // mode), and every label lies in [0, classes): each rank scans its share of the labels.
  void check_data_fits_model() {
    const int64_t width = agreed(comm_, [&] {
      model_.module->eval();
      const int64_t w = check_model_accepts(model_.forward, *train_set_, compute_);
      model_.module->train();
      if (config_.keep_best && !train_set_->spec().classification)
        throw ConfigError("--keep-best keeps the checkpoint of the best test accuracy; " + train_set_->describe() +
                          " has float targets (regression), which have none");
      return w;
    });
    std::string err;
    if (!train_set_->spec().classification) return;
    for (const Dataset* d : {train_set_.get(), test_set_.get()}) {
      if (!d) continue;
      const int64_t n = d->size(), r = comm_.rank(), w = comm_.size();
      int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
      d->label_range(n * r / w, n * (r + 1) / w, lo, hi);
      comm_.allreduce(&lo, 1, DType::kI64, ReduceOp::kMin);
      comm_.allreduce(&hi, 1, DType::kI64, ReduceOp::kMax);
      const int64_t classes = d->spec().num_classes > 0 ? d->spec().num_classes : width;
      const std::string bound = d->spec().num_classes > 0 ? "the file's num_classes" : "the model's output width";
      if (d->spec().num_classes > width)
        err = d->label_source() + ": num_classes " + std::to_string(classes) + " but the model has " +
              std::to_string(width) + " outputs";
      else if (lo < 0 || hi >= classes)
        err = d->label_source() + ": label " + std::to_string(lo < 0 ? lo : hi) + " outside [0, " +
              std::to_string(classes) + ") (" + bound + ")";
      comm_.raise_if_any(err);
    }
  }

  // Collective. --resume auto: the newest checkpoint of the run dir that loads (none: a fresh start exactly
  // like a run in an empty directory); a path: that file; none: fresh. --init-from: weights only.
  void resume_or_init() {
    ResumeInfo info;
    const auto load_start = Clock::now();
    try {
      if (config_.resume == "auto")
        info = ckpt_->resume();
      else if (config_.resume != "none")
        info = ckpt_->resume_from(config_.resume);
    } catch (const CheckpointMismatchError& e) {
      // Which model the refused file holds: from its /meta (the file the error names).
      std::vector<std::string> paths = list_resume_candidates(comm_, config_.run_dir).paths;  // collective
      if (config_.resume != "auto") paths = {config_.resume};
      std::string holds;
      for (const auto& p : paths)
        if (root_ && holds.empty() && std::string(e.what()).find(p) != std::string::npos)
          holds = model_identity_difference(read_checkpoint_meta(p), model_);
      holds = comm_.broadcast_string(holds, 0);  // every rank, whatever rank 0 found
      CheckpointMismatchError more(Error::Untagged{},
                                   std::string(e.what()) + "\n  " +
                                       (holds.empty() ? "this run's model: " + model_.description : holds) +
                                       "; resume with the model that wrote the checkpoint (h5ddp-ckpt info FILE names "
                                       "it in /meta) or train the new model in another --run-dir");
      if (!e.agreed()) throw more;
      throw_agreed(more);  // every rank raised it
    }
    // A later --resume auto takes the highest step in the run dir: say which files of an older run would shadow.
    if (config_.resume == "none") warn_of_checkpoints_in_fresh_run_dir(comm_, config_.run_dir);
    if (info.resumed) {
      const std::string other = model_identity_difference(info.meta, model_);
      comm_.raise_if_any(other.empty() ? "" : "cannot resume from " + info.path + ": " + other);
      check_init_from(info);
      report_resume(info);
    } else if (!config_.init_from.empty()) {
      ckpt_->load_weights(config_.init_from);
      ckpt_->set_meta(kInitFromMeta, config_.init_from);  // a requeued fine-tune resumes its own checkpoints
      if (root_) log::root_info("initialised the weights from " + config_.init_from);
    }
    check_batch(info);
    info_ = info;
    // The steps after the resumed one are redone: their records go, so the log never holds two versions.
    metrics_.truncate_after(info.resumed ? info.step : 0);
    JsonRecord start(info.resumed ? "resume" : "start");
    start.add("step", ckpt_->step()).add("world_size", comm_.size());
    if (info.resumed)
      start.add("from", info.path)
          .add("saved_world_size", info.saved_world_size)
          .add("load_seconds", seconds_since(load_start));
    metrics_.write(start);
    if (config_.keep_best) load_best();
  }

  // Collective (the same verdict everywhere: every rank read the same /meta). --init-from starts a fresh run;
  // in a run dir that already holds a checkpoint it applies only when that checkpoint's run was started from the
  // same file (the fine-tune requeued). Anything else is refused, naming both files: resuming the run dir's
  // checkpoint silently would "fine-tune" from the wrong weights.
  void check_init_from(const ResumeInfo& info) {
    const auto it = info.meta.find(kInitFromMeta);
    const std::string started_from = it == info.meta.end() ? "" : it->second;
    if (!started_from.empty()) ckpt_->set_meta(kInitFromMeta, started_from);  // provenance kept by later saves
    if (config_.init_from.empty() || same_file(started_from, config_.init_from)) {
      if (root_ && !config_.init_from.empty())
        log::root_info("--init-from " + config_.init_from + ": " + info.path +
                       " continues the run started from it; resuming that checkpoint");
      return;
    }
    throw_agreed(ConfigError(
        "--init-from " + config_.init_from + " starts a fresh run, but the run dir " + config_.run_dir +
        " already holds checkpoints: --resume auto found " + info.path +
        (started_from.empty() ? " (not started from an --init-from file)" : " (started from " + started_from + ")") +
        ". Give the fine-tune its own --run-dir, or pass --resume none to start over in this one from " +
        config_.init_from));
  }

  static bool same_file(const std::string& a, const std::string& b) {
    if (a.empty() || b.empty()) return false;
    std::error_code ec;
    const bool same = std::filesystem::equivalent(a, b, ec);
    return ec ? a == b : same;
  }

  // Collective. --keep-best: RUN_DIR/best ("<file> <accuracy>") from an earlier run, kept by retention.
  void load_best() {
    std::string text;
    if (root_) {
      std::ifstream in(config_.run_dir + "/best");
      std::getline(in, text);
    }
    text = comm_.broadcast_string(text, 0);
    std::istringstream is(text);
    std::string name;
    double accuracy = -1;
    if (is >> name >> accuracy && std::filesystem::exists(config_.run_dir + "/" + name)) {
      best_file_ = name;
      best_accuracy_ = accuracy;
      ckpt_->set_keep_files({best_file_});
    }
  }

  void report_resume(const ResumeInfo& info) {
    DataState& data = ckpt_->data();
    if (config_.batch_size_set && config_.batch_size != data.global_batch) {
      log::root_info("warning: --batch-size " + std::to_string(config_.batch_size) + " differs from the " +
                     std::to_string(data.global_batch) + " of the checkpoint; continuing with " +
                     std::to_string(config_.batch_size) + " from sample " + std::to_string(data.position));
      data.global_batch = config_.batch_size;
    }
    if (data.seed != config_.seed)
      log::root_info("note: the data order continues with the checkpoint's seed " + std::to_string(data.seed));
    result_.resumed_from = info.path;
    if (root_)
      log::root_info("resumed from " + info.path + " at step " + std::to_string(info.step) + ", epoch " +
                     std::to_string(data.epoch + 1) + ", sample " + std::to_string(data.position) + " (saved at " +
                     std::to_string(info.saved_world_size) + " ranks, now " + std::to_string(comm_.size()) +
                     (info.rng_exact ? "" : "; ranks beyond the saved world size got derived RNG streams") + ")");
  }

  // Collective. The checkpoint's global batch at another world size: the same verdict on every rank.
  void check_batch(const ResumeInfo& info) {
    std::string bad_batch;
    try {
      check_global_batch(ckpt_->data().global_batch, comm_.size());
    } catch (const Error& e) {
      bad_batch = std::string(e.what()) +
                  (info.resumed ? " (the global batch of " + info.path + "; pass --batch-size to change it)" : "");
    }
    if (bad_batch.empty() && (ckpt_->data().global_batch / comm_.size()) % config_.grad_accum != 0)
      bad_batch = "--grad-accum " + std::to_string(config_.grad_accum) + " does not divide the " +
                  std::to_string(ckpt_->data().global_batch / comm_.size()) + " samples per rank of the global batch " +
                  std::to_string(ckpt_->data().global_batch) + " at " + std::to_string(comm_.size()) + " ranks";
    comm_.raise_if_any(bad_batch);
  }

  // The steps to the end of the last epoch, counted from where the data position is: after a resume with
  // another --batch-size the steps already taken were of another size.
  void plan() {
    const DataState& data = ckpt_->data();
    sampler_ = std::make_unique<DistributedSampler>(train_set_->size(), data.global_batch, data.seed, comm_.size(),
                                                    comm_.rank());
    const int64_t step = ckpt_->step();
    const int64_t planned =
        step + (data.epoch < config_.epochs ? (train_set_->size() - data.position) / data.global_batch +
                                                  sampler_->steps_per_epoch() * (config_.epochs - data.epoch - 1)
                                            : 0);
    total_steps_ = config_.max_steps > 0 ? std::min(config_.max_steps, planned) : planned;
    schedule_.type = config_.lr_schedule;
    schedule_.base_lr = config_.lr;
    schedule_.step_size = config_.lr_step_size > 0 ? config_.lr_step_size : sampler_->steps_per_epoch();
    schedule_.gamma = config_.lr_gamma;
    schedule_.total_steps = total_steps_;
    schedule_.warmup_steps = config_.lr_warmup_steps;
    if (info_.resumed && !config_.replan_lr_schedule) continue_schedule();
    ckpt_->set_scheduler_state([this](int64_t s) { return schedule_.to_state(s); });
    metrics_interval_ = config_.log_every > 0 ? config_.log_every : std::max<int64_t>(1, total_steps_ / 200);
  }

  // Collective (the same verdict everywhere). After a resume the checkpoint's schedule continues with its
  // horizon, so raising --epochs or --max-steps does not change the lr of the steps already planned; options
  // that would change its shape are an error unless --replan-lr-schedule.
  void continue_schedule() {
    const SchedulerState& s = info_.scheduler;
    if (s.type.empty() || s.type == "none") return;  // a file without a schedule (import, library): ours
    LrSchedule saved;
    std::string err;
    try {
      saved = LrSchedule::from_state(s);
    } catch (const Error& e) {
      err = info_.path + ": " + e.what();
    }
    if (err.empty() && !saved.same_shape(schedule_))
      err = "the checkpoint " + info_.path + " continues the lr schedule " + saved.describe() +
            "; this run's options ask for " + schedule_.describe() +
            ": pass --replan-lr-schedule to change it from step " + std::to_string(info_.step);
    comm_.raise_if_any(err);
    if (saved.type != "cosine") {  // only cosine depends on the horizon
      saved.total_steps = schedule_.total_steps;
    } else if (saved.total_steps != schedule_.total_steps && root_) {
      log::root_info("note: the lr schedule keeps the checkpoint's horizon of " + std::to_string(saved.total_steps) +
                     " steps (this run plans " + std::to_string(schedule_.total_steps) +
                     (schedule_.total_steps > saved.total_steps
                          ? "; steps past the horizon run at the schedule's end value, lr 0"
                          : "") +
                     "); --replan-lr-schedule plans it over this run");
    }
    schedule_ = saved;
  }

  bool done() const {
    return ckpt_->step() >= total_steps_ || ckpt_->data().epoch >= config_.epochs;
  }

  void train() {
    progress_ = std::make_unique<Progress>(root_, config_.progress, total_steps_, config_.log_every);
    progress_->start(ckpt_->step());
    t_start_ = interval_start_ = Clock::now();
    model_.module->train();
    if (done() && info_.resumed && root_) say_nothing_to_train();
    while (!done())
      if (!step()) break;
    result_.train_seconds = seconds_since(t_start_);
    result_.step = ckpt_->step();
    result_.epoch = ckpt_->data().epoch;
    result_.last_checkpoint = ckpt_->last_checkpoint();
  }

  // Rank 0. A resume whose checkpoint already reached --max-steps or --epochs ends at once: say so, not only
  // "trained to step N in 0.0 s".
  void say_nothing_to_train() const {
    const DataState& data = ckpt_->data();
    const bool by_steps = config_.max_steps > 0 && ckpt_->step() >= config_.max_steps;
    log::root_info(
        "note: nothing to train: " + info_.path + " is at step " + std::to_string(ckpt_->step()) + " (" +
        std::to_string(data.epoch) + " epochs complete), already at " +
        (by_steps ? "--max-steps " + std::to_string(config_.max_steps) : "--epochs " + std::to_string(config_.epochs)) +
        "; raise --epochs/--max-steps to train further (or start over with --resume none)");
  }

  // Collective. One optimizer step, then the Checkpointer's agreement, evaluation and saves. False: a stop
  // signal (saved).
  bool step() {
    const auto step_start = Clock::now();
    const int64_t step = ckpt_->step();
    auto guard = watch_.watch("training step (forward/backward, gradient allreduce, step agreement)",
                              StallWatch::Kind::kStep, step);
    DataState& data = ckpt_->data();
    set_lr(*optimizer_, schedule_.lr_at(step));
    const double loss = forward_backward(sampler_->local_indices(data.epoch, data.position));
    optimizer_->step();
    if (config_.shard_optimizer) ddp_->gather_parameters();
    optimizer_->zero_grad();
    const bool epoch_ended = sampler_->advance(data);  // the rest of the permutation that fills no batch is dropped

    StepOutcome outcome = ckpt_->agree_step(step + 1, loss);
    progress_->update(step + 1, data.epoch, config_.epochs, outcome.value_mean, data.global_batch, done());
    record_train(step + 1, outcome.value_mean);
    guard.release();
    watch_.observe(StallWatch::Kind::kStep, seconds_since(step_start));
    const bool eval_due = (config_.eval_every_steps > 0 && (step + 1) % config_.eval_every_steps == 0) ||
                          (config_.eval_every_epoch && epoch_ended);
    const auto pause_start = Clock::now();                   // evaluations and saves do not count as training time
    if (eval_due || outcome.save_due) ddp_->sync_buffers();  // rank 0's BatchNorm statistics everywhere
    std::optional<EvalResult> eval;
    if (eval_due) eval = evaluate_now();
    // A new best is protected from retention from this step's save on (the old best is released by it).
    const bool new_best = eval && config_.keep_best && eval->accuracy > best_accuracy_;
    const std::vector<std::string> kept_before =
        best_file_.empty() ? std::vector<std::string>{} : std::vector<std::string>{best_file_};
    if (new_best) ckpt_->set_keep_files({format::checkpoint_file_name(step + 1)});
    if (outcome.save_due) {
      const auto save_start = Clock::now();
      auto save_guard = watch_.watch("checkpoint save", StallWatch::Kind::kSave, step + 1);
      ckpt_->save_if_due(outcome);
      watch_.observe(StallWatch::Kind::kSave, seconds_since(save_start));
      record_save();
    }
    if (new_best) keep_as_best(eval->accuracy, kept_before);
    interval_start_ += Clock::now() - pause_start;
    if (outcome.stop) return false;
    if (config_.step_sleep_ms > 0) {  // stands for compute in tests: watched like the step it stands for
      auto sleep_guard = watch_.watch("step sleep (--step-sleep-ms)", StallWatch::Kind::kStep, step + 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(config_.step_sleep_ms));
    }
    return true;
  }

  // Collective. Forward and backward of this rank's share of the global batch in --grad-accum micro-batches;
  // only the last one reduces gradients (DDP no_sync before it). Returns this rank's mean loss.
  double forward_backward(const std::vector<int64_t>& indices) {
    const int64_t k = config_.grad_accum, micro = static_cast<int64_t>(indices.size()) / k;
    double loss_sum = 0;
    for (int64_t m = 0; m < k; ++m) {
      std::optional<DistributedDataParallel::NoSync> local;
      if (m + 1 < k) local.emplace(ddp_->no_sync());
      const std::vector<int64_t> part(indices.begin() + m * micro, indices.begin() + (m + 1) * micro);
      auto [x, y] = batch_tensors(*train_set_, part);
      x = x.to(compute_.device, /*non_blocking=*/false);
      y = y.to(compute_.device);
      ddp_->prepare_forward();
      torch::Tensor loss;
      {
        AutocastScope autocast(compute_);
        loss = batch_loss(train_set_->spec(), model_.forward(x), y);
      }
      if (k > 1) loss = loss / static_cast<double>(k);
      loss.backward();
      ddp_->finish_backward();
      loss_sum += loss.item<double>();
    }
    return loss_sum;
  }

  // Collective. A distributed evaluation during training: in the metrics log and in the next checkpoint's meta.
  EvalResult evaluate_now() {
    const EvalResult r = evaluate(model_, *test_set_, comm_, compute_);
    char acc[32];
    std::snprintf(acc, sizeof acc, "%.6f", r.accuracy);
    ckpt_->set_meta("eval_accuracy", acc);
    ckpt_->set_meta("eval_step", std::to_string(ckpt_->step()));
    metrics_.write(JsonRecord("eval")
                       .add("step", ckpt_->step())
                       .add("epoch", ckpt_->data().epoch)
                       .add("accuracy", r.accuracy)
                       .add("loss", r.loss));
    if (root_) {  // also on the console: the metrics log is not the only place an evaluation shows
      progress_->end_line();
      if (r.accuracy >= 0)
        std::printf("eval at step %lld: test accuracy %.2f%%, loss %.4f on %lld samples\n",
                    static_cast<long long>(ckpt_->step()), 100.0 * r.accuracy, r.loss,
                    static_cast<long long>(test_set_->size()));
      else
        std::printf("eval at step %lld: test loss (mean squared error) %.6g on %lld samples\n",
                    static_cast<long long>(ckpt_->step()), r.loss, static_cast<long long>(test_set_->size()));
      std::fflush(stdout);
    }
    return r;
  }

  // Collective. --keep-best: the checkpoint of this step (saved now unless it is) becomes the best one, named in
  // RUN_DIR/best once committed. If the save failed (--on-save-error continue), the previous best stays.
  void keep_as_best(double accuracy, const std::vector<std::string>& kept_before) {
    if (ckpt_->last_saved_step() != ckpt_->step()) {
      auto save_guard = watch_.watch("best checkpoint save", StallWatch::Kind::kSave, ckpt_->step());
      ckpt_->save();
      record_save();
    }
    ckpt_->wait();  // `best` names a committed file only
    if (ckpt_->last_saved_step() != ckpt_->step()) {
      ckpt_->set_keep_files(kept_before);
      return;
    }
    best_accuracy_ = accuracy;
    best_file_ = format::checkpoint_file_name(ckpt_->step());
    if (root_) write_best_pointer();
    comm_.barrier();
  }

  // Rank 0. RUN_DIR/best = "<file> <accuracy>", moved like `latest` (write_run_dir_pointer). A failure is reported:
  // the best checkpoint itself is committed either way.
  void write_best_pointer() const {
    char line[512];
    std::snprintf(line, sizeof line, "%s %.6f\n", best_file_.c_str(), best_accuracy_);
    try {
      write_run_dir_pointer(config_.run_dir, "best", line, config_.fsync);
    } catch (const Error& e) {
      log::warn(std::string("--keep-best: ") + e.what());
    }
  }

  // Rank 0's metrics: a "train" record every metrics_interval_ steps (mean loss over the interval).
  void record_train(int64_t step, double loss) {
    interval_loss_ += loss;
    ++interval_steps_;
    if (step % metrics_interval_ != 0 && !done()) return;
    const double el = seconds_since(interval_start_);
    metrics_.write(JsonRecord("train")
                       .add("step", step)
                       .add("epoch", ckpt_->data().epoch)
                       .add("loss", interval_loss_ / static_cast<double>(interval_steps_))
                       .add("lr", schedule_.lr_at(step - 1))
                       .add("samples_per_s",
                            el > 0 ? static_cast<double>(interval_steps_ * ckpt_->data().global_batch) / el : 0.0));
    interval_loss_ = 0;
    interval_steps_ = 0;
    interval_start_ = Clock::now();
  }

  // Rank 0's metrics: the save just made (once per save).
  void record_save() {
    const SaveStats& s = ckpt_->last_save();
    if (s.step < 0 || s.step == recorded_save_step_) return;
    recorded_save_step_ = s.step;
    JsonRecord r("save");
    r.add("step", s.step).add("path", s.path).add("async", s.async).add("blocked_seconds", s.blocked_seconds);
    if (s.async)
      r.add_null("seconds");  // written in the background: known when it commits
    else
      r.add("seconds", s.seconds);
    metrics_.write(r.add("bytes", static_cast<int64_t>(s.bytes)));
  }

  // A signal (also one after the last step) saved the state; training asks to be requeued.
  TrainResult stopped() {
    if (root_) {
      progress_->end_line();
      std::printf("stopped by a signal at step %lld; saved %s; exit code %d (%s)\n",
                  static_cast<long long>(ckpt_->step()), ckpt_->last_checkpoint().c_str(), ckpt_->exit_code(),
                  ckpt_->exit_code() == stop_signal::kExitRequeue ? "requeue me" : "interrupted");
      std::fflush(stdout);
    }
    result_.exit_code = ckpt_->exit_code();
    record_save();
    metrics_.write(JsonRecord("stop")
                       .add("step", ckpt_->step())
                       .add("exit_code", result_.exit_code)
                       .add("signal", result_.exit_code == stop_signal::kExitRequeue ? "SIGUSR1/SIGTERM" : "SIGINT")
                       .add("checkpoint", ckpt_->last_checkpoint()));
    return result_;
  }

  // Collective. The background save in flight, the final save, the evaluation, the summary.
  void finish() {
    {
      ddp_->sync_buffers();
      auto guard =
          watch_.watch(config_.final_checkpoint ? "final checkpoint save" : "wait for the background checkpoint save",
                       StallWatch::Kind::kSave, ckpt_->step());
      ckpt_->finish(config_.final_checkpoint);
    }
    result_.last_checkpoint = ckpt_->last_checkpoint();
    record_save();
    JsonRecord end("end");
    end.add("step", ckpt_->step()).add("epoch", ckpt_->data().epoch).add("exit_code", 0);
    end.add("train_seconds", result_.train_seconds);
    if (config_.evaluate) {
      const EvalResult r = evaluate(model_, *test_set_, comm_, compute_);
      result_.test_accuracy = r.accuracy;
      result_.test_loss = r.loss;
      if (r.accuracy >= 0) end.add("test_accuracy", r.accuracy);
      end.add("test_loss", r.loss);
    }
    metrics_.write(end);
    if (root_) print_summary();
  }

  void print_summary() const {
    const int64_t step = ckpt_->step(), epoch = ckpt_->data().epoch;
    std::printf("trained to step %lld (%lld of %lld epochs complete) in %.1f s at %d ranks\n",
                static_cast<long long>(step), static_cast<long long>(std::min(epoch, config_.epochs)),
                static_cast<long long>(config_.epochs), result_.train_seconds, comm_.size());
    if (config_.evaluate && result_.test_accuracy >= 0)
      std::printf("test accuracy: %.2f%% on %lld images\n", 100.0 * result_.test_accuracy,
                  static_cast<long long>(test_set_->size()));
    else if (config_.evaluate)
      std::printf("test loss (mean squared error): %.6g on %lld samples\n", result_.test_loss,
                  static_cast<long long>(test_set_->size()));
    const std::string ckpt = !result_.last_checkpoint.empty() ? result_.last_checkpoint : result_.resumed_from;
    if (!ckpt.empty()) print_next_commands(ckpt);
    std::fflush(stdout);
  }

  // The command that continues this run: the launch script's own line when one set H5DDP_RESUME_HINT
  // (jobs/train-local.sh), else mpirun with what this machine needs (root, more ranks than cores) and this
  // run's options less --resume/--init-from, which would start over or go back to an older step.
  void print_next_commands(const std::string& ckpt) const {
    const auto& argv = config_.command_line;
    std::vector<std::string> command{argv.empty() ? std::string("h5ddp-train") : argv[0]};
    if (!argv.empty()) {
      const std::vector<std::string> kept =
          without_options(std::vector<std::string>(argv.begin() + 1, argv.end()), {"--resume", "--init-from"});
      command.insert(command.end(), kept.begin(), kept.end());
    }
    const std::string dir = std::filesystem::path(command[0]).parent_path().string();
    std::string launch;
    if (const char* hint = std::getenv("H5DDP_RESUME_HINT"); hint && *hint) {
      launch = hint;
    } else {
      std::vector<std::string> mpirun{"mpirun", "-np", std::to_string(comm_.size())};
      if (::geteuid() == 0) mpirun.push_back("--allow-run-as-root");
      if (config_.local_size > static_cast<int>(std::thread::hardware_concurrency()))
        mpirun.push_back("--oversubscribe");
      mpirun.insert(mpirun.end(), command.begin(), command.end());
      launch = shell_join(mpirun);
    }
    std::printf("checkpoint: %s\n", ckpt.c_str());
    std::printf("resume (newest checkpoint of the run dir; raise --epochs/--max-steps to train further):\n  %s\n",
                launch.c_str());
    std::printf("inspect:\n  %s info %s\n", shell_join({(dir.empty() ? "" : dir + "/") + "h5ddp-ckpt"}).c_str(),
                shell_join({ckpt}).c_str());
  }

  const TrainConfig& config_;
  Comm& comm_;
  const bool root_;
  SignalScope signals_;
  StallWatch watch_;
  TrainResult result_;
  std::unique_ptr<Dataset> train_set_, test_set_;
  TrainModel model_;
  Compute compute_;                    // --device, --precision
  std::unique_ptr<Comm> device_comm_;  // NcclComm with --device cuda
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<Checkpointer> ckpt_;
  std::unique_ptr<DistributedSampler> sampler_;
  std::unique_ptr<Progress> progress_;
  LrSchedule schedule_;
  int64_t total_steps_ = 0;
  Clock::time_point t_start_;
  MetricsLog metrics_;
  ResumeInfo info_;               // what the resume found (resumed false: a fresh start)
  int64_t metrics_interval_ = 1;  // steps per "train" record
  double interval_loss_ = 0;
  int64_t interval_steps_ = 0;
  Clock::time_point interval_start_;
  int64_t recorded_save_step_ = -1;  // the last save written to the metrics log
  std::string best_file_;            // --keep-best: the best checkpoint's file name and score
  double best_accuracy_ = -1;
};

}  // namespace

TrainResult run_training(const TrainConfig& config, Comm& comm) {
  return Trainer(config, comm).run();
}

}  // namespace h5ddp
