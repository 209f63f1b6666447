#include "h5ddp_test/corrupt_dataset.hpp"

#include <hdf5.h>

#include <fstream>

#include "h5/h5.hpp"
#include "h5ddp_test/test_util.hpp"

namespace h5ddp::test {

void corrupt_dataset(const std::string& path, const std::string& dataset) {
  if (world().rank() == 0) {
    haddr_t offset;
    hsize_t size;
    {
      h5::Handle f = h5::file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
      h5::Handle ds = h5::dataset(H5Dopen2(f, dataset.c_str(), H5P_DEFAULT));
      offset = H5Dget_offset(ds);
      size = H5Dget_storage_size(ds);
    }
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(offset + size / 2));
    char c = 0;
    io.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    io.seekp(static_cast<std::streamoff>(offset + size / 2));
    io.write(&c, 1);
  }
  world().barrier();
}

}  // namespace h5ddp::test
