// include/h5ddp/h5_layout.hpp: a file written here with the h5 layer's private RAII, described through the
// HDF5-free API (types, shapes, the offset of a contiguous dataset, chunked and unwritten datasets refused).
#include "h5ddp/h5_layout.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <numeric>

#include "h5/h5.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp_test/test_util.hpp"

using namespace h5ddp;

namespace {

const std::vector<int64_t> kShape = {5, 3, 2};

std::vector<unsigned char> rows() {
  std::vector<unsigned char> v(30);
  std::iota(v.begin(), v.end(), static_cast<unsigned char>(7));
  return v;
}

void add_dataset(hid_t file, const std::string& name, hid_t type, const void* data, hid_t dcpl = H5P_DEFAULT) {
  h5::Handle space = h5::make_space(kShape);
  h5::Handle ds = h5::dataset(H5Dcreate2(file, name.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
  if (data) H5DDP_CHECK_H5(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

// /g/x u8 [5, 3, 2] contiguous with attributes mean [3] and classes; /g/chunked f32 chunked; /g/empty u8 never
// written; /g/be big-endian i32; file attributes num_classes (int) and name (string).
std::string make_file() {
  const std::string path = test::scratch_dir("h5_layout") + "/data.h5";
  h5::Handle f = h5::file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, h5::serial_file_access()));
  h5::create_group(f, "/g");
  const std::vector<unsigned char> x = rows();
  add_dataset(f, "/g/x", H5T_STD_U8LE, x.data());
  {
    h5::Handle ds = h5::dataset(H5Dopen2(f, "/g/x", H5P_DEFAULT));
    const float mean[3] = {0.5f, 1.5f, 2.5f};
    const hsize_t three = 3;
    h5::Handle space = h5::dataspace(H5Screate_simple(1, &three, nullptr));
    h5::Handle a = h5::attribute(H5Acreate2(ds, "mean", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT));
    H5DDP_CHECK_H5(H5Awrite(a, H5T_NATIVE_FLOAT, mean));
    h5::write_attr(ds, "classes", int64_t{4});
  }
  h5::Handle dcpl = h5::plist(H5Pcreate(H5P_DATASET_CREATE));
  const hsize_t chunk[3] = {2, 3, 2};
  H5DDP_CHECK_H5(H5Pset_chunk(dcpl, 3, chunk));
  const std::vector<float> y(30, 1.0f);
  add_dataset(f, "/g/chunked", H5T_IEEE_F32LE, y.data(), dcpl);
  add_dataset(f, "/g/empty", H5T_STD_U8LE, nullptr);
  const std::vector<int32_t> be(30, -2);
  h5::Handle be_type = h5::datatype(H5Tcopy(H5T_STD_I32BE));
  {
    h5::Handle space = h5::make_space(kShape);
    h5::Handle ds = h5::dataset(H5Dcreate2(f, "/g/be", be_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5DDP_CHECK_H5(H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, be.data()));
  }
  h5::write_attr(f, "num_classes", int64_t{10});
  h5::write_attr(f, "name", std::string("test"));
  f.close();
  return path;
}

TEST(H5Layout, RecognisesHdf5Files) {
  const std::string path = make_file();
  EXPECT_TRUE(is_hdf5_file(path));
  const std::string text = test::scratch_dir("h5_layout_text") + "/text.h5";
  std::ofstream(text) << "not HDF5\n";
  EXPECT_FALSE(is_hdf5_file(text));
  EXPECT_FALSE(is_hdf5_file(text + ".missing"));
  std::string why = "unset";
  EXPECT_FALSE(H5LayoutFile::open(text + ".missing", &why).has_value());
  EXPECT_NE(why, "unset");
}

TEST(H5Layout, TruncatedFileSaysWhy) {
  const std::string path = make_file();
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string cut = test::scratch_dir("h5_layout_cut") + "/cut.h5";
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, 1000);
  std::string why;
  EXPECT_FALSE(H5LayoutFile::open(cut, &why).has_value());
  EXPECT_FALSE(why.empty());  // HDF5's innermost error, e.g. "truncated file: eof = 1000, ..."
}

TEST(H5Layout, DescribesAContiguousDatasetByItsFileOffset) {
  const std::string path = make_file();
  std::optional<H5LayoutFile> f = H5LayoutFile::open(path);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->path(), path);
  EXPECT_TRUE(f->exists("/"));
  EXPECT_TRUE(f->exists("/g"));
  EXPECT_TRUE(f->exists("/g/x"));
  EXPECT_FALSE(f->exists("/h/x"));
  const std::optional<H5DatasetLayout> x = f->dataset("/g/x");
  ASSERT_TRUE(x.has_value());
  EXPECT_EQ(x->name, "/g/x");
  EXPECT_EQ(x->element_class, H5ElementClass::kInteger);
  EXPECT_EQ(x->element_bytes, 1u);
  EXPECT_EQ(x->byte_order, H5ByteOrder::kLittle);
  EXPECT_FALSE(x->is_signed);
  EXPECT_EQ(x->shape, kShape);
  EXPECT_EQ(x->bytes(), 30u);
  EXPECT_TRUE(x->contiguous);
  ASSERT_TRUE(x->offset.has_value());
  EXPECT_GT(*x->offset, 0u);
  EXPECT_TRUE(x->directly_readable());
  // The offset is where the rows are: read them back without HDF5.
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(*x->offset));
  std::vector<unsigned char> got(30);
  in.read(reinterpret_cast<char*>(got.data()), 30);
  EXPECT_EQ(got, rows());
}

TEST(H5Layout, ChunkedAndUnwrittenDatasetsAreNotDirectlyReadable) {
  std::optional<H5LayoutFile> f = H5LayoutFile::open(make_file());
  ASSERT_TRUE(f.has_value());
  const std::optional<H5DatasetLayout> chunked = f->dataset("/g/chunked");
  ASSERT_TRUE(chunked.has_value());
  EXPECT_EQ(chunked->element_class, H5ElementClass::kFloat);
  EXPECT_EQ(chunked->element_bytes, 4u);
  EXPECT_EQ(chunked->shape, kShape);
  EXPECT_FALSE(chunked->contiguous);
  EXPECT_FALSE(chunked->offset.has_value());
  EXPECT_FALSE(chunked->directly_readable());
  const std::optional<H5DatasetLayout> empty = f->dataset("/g/empty");
  ASSERT_TRUE(empty.has_value());
  EXPECT_TRUE(empty->contiguous);
  EXPECT_FALSE(empty->offset.has_value());  // nothing written, no storage
  EXPECT_FALSE(empty->directly_readable());
  const std::optional<H5DatasetLayout> be = f->dataset("/g/be");
  ASSERT_TRUE(be.has_value());
  EXPECT_EQ(be->byte_order, H5ByteOrder::kBig);
  EXPECT_TRUE(be->is_signed);
  EXPECT_FALSE(f->dataset("/g").has_value());       // a group
  EXPECT_FALSE(f->dataset("/g/nope").has_value());  // missing
  EXPECT_FALSE(f->dataset("/h/nope").has_value());  // missing group
}

TEST(H5Layout, ReadsSmallAttributes) {
  std::optional<H5LayoutFile> f = H5LayoutFile::open(make_file());
  ASSERT_TRUE(f.has_value());
  EXPECT_TRUE(f->has_attribute("/", "num_classes"));
  EXPECT_FALSE(f->has_attribute("/", "nope"));
  EXPECT_FALSE(f->has_attribute("/h/x", "mean"));
  EXPECT_EQ(f->read_int_attribute("/", "num_classes"), 10);
  EXPECT_EQ(f->read_int_attribute("/g/x", "classes"), 4);
  EXPECT_THROW(f->read_int_attribute("/", "name"), H5Error);  // a string
  EXPECT_THROW(f->read_int_attribute("/", "nope"), H5Error);
  const std::optional<H5AttributeInfo> mean = f->attribute("/g/x", "mean");
  ASSERT_TRUE(mean.has_value());
  EXPECT_EQ(mean->element_class, H5ElementClass::kFloat);
  EXPECT_EQ(mean->shape, std::vector<int64_t>{3});
  EXPECT_EQ(mean->count(), 3);
  EXPECT_EQ(f->read_float_attribute("/g/x", "mean"), (std::vector<float>{0.5f, 1.5f, 2.5f}));
  EXPECT_EQ(f->read_float_attribute("/g/x", "classes"), std::vector<float>{4.0f});  // integers convert
  const std::optional<H5AttributeInfo> name = f->attribute("/", "name");
  ASSERT_TRUE(name.has_value());
  EXPECT_EQ(name->element_class, H5ElementClass::kOther);
  EXPECT_TRUE(name->shape.empty());
  EXPECT_FALSE(f->attribute("/g/x", "std").has_value());
  try {
    f->read_float_attribute("/g/x", "std");
    FAIL() << "no error";
  } catch (const H5Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("/g/x attribute std"), std::string::npos) << w;  // names the file, object and attribute
    EXPECT_NE(w.find("data.h5"), std::string::npos) << w;
  }
}

TEST(H5Layout, MovesAndCloses) {
  const std::string path = make_file();
  std::optional<H5LayoutFile> a = H5LayoutFile::open(path);
  ASSERT_TRUE(a.has_value());
  H5LayoutFile b = std::move(*a);
  EXPECT_TRUE(b.exists("/g/x"));
  a = H5LayoutFile::open(path);
  ASSERT_TRUE(a.has_value());
  *a = std::move(b);
  EXPECT_TRUE(a->dataset("/g/x").has_value());
}

}  // namespace
