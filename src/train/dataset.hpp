// What h5ddp-train and h5ddp-ckpt eval read samples through: rows by index, normalised to float32, with
// their labels (classification) or float targets (regression). Two sources: the built-in Fashion-MNIST held
// in memory, and an HDF5 file in the layout of docs/DATA.md, from which each call reads only the rows it is
// asked for. Torch-free.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "train/data.hpp"

namespace h5ddp {

struct SampleSpec {
  std::vector<int64_t> shape;  // one sample's shape, e.g. {3, 32, 32}; token data: {T}
  bool classification = true;  // integer labels (cross-entropy, accuracy); false: float targets (MSE)
  int64_t target_width = 0;    // regression: 0 for targets [N], K for [N, K]
  int64_t num_classes = 0;     // classification: the file's num_classes attribute, 0 when it has none
  // Token data (docs/DATA.md "Token data"): x holds int64 token ids (no normalisation), all in [0, vocab_size).
  bool tokens = false;
  int64_t vocab_size = 0;
  // Per-position labels [N, T] (a language model: next-token cross-entropy over logits [B, T, V], positions
  // labelled kIgnoreLabel left out). A token stream's samples are always so.
  bool per_position = false;
  bool stream = false;                           // samples are windows of one token stream (/S/tokens)
  static constexpr int64_t kIgnoreLabel = -100;  // PyTorch's default ignore_index
  int64_t numel() const;                         // elements of one sample
  std::string shape_text() const;                // "[3, 32, 32]"
};

// Rows of a data set: x holds rows * numel floats (C order); labels or targets hold the rows' y.
struct Rows {
  std::vector<float> x;         // float samples
  std::vector<int64_t> ids;     // token data: rows * T token ids instead of x
  std::vector<int64_t> labels;  // classification: rows labels, or rows * T per-position labels
  std::vector<float> targets;   // regression: rows * max(1, target_width)
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual const SampleSpec& spec() const = 0;
  // e.g. "fashion-mnist train: 60000 samples [1, 28, 28]" or "data.h5 /train: 50000 samples [3, 32, 32] uint8"
  virtual std::string describe() const = 0;
  // The file and dataset a label came from, for errors ("data.h5 /train/y").
  virtual std::string label_source() const = 0;
  // Local; thread-safe (no HDF5 calls after opening). Fills `out` with rows `indices`, in that order. Throws
  // DataError naming the file, the dataset and the row on a read error.
  virtual void read(const std::vector<int64_t>& indices, Rows& out) const = 0;
  // Local. The smallest and largest label of rows [begin, end) (classification only; per-position labels
  // kIgnoreLabel left out), read in bounded pieces.
  virtual void label_range(int64_t begin, int64_t end, int64_t& min, int64_t& max) const = 0;
  // Local. Token data: the smallest and largest token id of rows [begin, end) (a stream's windows: every token
  // of them, so their labels too), read in bounded pieces. Others: nothing.
  virtual void token_range(int64_t /*begin*/, int64_t /*end*/, int64_t& /*min*/, int64_t& /*max*/) const {}
  // The file and dataset token ids come from, for errors ("data.h5 /train/x").
  virtual std::string token_source() const { return label_source(); }
};

// The in-memory Fashion-MNIST split as a Dataset (takes ownership). Rows are copied bit for bit.
std::unique_ptr<Dataset> images_dataset(ImageDataset images, std::string name);

// Local. Opens split "train" or "test" of an HDF5 data file (docs/DATA.md) and checks its layout: the x and y
// datasets present, of a supported type and the same length, contiguous, the mean/std attributes of the right
// shape, the file long enough. Throws DataError naming the file and the dataset. Afterwards reads are plain
// positional reads of the file (no HDF5 calls), so they may run beside an asynchronous checkpoint save.
// `context`: a token stream's window length T (> 0 overrides the stream's `context` attribute; 0 takes it).
std::unique_ptr<Dataset> open_h5_dataset(const std::string& path, const std::string& split, int64_t context = 0);

// Local. Whether `path` holds split "test" (an evaluation needs it).
bool h5_dataset_has_split(const std::string& path, const std::string& split);

// h5ddp-train's data: --data FILE.h5 (each rank later reads only the rows of its batches) or Fashion-MNIST from
// --data-dir (every rank holds the whole, small, set).
struct TrainData {
  std::unique_ptr<Dataset> train;
  std::unique_ptr<Dataset> test;  // null unless `with_test`
};
// Local. Throws DataError when the test split is missing (with_test) or its samples differ from train's.
TrainData open_train_data(const std::string& data_file, const std::string& data_dir, bool with_test,
                          int64_t context = 0);

}  // namespace h5ddp
