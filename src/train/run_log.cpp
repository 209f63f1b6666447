#include "train/run_log.hpp"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <filesystem>

#include "h5ddp/stop_signal.hpp"
#include "train/goodput.hpp"
#include "train/resume_hint.hpp"

namespace h5ddp {
namespace {

std::string printf_string(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string printf_string(const char* format, ...) {
  char buf[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
}

}  // namespace

void RunLog::write(JsonRecord r) {
  last_record_ = Clock::now();
  log_.write(std::move(r));
}

void RunLog::start(int64_t step, int world_size) {
  const ProcessStart p = process_start();
  write(JsonRecord("start")
            .add("step", step)
            .add("world_size", world_size)
            .add("process_start", p.seconds)
            .add("process_start_from", p.source));
}

void RunLog::resume(int64_t step, int world_size, const std::string& from, int saved_world_size, double load_seconds) {
  const ProcessStart p = process_start();
  write(JsonRecord("resume")
            .add("step", step)
            .add("world_size", world_size)
            .add("from", from)
            .add("saved_world_size", saved_world_size)
            .add("load_seconds", load_seconds)
            .add("process_start", p.seconds)
            .add("process_start_from", p.source));
}

void RunLog::train(int64_t step, int64_t epoch, double loss, double lr, int64_t global_batch, bool flush,
                   std::optional<double> grad_norm, int64_t skipped, int64_t tokens_per_sample) {
  loss_ += loss;
  ++steps_;
  if (grad_norm && std::isfinite(*grad_norm)) {
    grad_norm_ += *grad_norm;
    ++norms_;
  }
  if (step % interval_ != 0 && !flush && seconds_since(last_record_) < kHeartbeatSeconds) return;
  const double el = seconds_since(interval_start_);
  const double samples_per_s = el > 0 ? static_cast<double>(steps_ * global_batch) / el : 0.0;
  JsonRecord r("train");
  r.add("step", step)
      .add("epoch", epoch)
      .add("loss", loss_ / static_cast<double>(steps_))
      .add("lr", lr)
      .add("samples_per_s", samples_per_s)
      .add("seconds", el)
      .add("steps", steps_);
  if (tokens_per_sample > 0) r.add("tokens_per_s", samples_per_s * static_cast<double>(tokens_per_sample));
  if (grad_norm) {  // --grad-clip: the interval's mean finite norm
    if (norms_ > 0)
      r.add("grad_norm", grad_norm_ / static_cast<double>(norms_));
    else
      r.add_null("grad_norm");
    r.add("skipped_steps", skipped);
  }
  write(r);
  loss_ = 0;
  steps_ = 0;
  grad_norm_ = 0;
  norms_ = 0;
  interval_start_ = Clock::now();
}

void RunLog::eval(int64_t step, int64_t epoch, const EvalResult& r, double seconds) {
  JsonRecord e("eval");
  e.add("step", step).add("epoch", epoch).add("accuracy", r.accuracy).add("loss", r.loss);
  if (r.perplexity >= 0) e.add("perplexity", r.perplexity);
  write(e.add("seconds", seconds));
}

void RunLog::interval(int64_t step, int64_t steps, double save_seconds, double step_seconds, double mtbf_seconds) {
  write(JsonRecord("interval")
            .add("step", step)
            .add("every_steps", steps)
            .add("save_seconds", save_seconds)
            .add("step_seconds", step_seconds)
            .add("mtbf_seconds", mtbf_seconds));
}

bool RunLog::save(const SaveRecord& s) {
  if (s.step < 0 || s.step == saved_step_) return false;
  saved_step_ = s.step;
  JsonRecord r("save");
  r.add("step", s.step).add("path", s.path).add("async", s.async).add("blocked_seconds", s.blocked_seconds);
  if (s.async)
    r.add_null("seconds");  // written in the background: known when it commits
  else
    r.add("seconds", s.seconds);
  write(r.add("bytes", static_cast<int64_t>(s.bytes)));
  return true;
}

void RunLog::stop(int64_t step, int exit_code, const std::string& checkpoint) {
  write(JsonRecord("stop")
            .add("step", step)
            .add("exit_code", exit_code)
            .add("signal", exit_code == stop_signal::kExitRequeue ? "SIGUSR1/SIGTERM" : "SIGINT")
            .add("checkpoint", checkpoint));
}

void RunLog::end(int64_t step, int64_t epoch, double train_seconds, const EvalResult* final_eval, double eval_seconds,
                 double wait_seconds) {
  JsonRecord end("end");
  end.add("step", step).add("epoch", epoch).add("exit_code", 0).add("train_seconds", train_seconds);
  if (final_eval != nullptr) {
    if (final_eval->accuracy >= 0) end.add("test_accuracy", final_eval->accuracy);
    end.add("test_loss", final_eval->loss);
    if (final_eval->perplexity >= 0) end.add("test_perplexity", final_eval->perplexity);
    end.add("eval_seconds", eval_seconds);
  }
  write(end.add("wait_seconds", wait_seconds));
}

void RunLog::error(int64_t step, const std::string& message) {
  write(JsonRecord("error").add("step", step).add("message", message));
}

namespace console {
namespace {
// "1 rank", "2 ranks".
std::string counted(int64_t n, const char* noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}
}  // namespace

std::string eval_line(int64_t step, const EvalResult& r, int64_t samples) {
  if (r.perplexity >= 0)
    return printf_string("eval at step %lld: test loss %.4f, perplexity %.3f, token accuracy %.2f%% on %lld tokens",
                         static_cast<long long>(step), r.loss, r.perplexity, 100.0 * r.accuracy,
                         static_cast<long long>(r.positions));
  if (r.accuracy >= 0)
    return printf_string("eval at step %lld: test accuracy %.2f%%, loss %.4f on %lld samples",
                         static_cast<long long>(step), 100.0 * r.accuracy, r.loss, static_cast<long long>(samples));
  return printf_string("eval at step %lld: test loss (mean squared error) %.6g on %lld samples",
                       static_cast<long long>(step), r.loss, static_cast<long long>(samples));
}

std::string resumed_line(const std::string& path, int64_t step, int64_t epoch, int64_t position, int saved_world_size,
                         int world_size, bool rng_exact) {
  return "resumed from " + path + " at step " + std::to_string(step) + ", epoch " + std::to_string(epoch + 1) +
         ", sample " + std::to_string(position) + " (saved at " + counted(saved_world_size, "rank") + ", now " +
         std::to_string(world_size) + (rng_exact ? "" : "; ranks beyond the saved world size got derived RNG streams") +
         ")";
}

std::string nothing_to_train(const std::string& path, int64_t step, int64_t epochs_done, int64_t max_steps,
                             int64_t epochs) {
  const bool by_steps = max_steps > 0 && step >= max_steps;
  return "note: nothing to train: " + path + " is at step " + std::to_string(step) + " (" +
         counted(epochs_done, "epoch") + " complete), already at " +
         (by_steps ? "--max-steps " + std::to_string(max_steps) : "--epochs " + std::to_string(epochs)) +
         "; raise --epochs/--max-steps to train further (or start over with --resume none)";
}

std::string stopped_line(int64_t step, const std::string& checkpoint, int exit_code) {
  return printf_string("stopped by a signal at step %lld; saved %s; exit code %d (%s)", static_cast<long long>(step),
                       checkpoint.c_str(), exit_code,
                       exit_code == stop_signal::kExitRequeue ? "requeue me" : "interrupted");
}

std::string summary(const Summary& s) {
  std::string text =
      printf_string("trained to step %lld (%lld of %s complete) in %.1f s at %s\n", static_cast<long long>(s.step),
                    static_cast<long long>(std::min(s.epoch, s.epochs)), counted(s.epochs, "epoch").c_str(),
                    s.train_seconds, counted(s.world_size, "rank").c_str());
  if (s.evaluated && s.eval.perplexity >= 0)
    text += printf_string("test loss %.4f, perplexity %.3f, token accuracy %.2f%% on %lld tokens\n", s.eval.loss,
                          s.eval.perplexity, 100.0 * s.eval.accuracy, static_cast<long long>(s.eval.positions));
  else if (s.evaluated && s.eval.accuracy >= 0)
    text += printf_string("test accuracy: %.2f%% on %lld images\n", 100.0 * s.eval.accuracy,
                          static_cast<long long>(s.test_samples));
  else if (s.evaluated)
    text += printf_string("test loss (mean squared error): %.6g on %lld samples\n", s.eval.loss,
                          static_cast<long long>(s.test_samples));
  if (s.checkpoint.empty()) return text;
  const std::string program = s.program.empty() ? std::string("h5ddp-train") : s.program;
  const std::string dir = std::filesystem::path(program).parent_path().string();
  text += "checkpoint: " + s.checkpoint + "\n";
  text += "resume (newest checkpoint of the run dir; raise --epochs/--max-steps to train further):\n  " +
          s.resume_command + "\n";
  text += "inspect:\n  " + shell_join({(dir.empty() ? "" : dir + "/") + "h5ddp-ckpt"}) + " info " +
          shell_join({s.checkpoint}) + "\n";
  return text;
}

}  // namespace console
}  // namespace h5ddp
