// Preemption signals. The handlers only record the signal; the trainer polls at each step boundary and
// the ranks agree by allreduce, so a signal that reached one rank only still makes every rank save.
#pragma once

namespace h5ddp::stop_signal {

// Exit code of h5ddp-train after saving on SIGUSR1 or SIGTERM: "saved after a preemption signal,
// requeue me" (EX_TEMPFAIL). Job scripts requeue on it.
inline constexpr int kExitRequeue = 75;
// Exit code after saving on SIGINT (128 + SIGINT, the shell's convention for Ctrl-C).
inline constexpr int kExitInterrupted = 130;

// Local. Installs handlers for SIGUSR1, SIGTERM and SIGINT. A second SIGINT or SIGTERM kills the process
// with the default action (for a user who does not want to wait for the save). Nested calls (the trainer's,
// then its Checkpointer's) count: only the outermost installs (and forgets an earlier signal).
void install();
// Local. Restores the default actions when it matches the outermost install().
void uninstall();
// Local, async-signal-safe read. The most recent signal number received since install()/clear(), or 0.
int pending();
void clear();

}  // namespace h5ddp::stop_signal
