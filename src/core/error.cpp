#include "h5ddp/error.hpp"

#include <mpi.h>
#include <unistd.h>

#include <mutex>

namespace h5ddp {
namespace {

std::mutex g_identity_mutex;
std::string g_host;
int g_rank = -1;
int g_size = 0;

std::string local_hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

const char* basename_of(const char* path) {
  const char* base = path;
  for (const char* p = path; *p; ++p)
    if (*p == '/') base = p + 1;
  return base;
}

}  // namespace

Error::Error(const std::string& message) : std::runtime_error(message), message_(process_tag() + " " + message) {}

Error::Error(Untagged, const std::string& message) : std::runtime_error(message), message_(message) {}

void Error::add_context(const std::string& context) {
  message_ += "\n  while " + context;
}

std::string process_tag() {
  std::lock_guard<std::mutex> lock(g_identity_mutex);
  std::string host = g_host.empty() ? local_hostname() : g_host;
  if (g_rank < 0) return "[" + host + "]";
  return "[" + host + " rank " + std::to_string(g_rank) + "/" + std::to_string(g_size) + "]";
}

namespace detail {

void set_process_identity(const std::string& host, int rank, int size) {
  std::lock_guard<std::mutex> lock(g_identity_mutex);
  g_host = host;
  g_rank = rank;
  g_size = size;
}

std::string source_location(const char* file, int line) {
  return std::string(" (") + basename_of(file) + ":" + std::to_string(line) + ")";
}

void throw_mpi_error(int code, const char* expr, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) snprintf(text, sizeof(text), "MPI error %d", code);
  throw MpiError(std::string(expr) + " failed: " + text + source_location(file, line));
}

void throw_check_failed(const char* expr, const std::string& message, const char* file, int line) {
  throw Error(message + " [check " + expr + " failed at " + basename_of(file) + ":" + std::to_string(line) + "]");
}

}  // namespace detail
}  // namespace h5ddp
