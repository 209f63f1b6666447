// Linked into train_torch_test, a binary with LibTorch, which links Debian's serial HDF5: both HDF5
// libraries are loaded, and every HDF5 call of h5ddp must still reach the parallel one.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "h5/h5.hpp"

namespace h5ddp {
namespace {

TEST(Hdf5Binding, OneHdf5LibraryServesH5ddpNextToLibTorch) {
  EXPECT_EQ(h5::hdf5_library_conflict(), "");
  EXPECT_NO_THROW(h5::mpio_file_access(MPI_COMM_WORLD));
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&H5Fcreate), &info), 0);
  EXPECT_NE(std::string(info.dli_fname).find("openmpi"), std::string::npos) << info.dli_fname;
}

}  // namespace
}  // namespace h5ddp
