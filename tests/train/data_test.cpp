// The IDX reader against the real Fashion-MNIST files and against damaged copies of them.
#include "train/data.hpp"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <fstream>

#include "h5ddp/error.hpp"
#include "h5ddp_test/test_util.hpp"

namespace h5ddp {
namespace {

const std::string kDir = kDefaultFashionMnistDir;

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void write_all(const std::string& path, const char* data, size_t n) {
  std::ofstream out(path, std::ios::binary);
  out.write(data, static_cast<std::streamsize>(n));
}

// Expects DataError whose message names `path`.
template <class F>
void expect_data_error(F&& f, const std::string& path, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "no DataError for " << path;
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Data, ReadsFashionMnistTrainAndTest) {
  const ImageDataset train = read_fashion_mnist(kDir, "train");
  EXPECT_EQ(train.count, 60000);
  EXPECT_EQ(train.rows, 28);
  EXPECT_EQ(train.cols, 28);
  const std::vector<float> images = train.images();
  ASSERT_EQ(images.size(), size_t(60000) * 784);
  ASSERT_EQ(train.labels.size(), size_t(60000));
  // Fashion-MNIST is balanced: 6000 images per class.
  std::vector<int> per_class(10, 0);
  for (int64_t l : train.labels) per_class.at(l)++;
  for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[c], 6000) << "class " << c;
  // Normalised with the training set's own statistics: mean ~0, std ~1.
  double sum = 0, sq = 0;
  for (float v : images) {
    sum += v;
    sq += double(v) * v;
  }
  const double n = double(images.size()), mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sq / n - mean * mean), 1.0, 0.01);
  // A zero byte maps to -mean/std, the minimum.
  EXPECT_FLOAT_EQ(*std::min_element(images.begin(), images.end()), -0.2860f / 0.3530f);

  const ImageDataset test = read_fashion_mnist(kDir, "t10k");
  EXPECT_EQ(test.count, 10000);
}

TEST(Data, TruncatedGzipIsADataErrorNamingTheFile) {
  const std::string dir = test::scratch_dir("data");
  const auto bytes = read_all(kDir + "/train-images-idx3-ubyte.gz");
  ASSERT_GT(bytes.size(), 100000u);
  const std::string cut = dir + "/cut-images.gz";
  write_all(cut, bytes.data(), bytes.size() / 2);
  expect_data_error([&] { read_idx_dataset(cut, kDir + "/train-labels-idx1-ubyte.gz"); }, cut, "");
}

TEST(Data, CorruptGzipIsADataError) {
  const std::string dir = test::scratch_dir("data");
  auto bytes = read_all(kDir + "/t10k-labels-idx1-ubyte.gz");
  for (size_t i = 20; i < bytes.size(); i += 7) bytes[i] = char(bytes[i] ^ 0x5a);  // damage the deflate stream
  const std::string bad = dir + "/bad-labels.gz";
  write_all(bad, bytes.data(), bytes.size());
  expect_data_error([&] { read_idx_dataset(kDir + "/t10k-images-idx3-ubyte.gz", bad); }, bad, "");
}

// gzip-compresses `data` (zlib's gzip wrapper: header, deflate, CRC-32 and length trailer).
std::vector<char> gzip(const std::vector<char>& data) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::vector<char> out(deflateBound(&z, data.size()) + 64);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// A gzip stream that inflates to more than the header's counts need: the reader used to stop after the
// pixels it wanted and train on the file without ever reaching gzip's CRC check (issue 23, finding 1).
TEST(Data, GzipLongerThanItsHeaderIsRefused) {
  const std::string dir = test::scratch_dir("data");
  const std::vector<char> images = {0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 2, 0, 127, 0, 127};
  const std::vector<char> labels = {0, 0, 8, 1, 0, 0, 0, 1, 7};
  const std::string img = dir + "/img.gz", lab = dir + "/lab.gz";
  auto gz = gzip(images);
  write_all(img, gz.data(), gz.size());
  gz = gzip(labels);
  write_all(lab, gz.data(), gz.size());
  EXPECT_NO_THROW(read_idx_dataset(img, lab));

  std::vector<char> longer = images;
  longer.insert(longer.end(), {1, 2, 3});
  gz = gzip(longer);
  write_all(img, gz.data(), gz.size());
  expect_data_error([&] { read_idx_dataset(img, lab); }, img, "3 bytes follow the 1 images");

  std::vector<char> more_labels = labels;
  more_labels.push_back(3);
  gz = gzip(images);
  write_all(img, gz.data(), gz.size());
  gz = gzip(more_labels);
  write_all(lab, gz.data(), gz.size());
  expect_data_error([&] { read_idx_dataset(img, lab); }, lab, "1 bytes follow the 1 labels");
}

// The CRC-32 or the length in gzip's trailer does not match the inflated bytes; or the trailer is missing.
TEST(Data, GzipWhoseCheckFailsIsRefused) {
  const std::string dir = test::scratch_dir("data");
  const std::vector<char> images = {0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 2, 0, 127, 0, 127};
  const std::vector<char> labels = {0, 0, 8, 1, 0, 0, 0, 1, 7};
  const std::string img = dir + "/img.gz", lab = dir + "/lab.gz";
  const auto gz_labels = gzip(labels);
  write_all(lab, gz_labels.data(), gz_labels.size());
  const auto good = gzip(images);
  for (size_t back : {8u, 4u}) {  // a byte of the CRC-32, a byte of the length
    auto bad = good;
    bad[bad.size() - back] = char(bad[bad.size() - back] ^ 0x01);
    write_all(img, bad.data(), bad.size());
    expect_data_error([&] { read_idx_dataset(img, lab); }, img, "corrupt data file");
  }
  write_all(img, good.data(), good.size() - 8);  // no trailer at all
  expect_data_error([&] { read_idx_dataset(img, lab); }, img, "truncated data file");
  // The real files pass (their CRCs are right).
  EXPECT_NO_THROW(read_idx_dataset(kDir + "/t10k-images-idx3-ubyte.gz", kDir + "/t10k-labels-idx1-ubyte.gz"));
}

TEST(Data, WrongMagicAndMismatchedCounts) {
  const std::string dir = test::scratch_dir("data");
  // Plain (not gzipped) IDX files: gzread reads them transparently.
  const unsigned char labels_as_images[] = {0, 0, 8, 1, 0, 0, 0, 2, 3, 4};
  const std::string wrong = dir + "/wrong-magic";
  write_all(wrong, reinterpret_cast<const char*>(labels_as_images), sizeof labels_as_images);
  expect_data_error([&] { read_idx_dataset(wrong, wrong); }, wrong, "magic");

  const unsigned char images[] = {0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 2, 0, 255, 0, 255};
  const unsigned char labels3[] = {0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 3};
  const std::string img = dir + "/img", lab = dir + "/lab";
  write_all(img, reinterpret_cast<const char*>(images), sizeof images);
  write_all(lab, reinterpret_cast<const char*>(labels3), sizeof labels3);
  expect_data_error([&] { read_idx_dataset(img, lab); }, lab, "3 labels");

  const unsigned char label_bad[] = {0, 0, 8, 1, 0, 0, 0, 1, 10};
  write_all(lab, reinterpret_cast<const char*>(label_bad), sizeof label_bad);
  expect_data_error([&] { read_idx_dataset(img, lab); }, lab, "out of range");

  const unsigned char label_ok[] = {0, 0, 8, 1, 0, 0, 0, 1, 7};
  write_all(lab, reinterpret_cast<const char*>(label_ok), sizeof label_ok);
  const ImageDataset ds = read_idx_dataset(img, lab, Normalization{0.0f, 1.0f});
  EXPECT_EQ(ds.count, 1);
  EXPECT_EQ(ds.labels.at(0), 7);
  EXPECT_EQ(ds.images(), (std::vector<float>{0.0f, 1.0f, 0.0f, 1.0f}));
}

TEST(Data, MissingFilesAndDirectory) {
  expect_data_error([] { read_fashion_mnist("/nonexistent-h5ddp", "train"); }, "/nonexistent-h5ddp", "not found");
  expect_data_error([] { check_fashion_mnist_dir("/nonexistent-h5ddp"); }, "/nonexistent-h5ddp", "not found");
  const std::string dir = test::scratch_dir("data");
  expect_data_error([&] { check_fashion_mnist_dir(dir); }, dir + "/train-images-idx3-ubyte.gz", "not found");
  EXPECT_NO_THROW(check_fashion_mnist_dir(kDir));
}

}  // namespace
}  // namespace h5ddp
