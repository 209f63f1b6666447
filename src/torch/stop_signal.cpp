#include "h5ddp/stop_signal.hpp"

#include <csignal>
#include <initializer_list>

namespace h5ddp::stop_signal {
namespace {

volatile std::sig_atomic_t g_signal = 0;
int g_depth = 0;  // install() calls not yet matched by uninstall() (the trainer's and its Checkpointer's)

extern "C" void on_signal(int sig) {
  g_signal = sig;
}

void set(int sig, void (*handler)(int), int flags) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = flags;
  sigaction(sig, &sa, nullptr);
}

}  // namespace

void install() {
  if (g_depth++ > 0) return;
  g_signal = 0;
  set(SIGUSR1, on_signal, SA_RESTART);
  set(SIGTERM, on_signal, SA_RESTART | SA_RESETHAND);
  set(SIGINT, on_signal, SA_RESTART | SA_RESETHAND);
}

void uninstall() {
  if (g_depth == 0 || --g_depth > 0) return;
  for (int sig : {SIGUSR1, SIGTERM, SIGINT}) set(sig, SIG_DFL, 0);
}

int pending() {
  return g_signal;
}
void clear() {
  g_signal = 0;
}

}  // namespace h5ddp::stop_signal
