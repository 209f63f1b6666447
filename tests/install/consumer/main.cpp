// Uses the installed headers and libraries: MPI environment, communicator, agreement.
#include <cstdio>
#include <h5ddp/mpi_comm.hpp>
#include <h5ddp/mpi_env.hpp>

int main(int argc, char** argv) {
  h5ddp::MpiEnv env(&argc, &argv);
  auto comm = h5ddp::MpiComm::dup(MPI_COMM_WORLD);
  int64_t v = comm->rank() + 1;
  comm->allreduce(&v, 1, h5ddp::DType::kI64, h5ddp::ReduceOp::kSum);
  const bool ok = v == static_cast<int64_t>(comm->size()) * (comm->size() + 1) / 2 && comm->agree(7);
  if (comm->rank() == 0) std::printf("consumer: size=%d sum=%lld %s\n", comm->size(), (long long)v, ok ? "OK" : "BAD");
  return ok ? 0 : 1;
}
