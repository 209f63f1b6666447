// h5ddp checkpoints <-> PyTorch: the work behind `h5ddp-ckpt export|import|eval` (run by h5ddp-ckpt-torch,
// the one h5ddp-ckpt tool that links LibTorch).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "h5ddp/checkpoint.hpp"
#include "h5ddp/mpi_comm.hpp"
#include "train/data.hpp"

namespace h5ddp::interop {

// A checkpoint read into LibTorch tensors that own their memory (CPU, contiguous).
struct LoadedCheckpoint {
  CheckpointManifest manifest;
  TrainState state;  // counters, data, scheduler, optimizer groups, rng rows, meta (refs point into below)
  std::vector<std::pair<std::string, torch::Tensor>> model;      // state-dict key -> tensor, file order
  std::vector<std::pair<std::string, torch::Tensor>> optimizer;  // "<param>/<key>" -> tensor, file order
  std::vector<std::pair<std::string, torch::Tensor>> user;       // /user/<name> (Checkpointer::track)
};

// Collective. Reads every tensor of `path` (checksums verified) through the checkpoint layer. Throws
// CheckpointError naming the file for a non-HDF5 file, a non-h5ddp file or an unsupported version.
LoadedCheckpoint load_checkpoint_tensors(MpiComm& comm, const std::string& path);

struct ExportOptions {
  std::string input;          // h5ddp checkpoint
  std::string output;         // .pt file
  std::string add_prefix;     // prepended to every model key (e.g. "module.")
  std::string format = "pt";  // pt | safetensors (the model's weights only)
};

// Collective (rank 0 writes). Writes a torch.load-able dict: model, optimizer (a state dict that
// torch.optim's load_state_dict accepts: state and param_groups keyed by parameter name), optimizer_type,
// step, epoch, samples_consumed, lr_scheduler, data, rng_cpu, meta, h5ddp (file facts). Returns the key count.
// format "safetensors": the model's weights only, named as the state dict (with add_prefix), in their dtypes;
// __metadata__ carries format "pt", the source file, its step and the model's /meta entries.
size_t export_checkpoint(MpiComm& comm, const ExportOptions& options);

struct ImportOptions {
  std::string input;   // torch.save file
  std::string output;  // h5ddp checkpoint to create
  std::string model;   // "" or a built-in model name ("cnn", "mlp"): check keys and shapes against it
  std::vector<int64_t> mlp_hidden = {1024, 1024};  // for model "mlp"
  bool force = false;                              // overwrite an existing output
};

// Collective. Reads a torch.save'd state dict (plain, or the "model" / "state_dict" entry of a dict;
// "module." prefixes stripped) and writes it as a step-0, model-only h5ddp checkpoint. Returns the
// number of tensors. Throws CheckpointError naming the input for anything that is not such a state dict.
size_t import_state_dict(MpiComm& comm, const ImportOptions& options);

struct EvalOptions {
  std::string input;  // h5ddp checkpoint
  std::string data_dir = kDefaultFashionMnistDir;
  bool data_dir_given = false;  // --data-dir: Fashion-MNIST even where the checkpoint records a --data file
  std::string data_file;        // an HDF5 data set (docs/DATA.md) instead of Fashion-MNIST; "" = the checkpoint's
                                // /meta data_file when it records one (and no data_dir was given)
  std::string split = "t10k";   // Fashion-MNIST: "t10k" | "train"; --data: "test" | "train"
  int64_t first = 0;            // first sample
  int64_t count = -1;           // number of samples (clipped to the split; -1: to the end of the split)
  std::string model;            // "" = the model named in the checkpoint's /meta
  std::string model_file;       // a TorchScript module; "" = the checkpoint's model_file when it names one
};

struct EvalResult {
  std::string model;
  std::string data;  // what was scored: "Fashion-MNIST t10k" or the HDF5 file and split
  int64_t images = 0;
  double loss = 0;         // mean cross-entropy (regression: MSE), eval mode (no dropout), float32 forward
  double accuracy = -1;    // fraction classified correctly (-1: regression); per position: of the positions
  int64_t positions = 0;   // per-position labels (a language model): positions scored (label not -100)
  double perplexity = -1;  // per-position labels: exp(loss)
};

// Collective (every rank computes the same numbers). Builds the built-in model the checkpoint names (or loads
// the TorchScript module), loads the checkpoint's weights and evaluates samples [first, first + count).
EvalResult evaluate_checkpoint(MpiComm& comm, const EvalOptions& options);

}  // namespace h5ddp::interop
