// main() for every MPI test binary: MPI is up for the whole run, only rank 0 prints gtest's report
// (other ranks print their failures only), and the exit code is the same on all ranks: failed if
// any rank failed (nccl-tests' approach).
#include <gtest/gtest.h>
#include <mpi.h>

#include "h5ddp/mpi_env.hpp"

namespace {

class FailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] FAILURE %s:%d\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  h5ddp::MpiEnv env(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  auto& listeners = testing::UnitTest::GetInstance()->listeners();
  if (env.rank() != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(env.rank()));
  }
  int rc = RUN_ALL_TESTS();
  int local_failed = rc != 0 ? 1 : 0, any_failed = 0;
  MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (env.rank() == 0 && any_failed && !local_failed) std::fprintf(stderr, "a test failed on another rank\n");
  return any_failed;
}
