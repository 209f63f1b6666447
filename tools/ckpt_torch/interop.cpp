#include "interop.hpp"

#include <torch/serialize.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "h5ddp/error.hpp"
#include "h5ddp/format.hpp"
#include "h5ddp/torch_state.hpp"
#include "safetensors.hpp"
#include "torch_pickle.hpp"
#include "train/batch.hpp"
#include "train/data.hpp"
#include "train/dataset.hpp"
#include "train/models.hpp"

namespace h5ddp::interop {
namespace {

namespace fs = std::filesystem;
using c10::IValue;
using GenericDict = c10::impl::GenericDict;

GenericDict str_dict() {
  return GenericDict(c10::StringType::get(), c10::AnyType::get());
}

std::string shape_string(c10::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

torch::Tensor allocate(const std::string& path, const TensorInfo& t) {
  return with_context("reading " + path + " (dataset of '" + t.name + "')",
                      [&] { return torch::empty(t.shape, torch::dtype(to_scalar_type(t.dtype))); });
}

// Hyperparameters PyTorch keeps as bool (h5ddp stores every hyperparameter as float64).
bool is_bool_hyper(const std::string& k) {
  static const std::set<std::string> kBools = {"amsgrad",        "nesterov", "maximize", "capturable",
                                               "differentiable", "fused",    "foreach"};
  return kBools.count(k) > 0;
}

// torch.optim's state_dict layout, keyed by parameter name instead of position: load_state_dict matches
// saved ids to the current parameters by their order in param_groups, so names work as ids.
IValue optimizer_state_dict(const LoadedCheckpoint& ck) {
  GenericDict state = str_dict();
  std::map<std::string, GenericDict> per_param;
  std::vector<std::string> order;
  for (const auto& [entry, t] : ck.optimizer) {
    const auto slash = entry.rfind('/');
    const std::string param = entry.substr(0, slash), key = entry.substr(slash + 1);
    auto it = per_param.find(param);
    if (it == per_param.end()) {
      it = per_param.emplace(param, str_dict()).first;
      order.push_back(param);
    }
    // torch.optim.Adam(W) keeps `step` as a float32 0-d tensor; h5ddp stores LibTorch's int64 counter.
    const bool adam_step = key == "step" && ck.manifest.optimizer_type != "sgd";
    it->second.insert(key, adam_step ? t.to(torch::kFloat32) : t);
  }
  for (const auto& p : order) state.insert(p, per_param.at(p));

  c10::impl::GenericList groups(c10::AnyType::get());
  for (const auto& g : ck.state.optimizer.groups) {
    GenericDict d = str_dict();
    for (const auto& [k, v] : g.hyper) {
      if (k == "betas0" || k == "betas1") continue;
      if (is_bool_hyper(k))
        d.insert(k, v != 0.0);
      else
        d.insert(k, v);
    }
    if (g.hyper.count("betas0") && g.hyper.count("betas1"))
      d.insert("betas", c10::ivalue::Tuple::create({IValue(g.hyper.at("betas0")), IValue(g.hyper.at("betas1"))}));
    c10::List<std::string> params;
    for (const auto& n : g.params) params.push_back(n);
    d.insert("params", params);
    groups.push_back(d);
  }
  GenericDict out = str_dict();
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

void write_file_atomically(const std::string& path, const std::vector<char>& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw CheckpointError("cannot create " + tmp);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw CheckpointError("cannot write " + tmp + " (disk full?)");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw CheckpointError("cannot rename " + tmp + " to " + path + ": " + ec.message());
}

// The state dict inside a torch.save'd object: the object itself, or its "model" / "state_dict" entry.
const PyValue& find_state_dict(const std::string& path, const PyValue& top) {
  if (top.kind != PyValue::Kind::kDict)
    throw CheckpointError(path + ": holds a " + top.type_name() + ", not a state dict (a dict of tensors)");
  for (const char* key : {"model", "state_dict"}) {
    const PyValue* inner = top.get(key);
    if (inner && inner->kind == PyValue::Kind::kDict) return *inner;
  }
  return top;
}

std::shared_ptr<Model> make_builtin(const std::string& name, const std::vector<int64_t>& mlp_hidden) {
  ModelSpec spec;
  spec.name = name;
  spec.mlp_hidden = mlp_hidden;
  return make_model(spec);
}

// Every parameter and buffer of `m`, by state-dict key.
std::map<std::string, torch::Tensor> named_tensors(torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value();
  for (const auto& b : m.named_buffers()) out[b.key()] = b.value();
  return out;
}

// One message listing every key or shape that differs between `have` and the model's tensors.
void check_against_model(const std::string& what, const std::string& model_name,
                         const std::vector<std::pair<std::string, torch::Tensor>>& have,
                         const std::map<std::string, torch::Tensor>& want) {
  std::vector<std::string> problems;
  std::set<std::string> seen;
  for (const auto& [k, t] : have) {
    seen.insert(k);
    auto it = want.find(k);
    if (it == want.end())
      problems.push_back("unexpected key '" + k + "'");
    else if (it->second.sizes() != t.sizes())
      problems.push_back("'" + k + "' has shape " + shape_string(t.sizes()) + ", the model's is " +
                         shape_string(it->second.sizes()));
  }
  for (const auto& [k, t] : want)
    if (!seen.count(k)) problems.push_back("missing key '" + k + "'");
  if (problems.empty()) return;
  std::string msg = what + " does not match the built-in model '" + model_name + "':";
  for (const auto& p : problems) msg += "\n  " + p;
  throw CheckpointError(msg);
}

}  // namespace

LoadedCheckpoint load_checkpoint_tensors(MpiComm& comm, const std::string& path) {
  LoadedCheckpoint ck;
  // One open: the manifest the load reads says what to allocate.
  load_checkpoint(comm, path, [&](const CheckpointManifest& manifest) -> TrainState& {
    ck.manifest = manifest;
    for (const auto& t : ck.manifest.model) {
      torch::Tensor x = allocate(path, t);
      ck.model.emplace_back(t.name, x);
      ck.state.model.push_back(TensorRef{t.name, t.dtype, t.shape, x.data_ptr()});
    }
    for (const auto& t : ck.manifest.optimizer_state) {
      torch::Tensor x = allocate(path, t);
      ck.optimizer.emplace_back(t.name, x);
      ck.state.optimizer.state.push_back(TensorRef{t.name, t.dtype, t.shape, x.data_ptr()});
    }
    for (const auto& t : ck.manifest.user) {
      torch::Tensor x = allocate(path, t);
      ck.user.emplace_back(t.name, x);
      ck.state.user.push_back(TensorRef{t.name, t.dtype, t.shape, x.data_ptr()});
    }
    return ck.state;
  });
  return ck;
}

size_t export_checkpoint(MpiComm& comm, const ExportOptions& o) {
  const LoadedCheckpoint ck = load_checkpoint_tensors(comm, o.input);
  if (o.format == "safetensors") {
    agreed(comm, [&] {
      if (comm.rank() != 0) return;
      with_context("writing " + o.output, [&] {
        std::vector<std::pair<std::string, torch::Tensor>> named;
        for (const auto& [k, t] : ck.model) named.emplace_back(o.add_prefix + k, t);
        std::map<std::string, std::string> metadata{
            {"format", "pt"}, {"source", o.input}, {"step", std::to_string(ck.state.counters.step)}};
        for (const auto& [k, v] : ck.state.meta) metadata.emplace("h5ddp." + k, v);
        write_file_atomically(o.output, safetensors_bytes(named, metadata));
      });
    });
    return ck.model.size();
  }
  agreed(comm, [&] {
    if (comm.rank() != 0) return;
    with_context("writing " + o.output, [&] {
      GenericDict model = str_dict();
      for (const auto& [k, t] : ck.model) model.insert(o.add_prefix + k, t);

      GenericDict scheduler = str_dict();
      scheduler.insert("type", ck.state.scheduler.type);
      for (const auto& [k, v] : ck.state.scheduler.values) scheduler.insert(k, v);

      GenericDict data = str_dict();
      data.insert("seed", static_cast<int64_t>(ck.state.data.seed));
      data.insert("epoch", ck.state.data.epoch);
      data.insert("position", ck.state.data.position);
      data.insert("global_batch", ck.state.data.global_batch);

      GenericDict meta = str_dict();
      for (const auto& [k, v] : ck.state.meta) meta.insert(k, v);

      GenericDict facts = str_dict();
      facts.insert("source", o.input);
      facts.insert("format_version", static_cast<int64_t>(ck.manifest.format_version));
      facts.insert("world_size", static_cast<int64_t>(ck.manifest.world_size));
      facts.insert("h5ddp_version", ck.manifest.h5ddp_version);
      facts.insert("torch_version", ck.manifest.torch_version);
      facts.insert("created", ck.manifest.created);

      GenericDict root = str_dict();
      root.insert("model", model);
      root.insert("optimizer", optimizer_state_dict(ck));
      root.insert("optimizer_type", ck.manifest.optimizer_type);
      root.insert("step", ck.state.counters.step);
      root.insert("epoch", ck.state.counters.epoch);
      root.insert("samples_consumed", ck.state.counters.samples_consumed);
      root.insert("lr_scheduler", scheduler);
      root.insert("data", data);
      if (ck.manifest.rng_cpu_bytes > 0) {  // row r: rank r's torch.get_rng_state()-compatible bytes
        auto rng = torch::empty(
            {static_cast<int64_t>(ck.state.rng_by_rank.size()), static_cast<int64_t>(ck.manifest.rng_cpu_bytes)},
            torch::kUInt8);
        for (size_t r = 0; r < ck.state.rng_by_rank.size(); ++r)
          std::memcpy(rng[static_cast<int64_t>(r)].data_ptr(), ck.state.rng_by_rank[r].cpu.data(),
                      ck.manifest.rng_cpu_bytes);
        root.insert("rng_cpu", rng);
      }
      if (!ck.user.empty()) {  // the tracked state of a Checkpointer user (an EMA copy, a counter)
        GenericDict user = str_dict();
        for (const auto& [k, t] : ck.user) user.insert(k, t);
        root.insert("user", user);
      }
      root.insert("meta", meta);
      root.insert("h5ddp", facts);
      write_file_atomically(o.output, torch::pickle_save(root));
    });
  });
  return ck.model.size();
}

size_t import_state_dict(MpiComm& comm, const ImportOptions& o) {
  const fs::path out(o.output);
  const std::string ext = format::kCheckpointSuffix;
  agreed(comm, [&] {
    if (out.filename().string().size() <= ext.size() || out.extension() != ext)
      throw ConfigError("--to " + o.output + ": the checkpoint file name must end in " + ext);
    if (!o.force && fs::exists(out)) throw ConfigError(o.output + " exists (pass --force to overwrite)");
  });

  // Every rank reads the (small, local) input itself: no broadcast of tensors needed.
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  agreed(comm, [&] {
    const TorchSaveFile file = read_torch_save(o.input);
    const PyValue& sd = find_state_dict(o.input, file.pickle.root());
    std::set<std::string> keys;
    const std::string prefix = "module.";
    for (const auto& [k, v] : sd.dict) {
      if (k->kind != PyValue::Kind::kStr)
        throw CheckpointError(o.input + ": state dict has a key of type " + k->type_name() + ", expected str");
      if (v->kind != PyValue::Kind::kTensor)
        throw CheckpointError(o.input + ": state dict entry '" + printable(k->s) + "' is a " + v->type_name() +
                              ", not a tensor");
      std::string key = k->s.rfind(prefix, 0) == 0 ? k->s.substr(prefix.size()) : k->s;
      if (!keys.insert(key).second)
        throw CheckpointError(o.input + ": key '" + printable(key) + "' appears twice (with and without 'module.')");
      with_context(o.input + ": state dict key '" + printable(k->s) + "'", [&] {
        (void)format::model_dataset(key);  // refuses keys the format cannot store
        (void)to_dtype(file.tensor(*v).scalar_type());
      });
      tensors.emplace_back(key, file.tensor(*v));
    }
    if (tensors.empty()) throw CheckpointError(o.input + ": the state dict holds no tensors");
    if (!o.model.empty()) {
      auto m = make_builtin(o.model, o.mlp_hidden);
      check_against_model(o.input, o.model, tensors, named_tensors(*m));
    }
  });

  TrainState st;
  for (auto& [k, t] : tensors)
    st.model.push_back(TensorRef{k, to_dtype(t.scalar_type()), t.sizes().vec(), t.data_ptr()});
  st.meta["source"] = "h5ddp-ckpt import " + fs::path(o.input).filename().string();
  st.meta["torch_version"] = TORCH_VERSION;
  if (!o.model.empty()) st.meta["model"] = o.model;
  SaveOptions so;
  so.name = out.filename().string();
  so.update_latest = false;  // a file the user named, not a run directory's newest checkpoint
  so.retention.keep_last = 0;
  so.retention.keep_every = 0;
  const std::string dir = out.has_parent_path() ? out.parent_path().string() : ".";
  save_checkpoint(comm, st, dir, so);
  return tensors.size();
}

EvalResult evaluate_checkpoint(MpiComm& comm, const EvalOptions& given) {
  LoadedCheckpoint ck = load_checkpoint_tensors(comm, given.input);
  EvalResult r;
  const auto meta = [&ck](const char* key) {
    auto it = ck.state.meta.find(key);
    return it == ck.state.meta.end() ? std::string() : it->second;
  };
  EvalOptions o = given;
  const bool recorded_data = o.data_file.empty() && !o.data_dir_given && !meta("data_file").empty();
  if (recorded_data) {  // the data set the run trained on (h5ddp-train --data), as recorded in /meta
    o.data_file = meta("data_file");
    if (o.split == "t10k") o.split = "test";
  }
  r.data = o.data_file.empty()
               ? "Fashion-MNIST " + o.split
               : o.data_file + " /" + o.split + (recorded_data ? " (the run's --data, /meta data_file)" : "");
  ModelSpec spec;
  spec.file = !o.model_file.empty() ? o.model_file : (o.model.empty() ? meta("model_file") : "");
  r.model = !spec.file.empty() ? "torchscript " + spec.file : !o.model.empty() ? o.model : meta("model");
  TrainModel model;
  std::unique_ptr<Dataset> data;
  agreed(comm, [&] {
    if (r.model.empty())
      throw CheckpointError(o.input + ": /meta names no model (pass --model cnn|mlp or --model-file)");
    if (spec.file.empty()) {
      spec.name = r.model;
      if (auto w = meta("mlp_hidden"); !w.empty()) {
        spec.mlp_hidden.clear();
        std::stringstream ss(w);
        for (std::string x; std::getline(ss, x, ',');) spec.mlp_hidden.push_back(std::stoll(x));
      }
    }
    model = build_train_model(spec);
    auto dst = named_tensors(*model.module);
    check_against_model(o.input, r.model, ck.model, dst);
    torch::NoGradGuard no_grad;
    for (const auto& [k, t] : ck.model) dst.at(k).copy_(t);
    if (recorded_data && !std::filesystem::exists(o.data_file))
      throw ConfigError(o.input + " was trained on --data " + o.data_file +
                        " (its /meta data_file), which is not there from this directory: pass --data FILE.h5");
    data = o.data_file.empty() ? images_dataset(read_fashion_mnist(o.data_dir, o.split), o.split)
                               : open_h5_dataset(o.data_file, o.split);
  });

  const int64_t begin = std::clamp<int64_t>(o.first, 0, data->size());
  const int64_t end = o.count < 0 ? data->size() : std::clamp<int64_t>(o.first + o.count, begin, data->size());
  r.images = end - begin;
  if (r.images == 0) return r;
  model.module->eval();
  ScoreSums s;
  try {
    s = score_rows(model.forward, *data, begin, end);  // rows a forward as training's evaluation
  } catch (const Error& e) {
    if (!o.data_file.empty() || spec.file.empty()) throw;
    throw ConfigError(o.input + ": its model (" + r.model + ") does not take Fashion-MNIST images: " + e.what() +
                      "\n  a --model-file model trained on --data scores on that data: h5ddp-ckpt eval " + o.input +
                      " --data FILE.h5 (checkpoints written since /meta data_file exists find it themselves)");
  }
  r.loss = s.loss / s.rows;
  r.accuracy = data->spec().classification ? s.correct / s.rows : -1;
  if (data->spec().per_position) {
    r.positions = static_cast<int64_t>(s.rows);
    r.perplexity = std::exp(r.loss);
  }
  return r;
}

}  // namespace h5ddp::interop
