// checkpoint_fixture_writer DIR SEED: all ranks save the fixture state
// (tests/support/h5ddp_test/checkpoint_fixture.hpp) into DIR; rank 0 also writes DIR/expected/<n>.bin with each
// dataset's exact bytes and DIR/expected/index.txt
// ("<n> <dataset path> <dtype> <shape>") so that script tests (h5py, h5ddp-ckpt) compare against truth.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "h5ddp/checkpoint.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/format.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "h5ddp/mpi_env.hpp"
#include "h5ddp_test/checkpoint_fixture.hpp"

using namespace h5ddp;

int main(int argc, char** argv) {
  MpiEnv env(&argc, &argv);
  try {
    if (argc != 3) throw ConfigError("usage: checkpoint_fixture_writer DIR SEED");
    const std::string dir = argv[1];
    const uint64_t seed = std::stoull(argv[2]);
    auto comm = MpiComm::dup(MPI_COMM_WORLD);
    test::OwnedState s(seed, comm->rank());
    SaveOptions opt;
    opt.fsync = false;
    const SaveResult r = save_checkpoint(*comm, s.state, dir, opt);
    if (comm->rank() == 0) {
      const std::filesystem::path exp = std::filesystem::path(dir) / "expected";
      std::filesystem::create_directories(exp);
      std::ofstream index(exp / "index.txt");
      int n = 0;
      auto dump = [&](const std::string& path, const TensorRef& t) {
        std::ofstream(exp / (std::to_string(n) + ".bin"), std::ios::binary)
            .write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.nbytes()));
        index << n++ << " " << path << " " << dtype_name(t.dtype) << " ";
        for (size_t i = 0; i < t.shape.size(); ++i) index << (i ? "," : "") << t.shape[i];
        index << "\n";
      };
      for (const auto& t : s.state.model) dump(format::model_dataset(t.name), t);
      for (const auto& t : s.state.optimizer.state) dump(format::optimizer_state_dataset(t.name), t);
      std::printf("%s\n", r.path.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    die_with_exception(e);
  }
}
