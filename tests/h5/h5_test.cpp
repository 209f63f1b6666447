// The h5 layer: error stack in exceptions, quiet errors, attributes, path checks, types.
#include "h5/h5.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "h5ddp/error.hpp"
#include "h5ddp_test/test_util.hpp"

using namespace h5ddp;

namespace {

std::string new_file(const std::string& tag) {
  return test::scratch_dir(tag) + "/f.h5";
}

TEST(H5, ErrorsCarryTheHdf5StackAndTheExpression) {
  try {
    H5DDP_CHECK_H5(H5Fopen("/nonexistent/dir/x.h5", H5F_ACC_RDONLY, H5P_DEFAULT));
    FAIL() << "no error";
  } catch (const H5Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("H5Fopen"), std::string::npos) << w;
    EXPECT_NE(w.find("HDF5 #"), std::string::npos) << w;       // the walked error stack
    EXPECT_NE(w.find("h5_test.cpp"), std::string::npos) << w;  // where it was raised
  }
}

TEST(H5, AttributesRoundTrip) {
  const std::string path = new_file("attrs");
  h5::Handle f = h5::file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, h5::serial_file_access()));
  h5::write_attr(f, "s", std::string("héllo"));
  h5::write_attr(f, "i", int64_t{-5});
  h5::write_attr(f, "u", uint64_t{0xFFFFFFFFFFFFFFFFull});
  h5::write_attr(f, "d", 0.125);
  EXPECT_EQ(h5::read_attr_string(f, "s"), "héllo");
  EXPECT_EQ(h5::read_attr_int(f, "i"), -5);
  EXPECT_EQ(h5::read_attr_uint(f, "u"), 0xFFFFFFFFFFFFFFFFull);
  EXPECT_EQ(h5::read_attr_double(f, "d"), 0.125);
  EXPECT_EQ(h5::attr_names(f), (std::vector<std::string>{"d", "i", "s", "u"}));
  EXPECT_TRUE(h5::has_attr(f, "s"));
  EXPECT_FALSE(h5::has_attr(f, "nope"));
  EXPECT_THROW(h5::read_attr_int(f, "nope"), H5Error);
  EXPECT_THROW(h5::read_attr_int(f, "s"), H5Error);  // wrong class
}

TEST(H5, ExistsHandlesMissingIntermediateGroups) {
  const std::string path = new_file("exists");
  h5::Handle f = h5::file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  h5::create_group(f, "/a/b.c/d");
  EXPECT_TRUE(h5::exists(f, "/a/b.c/d"));
  EXPECT_TRUE(h5::exists(f, "/a"));
  EXPECT_FALSE(h5::exists(f, "/a/x/y"));
  EXPECT_FALSE(h5::exists(f, "/z"));
  EXPECT_EQ(h5::children(f, "/a"), std::vector<std::string>{"b.c"});
}

TEST(H5, HalfTypeIsIeeeBinary16) {
  h5::Handle t = h5::file_type(DType::kF16);
  EXPECT_EQ(H5Tget_size(t), 2u);
  // 1.5 as float32 converts to 0x3E00 in binary16.
  float in = 1.5f;
  uint16_t out[2] = {0, 0};
  std::memcpy(out, &in, 4);
  ASSERT_GE(H5Tconvert(H5T_NATIVE_FLOAT, t, 1, out, nullptr, H5P_DEFAULT), 0);
  EXPECT_EQ(out[0], 0x3E00);
}

TEST(H5, HandlesCloseAndMove) {
  h5::Handle a = h5::dataspace(H5Screate(H5S_SCALAR));
  hid_t id = a.get();
  h5::Handle b = std::move(a);
  EXPECT_FALSE(a.valid());
  EXPECT_EQ(b.get(), id);
  b.close();
  EXPECT_FALSE(b.valid());
  EXPECT_LE(H5Iis_valid(id), 0);
}

TEST(H5, IsHdf5File) {
  const std::string dir = test::scratch_dir("ishdf5");
  { std::ofstream(dir + "/t.txt") << "text"; }
  EXPECT_FALSE(h5::is_hdf5_file(dir + "/t.txt"));
  EXPECT_FALSE(h5::is_hdf5_file(dir + "/missing"));
}

}  // namespace
