// docs/FORMAT.md's rules over a file's facts and values (pure): the one definition of validity that
// h5ddp-ckpt verify, load_checkpoint and save_checkpoint share.
#include "checkpoint/rules.hpp"

#include <cmath>
#include <set>

#include "h5ddp/format.hpp"

namespace h5ddp::ckpt {

std::string ObjectFact::dtype() const {
  auto it = attrs.find(format::kAttrDtype);
  return it == attrs.end() || it->second.kind != AttrFact::Kind::kString ? std::string() : it->second.text;
}

const ObjectFact* FileFacts::find(const std::string& object_path) const {
  auto it = objects.find(object_path);
  return it == objects.end() ? nullptr : &it->second;
}

std::vector<std::string> FileFacts::children(const std::string& group) const {
  std::vector<std::string> out;
  const std::string prefix = group + "/";
  for (auto it = objects.lower_bound(prefix); it != objects.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    const std::string rest = it->first.substr(prefix.size());
    if (rest.find('/') == std::string::npos) out.push_back(rest);
  }
  return out;
}

namespace {

using AK = AttrFact::Kind;

const char* kind_name(AK k) {
  switch (k) {
    case AK::kString:
      return "string";
    case AK::kInt64:
      return "int64";
    case AK::kUint64:
      return "uint64";
    case AK::kFloat64:
      return "float64";
    case AK::kOther:
      break;
  }
  return "another type";
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string parent_of(const std::string& p) {
  const auto slash = p.rfind('/');
  return slash == 0 ? "/" : p.substr(0, slash);
}
std::string leaf_of(const std::string& p) {
  return p.substr(p.rfind('/') + 1);
}
std::string attr_path(const std::string& object, const std::string& attr) {
  return (object == "/" ? "/" : object) + "@" + attr;
}

// Hyperparameters of each optimizer type (FORMAT.md "Optimizers").
const std::vector<std::string>& hyper_keys(const std::string& type) {
  static const std::vector<std::string> sgd = {"lr", "momentum", "dampening", "weight_decay", "nesterov"};
  static const std::vector<std::string> adam = {"lr", "betas0", "betas1", "eps", "weight_decay", "amsgrad"};
  static const std::vector<std::string> none;
  return type == "sgd" ? sgd : (type == "adam" || type == "adamw") ? adam : none;
}

// Required attributes of each schedule type (FORMAT.md "Schedules"); false for a type the table does not list.
bool schedule_requires(const std::string& type, std::vector<std::string>* keys) {
  if (type == "none" || type.empty()) return true;
  if (type == "constant") return *keys = {"base_lr"}, true;
  if (type == "step") return *keys = {"base_lr", "step_size", "gamma"}, true;
  if (type == "cosine") return *keys = {"base_lr", "total_steps"}, true;
  return false;
}

// Collects problems, or notes for what a newer revision may add (R14 with F > R).
struct Report {
  const FileFacts& facts;
  std::vector<std::string>& problems;
  std::vector<std::string>* notes;
  bool newer = false;  // the file's revision is newer than this reader's

  void problem(const std::string& text) { problems.push_back(facts.path + ": " + text); }
  void unknown(const std::string& what) {
    if (!newer)
      problem("R14: " + what + " is not in docs/FORMAT.md's layout");
    else if (notes)
      notes->push_back(facts.path + ": " + what + " is unknown to this reader (revision " +
                       std::to_string(kFormatMinorVersion) + "), ignored");
  }
};

// R18 and R19 for an attribute this reader knows: a scalar dataspace, a string's bytes valid UTF-8. Reports and
// returns false otherwise.
bool value_ok(Report& r, const std::string& where, const AttrFact& a) {
  if (!a.scalar) {
    r.problem("R18: " + where + " is a one-element array, docs/FORMAT.md requires a scalar attribute");
    return false;
  }
  if (a.kind == AK::kString && !valid_utf8(a.text)) {
    r.problem("R19: " + where + " is not valid UTF-8");
    return false;
  }
  return true;
}

// An attribute that must exist with one kind. Returns it, or null after reporting.
const AttrFact* require_attr(Report& r, const std::string& object, const ObjectFact& o, const std::string& name,
                             AK kind) {
  auto it = o.attrs.find(name);
  if (it == o.attrs.end()) {
    r.problem("missing required attribute " + attr_path(object, name));
    return nullptr;
  }
  if (it->second.kind != kind) {
    r.problem(attr_path(object, name) + " has type " + kind_name(it->second.kind) + ", docs/FORMAT.md requires " +
              kind_name(kind));
    return nullptr;
  }
  return value_ok(r, attr_path(object, name), it->second) ? &it->second : nullptr;
}

// The attributes of `o` outside `allowed` (R14).
void extra_attrs(Report& r, const std::string& object, const ObjectFact& o, const std::set<std::string>& allowed) {
  for (const auto& [name, a] : o.attrs)
    if (!allowed.count(name)) r.unknown("attribute " + attr_path(object, name));
}

void check_root(Report& r, const ObjectFact& root) {
  require_attr(r, "/", root, format::kAttrFormat, AK::kString);
  require_attr(r, "/", root, format::kAttrFormatVersion, AK::kInt64);
  for (const char* s : {format::kAttrH5ddpVersion, format::kAttrTorchVersion, format::kAttrCreated})
    require_attr(r, "/", root, s, AK::kString);
  if (const AttrFact* w = require_attr(r, "/", root, format::kAttrWorldSize, AK::kInt64); w && w->i < 1)
    r.problem("R3: /@world_size is " + std::to_string(w->i) + ", must be >= 1");
  const AttrFact* step = require_attr(r, "/", root, format::kAttrStep, AK::kInt64);
  if (step) {  // R2: the step a file's name carries
    const int64_t named = format::checkpoint_step_from_name(leaf_of(r.facts.path));
    if (named >= 0 && named != step->i)
      r.problem("R2: /@step is " + std::to_string(step->i) + " but the file is named for step " +
                std::to_string(named));
  }
  extra_attrs(
      r, "/", root,
      {format::kAttrFormat, format::kAttrFormatVersion, format::kAttrFormatMinorVersion, format::kAttrH5ddpVersion,
       format::kAttrTorchVersion, format::kAttrCreated, format::kAttrWorldSize, format::kAttrStep});
}

bool is_index(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos && (s == "0" || s[0] != '0');
}

bool tensor_dtype_known(const std::string& name) {
  static const std::set<std::string> names = {"float32", "float64", "float16", "bfloat16", "int64", "int32",
                                              "int16",   "int8",    "uint8",   "uint64",   "bool"};
  return names.count(name) > 0;
}

// The attributes, dtype and HDF5 type of a dataset at a known place (R13, R14, R17). `want`: the dtype its place
// requires ("" = any tensor dtype).
void check_dataset(Report& r, const std::string& p, const ObjectFact& o, const std::string& want) {
  const AttrFact* dtype = require_attr(r, p, o, format::kAttrDtype, AK::kString);
  require_attr(r, p, o, format::kAttrChecksum, AK::kUint64);
  extra_attrs(r, p, o, {format::kAttrDtype, format::kAttrChecksum});
  if (!dtype) return;
  const std::string& d = dtype->text;
  if (want == "string") {
    if (d != "string" || !o.type_matches || o.shape.size() != 1)
      r.problem("R17: " + p + " must be a 1-D dataset of fixed-length NUL-padded strings (dtype string), is " + d +
                " " + shape_text(o.shape));
    return;
  }
  if (!tensor_dtype_known(d))
    r.problem("R13: " + p + " has dtype '" + d + "', not one of docs/FORMAT.md's tensor dtypes");
  else if (!o.type_matches)
    r.problem("R13: " + p + " has an HDF5 type that is not the one its dtype " + d + " names");
  else if (!want.empty() && d != want)
    r.problem(p + " has type " + d + ", docs/FORMAT.md requires " + want);
}

const ObjectFact* require_object(Report& r, const std::string& p, ObjectFact::Kind kind) {
  const ObjectFact* o = r.facts.find(p);
  const char* what = kind == ObjectFact::Kind::kGroup ? "group" : "dataset";
  if (!o) {
    r.problem("missing required " + std::string(what) + " " + p);
    return nullptr;
  }
  if (o->kind != kind) {
    r.problem(p + " is not a " + what);
    return nullptr;
  }
  return o;
}

// The fixed scalar datasets and their dtypes.
const std::vector<std::pair<const char*, const char*>>& fixed_scalars() {
  static const std::vector<std::pair<const char*, const char*>> s = {
      {format::kTrainStep, "int64"},      {format::kTrainEpoch, "int64"}, {format::kTrainSamplesConsumed, "int64"},
      {format::kDataSeed, "uint64"},      {format::kDataEpoch, "int64"},  {format::kDataPosition, "int64"},
      {format::kDataGlobalBatch, "int64"}};
  return s;
}

const std::set<std::string>& fixed_groups() {
  static const std::set<std::string> g = {
      format::kModelGroup, format::kOptimizerGroup, format::kParamGroupsGroup, format::kOptimizerStateGroup,
      format::kTrainGroup, format::kSchedulerGroup, format::kDataGroup,        format::kRngGroup,
      format::kMetaGroup,  format::kUserGroup};
  return g;
}

// Where `p` may stand in the layout: "group", "tensor", "state", "params", a fixed dtype, or "" (unknown).
std::string place_of(const std::string& p) {
  if (fixed_groups().count(p)) return "group";
  for (const auto& [path, dtype] : fixed_scalars())
    if (p == path) return std::string("scalar ") + dtype;
  if (p == format::kRngCpu || p == format::kRngCuda) return "rng";
  const std::string parent = parent_of(p);
  if (parent == format::kModelGroup || parent == format::kUserGroup) return "tensor";
  if (parent == format::kParamGroupsGroup) return is_index(leaf_of(p)) ? "group" : "";
  if (parent == format::kOptimizerStateGroup) return "group";
  if (parent_of(parent) == format::kParamGroupsGroup && is_index(leaf_of(parent)))
    return leaf_of(p) == format::kParamNamesDataset ? "params" : "";
  if (parent_of(parent) == format::kOptimizerStateGroup) return "state";
  return "";
}

// Every object at a known place, of the kind that place needs; everything else is unknown (R14).
void check_objects(Report& r) {
  for (const auto& [p, o] : r.facts.objects) {
    if (p == "/") continue;
    if (o.kind == ObjectFact::Kind::kLink) {
      r.problem("R20: " + p + " is a " + o.link + " link, docs/FORMAT.md requires a group or a dataset");
      continue;
    }
    const std::string place = place_of(p);
    if (place == "state" && r.newer && !is_state_key(leaf_of(p))) continue;  // ignored whole (check_state_group)
    if (place.empty()) {
      r.unknown(std::string(o.kind == ObjectFact::Kind::kGroup ? "group " : "object ") + p);
      continue;
    }
    const bool group = place == "group";
    if (o.kind != (group ? ObjectFact::Kind::kGroup : ObjectFact::Kind::kDataset)) {
      r.problem(p + " is not a " + (group ? "group" : "dataset"));
      continue;
    }
    if (group) {
      if (p != format::kOptimizerGroup && p != format::kSchedulerGroup && p != format::kMetaGroup &&
          parent_of(p) != format::kParamGroupsGroup)
        extra_attrs(r, p, o, {});
      continue;
    }
    if (o.null_space) {
      r.problem("R21: " + p + " has an empty (H5S_NULL) dataspace");
      continue;
    }
    if (place.rfind("scalar ", 0) == 0) {
      check_dataset(r, p, o, place.substr(7));
      if (!o.shape.empty()) r.problem(p + " has shape " + shape_text(o.shape) + ", docs/FORMAT.md requires []");
    } else {
      check_dataset(r, p, o, place == "params" ? "string" : place == "rng" ? "uint8" : "");
    }
    if (parent_of(p) == format::kModelGroup && leaf_of(p).rfind("module.", 0) == 0)
      r.problem("R16: " + p + " starts with 'module.' (a DistributedDataParallel prefix)");
  }
}

void check_rng(Report& r) {
  const ObjectFact* root = r.facts.find("/");
  auto w = root->attrs.find(format::kAttrWorldSize);
  const int64_t world = w != root->attrs.end() && w->second.kind == AK::kInt64 ? w->second.i : -1;
  for (const char* p : {format::kRngCpu, format::kRngCuda}) {
    const ObjectFact* o =
        p == std::string(format::kRngCpu) ? require_object(r, p, ObjectFact::Kind::kDataset) : r.facts.find(p);
    if (!o || o->kind != ObjectFact::Kind::kDataset) continue;
    if (o->shape.size() != 2 || (world >= 1 && o->shape[0] != world))
      r.problem("R3: " + std::string(p) + " has shape " + shape_text(o->shape) + ", docs/FORMAT.md requires [" +
                (world >= 1 ? std::to_string(world) : "world_size") + ", n]");
    else if (p == std::string(format::kRngCuda) && o->shape[1] == 0)
      r.problem("R3: " + std::string(p) +
                " has no bytes per rank (absent, not empty, when no rank had a CUDA generator)");
  }
}

// R24: the values of the attributes with a fixed meaning, for the schedule types of table "Schedules" (another
// type's attributes are its writer's).
void check_schedule_value(Report& r, const ObjectFact& s, const std::string& k, double v) {
  std::vector<std::string> needed;
  auto type = s.attrs.find(format::kAttrSchedulerType);
  if (type == s.attrs.end() || type->second.kind != AK::kString || !schedule_requires(type->second.text, &needed))
    return;
  const std::string where = attr_path(format::kSchedulerGroup, k);
  const bool ranged = k == "step_size" || k == "total_steps" || k == "warmup_steps";
  if ((ranged || k == "base_lr" || k == "gamma") && !std::isfinite(v))
    r.problem("R24: " + where + " is " + std::to_string(v) + ", must be finite");
  else if ((k == "step_size" || k == "total_steps") && v < 1)
    r.problem("R24: " + where + " is " + std::to_string(v) + ", must be >= 1");
  else if (k == "warmup_steps" && v < 0)
    r.problem("R24: " + where + " is " + std::to_string(v) + ", must be >= 0");
}

// R12 and R15: the schedule's attributes, and meta's.
void check_schedule_and_meta(Report& r) {
  if (const ObjectFact* s = require_object(r, format::kSchedulerGroup, ObjectFact::Kind::kGroup)) {
    const std::string g = format::kSchedulerGroup;
    if (const AttrFact* type = require_attr(r, g, *s, format::kAttrSchedulerType, AK::kString)) {
      std::vector<std::string> needed;
      if (schedule_requires(type->text, &needed))
        for (const auto& k : needed)
          if (!s->attrs.count(k))
            r.problem("R12: " + attr_path(g, k) + " is missing (the " + type->text + " schedule requires it)");
    }
    for (const auto& [k, a] : s->attrs)
      if (k != format::kAttrSchedulerType && a.kind != AK::kFloat64)
        r.problem("R12: " + attr_path(g, k) + " has type " + kind_name(a.kind) + ", docs/FORMAT.md requires float64");
      else if (k != format::kAttrSchedulerType && value_ok(r, attr_path(g, k), a))
        check_schedule_value(r, *s, k, a.d);
  }
  if (const ObjectFact* m = require_object(r, format::kMetaGroup, ObjectFact::Kind::kGroup))
    for (const auto& [k, a] : m->attrs)
      if (a.kind != AK::kString)
        r.problem("R15: " + attr_path(format::kMetaGroup, k) + " has type " + kind_name(a.kind) +
                  ", docs/FORMAT.md requires string");
      else
        value_ok(r, attr_path(format::kMetaGroup, k), a);
}

void check_required(Report& r) {
  for (const auto& g : fixed_groups())
    if (g != format::kUserGroup) require_object(r, g, ObjectFact::Kind::kGroup);
  for (const auto& [p, dtype] : fixed_scalars()) require_object(r, p, ObjectFact::Kind::kDataset);
}

// R9: the hyperparameters of param group `g` for `type`; returns the group's amsgrad (0 or 1).
bool check_hyper(Report& r, const std::string& g, const ObjectFact& o, const std::string& type) {
  bool amsgrad = false;
  std::set<std::string> allowed;
  for (const auto& k : hyper_keys(type)) {
    allowed.insert(k);
    auto it = o.attrs.find(k);
    if (it == o.attrs.end()) {
      r.problem("R9: " + attr_path(g, k) + " is missing (a " + type + " hyperparameter)");
      continue;
    }
    const AttrFact& a = it->second;
    if (a.kind == AK::kFloat64 && !value_ok(r, attr_path(g, k), a)) continue;
    if (a.kind != AK::kFloat64 || !std::isfinite(a.d)) {
      r.problem("R9: " + attr_path(g, k) + " must be a finite float64, is " + kind_name(a.kind) +
                (a.kind == AK::kFloat64 ? " " + std::to_string(a.d) : ""));
      continue;
    }
    if ((k == "nesterov" || k == "amsgrad") && a.d != 0.0 && a.d != 1.0)
      r.problem("R9: " + attr_path(g, k) + " is " + std::to_string(a.d) + ", a boolean is 0.0 or 1.0");
    if (k == "amsgrad") amsgrad = a.d == 1.0;
  }
  // Another type's hyperparameter breaks R9 in every revision; a name no type has is unknown (R14).
  for (const auto& [name, a] : o.attrs) {
    if (allowed.count(name)) continue;
    bool other_type = false;
    for (const char* t : {"sgd", "adam"})
      for (const auto& k : hyper_keys(t)) other_type = other_type || k == name;
    if (other_type)
      r.problem("R9: " + attr_path(g, name) + " is not a hyperparameter of " + type);
    else
      r.unknown("attribute " + attr_path(g, name));
  }
  return amsgrad;
}

// The state datasets parameter `p` must have (FORMAT.md "Optimizers").
std::set<std::string> state_keys(const std::string& type, bool amsgrad) {
  if (type == "sgd") return {"momentum_buffer"};
  std::set<std::string> keys = {"exp_avg", "exp_avg_sq", "step"};
  if (amsgrad) keys.insert("max_exp_avg_sq");
  return keys;
}

// R6, R7, R8 (structure) for the state group of parameter `p`.
void check_state_group(Report& r, const std::string& p, const std::string& type, bool amsgrad) {
  const std::string g = format::optimizer_state_dataset(p + "/x");
  const std::string group = parent_of(g);
  const std::set<std::string> want = state_keys(type, amsgrad);
  std::set<std::string> have;
  const ObjectFact* param = r.facts.find(std::string(format::kModelGroup) + "/" + p);
  for (auto it = r.facts.objects.lower_bound(group + "/"); it != r.facts.objects.end(); ++it) {
    if (it->first.compare(0, group.size() + 1, group + "/") != 0) break;
    const std::string key = it->first.substr(group.size() + 1);
    if (key.find('/') != std::string::npos) continue;  // deeper: an unknown object, reported elsewhere
    have.insert(key);
    const ObjectFact& o = it->second;
    if (!want.count(key) && !is_state_key(key) && r.newer) {
      r.unknown("dataset " + it->first);  // a state no optimizer type has: a newer revision's optional addition
    } else if (!want.count(key)) {
      r.problem("R6: " + it->first + " is not a state of " + type + (amsgrad ? " (amsgrad)" : ""));
    } else if (key == "step") {
      if (o.dtype() != "int64" || !o.shape.empty())
        r.problem("R8: " + it->first + " must be an int64 scalar, is " + o.dtype() + " " + shape_text(o.shape));
    } else if (param && (o.dtype() != param->dtype() || o.shape != param->shape)) {
      r.problem("R7: " + it->first + " is " + o.dtype() + " " + shape_text(o.shape) + ", " + format::kModelGroup + "/" +
                p + " is " + param->dtype() + " " + shape_text(param->shape));
    }
  }
  for (const auto& k : want)
    if (!have.count(k)) r.problem("R6: " + group + "/" + k + " is missing (a " + type + " state group has it)");
}

// R4, R5, R6, R7, R8, R9: the optimizer's groups and state.
void check_optimizer(Report& r) {
  const ObjectFact* opt = require_object(r, format::kOptimizerGroup, ObjectFact::Kind::kGroup);
  if (!opt) return;
  const AttrFact* type_attr = require_attr(r, format::kOptimizerGroup, *opt, format::kAttrOptimizerType, AK::kString);
  extra_attrs(r, format::kOptimizerGroup, *opt, {format::kAttrOptimizerType});
  if (!type_attr) return;
  const std::string type = type_attr->text;
  if (type != "" && type != "sgd" && type != "adam" && type != "adamw") {
    r.problem("R6: " + attr_path(format::kOptimizerGroup, format::kAttrOptimizerType) + " is '" + type +
              "', not sgd, adam, adamw or empty");
    return;
  }
  const auto groups = r.facts.children(format::kParamGroupsGroup);
  const auto states = r.facts.children(format::kOptimizerStateGroup);
  if (type.empty() && (!groups.empty() || !states.empty()))
    r.problem("R6: optimizer type is empty (no optimizer) but the file has param groups or state");
  std::map<std::string, bool> amsgrad_of;  // parameter -> its group's amsgrad
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::string g = format::param_group_path(i);
    const ObjectFact* o = r.facts.find(g);
    if (!o) {
      r.problem("missing required group " + g + " (param groups are numbered 0.." + std::to_string(groups.size() - 1) +
                ")");
      continue;
    }
    const bool amsgrad = type.empty() ? false : check_hyper(r, g, *o, type);
    const ObjectFact* names = r.facts.find(g + "/" + format::kParamNamesDataset);
    if (!names) continue;
    for (const auto& n : names->strings) {
      if (!valid_utf8(n)) r.problem("R19: " + g + "/params holds a name that is not valid UTF-8");
      if (!r.facts.find(std::string(format::kModelGroup) + "/" + n))
        r.problem("R4: " + g + "/params names '" + n + "', which is not a " + format::kModelGroup + " key");
      if (!amsgrad_of.emplace(n, amsgrad).second)
        r.problem("R4: parameter '" + n + "' is listed in more than one param group");
    }
  }
  for (const auto& p : states) {
    auto it = amsgrad_of.find(p);
    if (it == amsgrad_of.end()) {
      r.problem("R5: " + std::string(format::kOptimizerStateGroup) + "/" + p + " is the state of '" + p +
                "', which no param group lists");
      continue;
    }
    if (!type.empty()) check_state_group(r, p, type, it->second);
  }
}

void check_layout(Report& r) {
  check_required(r);
  check_objects(r);
  check_rng(r);
  check_schedule_and_meta(r);
  check_optimizer(r);
}

}  // namespace

std::vector<std::string> rule_problems(const FileFacts& facts, std::vector<std::string>* notes) {
  std::vector<std::string> problems;
  Report r{facts, problems, notes};
  const ObjectFact* root = facts.find("/");
  if (!root) {
    r.problem("no root group");
    return problems;
  }
  if (auto it = root->attrs.find(format::kAttrFormatMinorVersion); it != root->attrs.end()) {
    if (it->second.kind != AK::kInt64)
      r.problem(attr_path("/", format::kAttrFormatMinorVersion) + " has type " + kind_name(it->second.kind) +
                ", docs/FORMAT.md requires int64");
    else if (value_ok(r, attr_path("/", format::kAttrFormatMinorVersion), it->second) && it->second.i < 0)
      r.problem("R23: " + attr_path("/", format::kAttrFormatMinorVersion) + " is " + std::to_string(it->second.i) +
                ", must be >= 0");
    else
      r.newer = it->second.i > kFormatMinorVersion;
  }
  check_root(r, *root);
  check_layout(r);
  return problems;
}

bool valid_utf8(const std::string& text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = s[i];
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + len > n) return false;
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

bool bool_bytes_ok(const void* bytes, size_t n) {
  const auto* b = static_cast<const unsigned char*>(bytes);
  unsigned char any = 0;
  for (size_t i = 0; i < n; ++i) any |= b[i];
  return (any & 0xFE) == 0;
}

bool is_state_key(const std::string& key) {
  return key == "momentum_buffer" || key == "exp_avg" || key == "exp_avg_sq" || key == "max_exp_avg_sq" ||
         key == "step";
}

std::vector<std::pair<std::string, int64_t>> adam_steps(const std::vector<TensorRef>& state) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& t : state) {
    const auto slash = t.name.rfind('/');
    if (slash != std::string::npos && t.name.compare(slash + 1, std::string::npos, "step") == 0 &&
        t.dtype == DType::kI64 && t.data)
      out.emplace_back(t.name.substr(0, slash), *static_cast<const int64_t*>(t.data));
  }
  return out;
}

std::vector<std::string> value_problems(const std::string& path, const FileValues& v) {
  std::vector<std::string> out;
  auto problem = [&](const std::string& text) { out.push_back(path + ": " + text); };
  if (v.root_step != v.counters.step)
    problem("R1: /@step is " + std::to_string(v.root_step) + ", " + format::kTrainStep + " is " +
            std::to_string(v.counters.step));
  const std::pair<const char*, int64_t> counters[] = {{format::kTrainStep, v.counters.step},
                                                      {format::kTrainEpoch, v.counters.epoch},
                                                      {format::kTrainSamplesConsumed, v.counters.samples_consumed},
                                                      {format::kDataEpoch, v.data.epoch},
                                                      {format::kDataPosition, v.data.position},
                                                      {format::kDataGlobalBatch, v.data.global_batch}};
  for (const auto& [name, value] : counters)
    if (value < 0) problem("R10: " + std::string(name) + " is " + std::to_string(value) + ", must be >= 0");
  if (v.data.position > v.counters.samples_consumed)
    problem("R10: " + std::string(format::kDataPosition) + " " + std::to_string(v.data.position) + " exceeds " +
            format::kTrainSamplesConsumed + " " + std::to_string(v.counters.samples_consumed));
  if (v.counters.epoch != v.data.epoch)
    problem("R11: " + std::string(format::kTrainEpoch) + " is " + std::to_string(v.counters.epoch) + ", " +
            format::kDataEpoch + " is " + std::to_string(v.data.epoch));
  for (const auto& [param, step] : v.adam_steps)
    if (step < 0 || step > v.counters.step)
      problem("R8: " + format::optimizer_state_dataset(param + "/step") + " is " + std::to_string(step) +
              ", must be in [0, " + format::kTrainStep + " = " + std::to_string(v.counters.step) + "]");
  return out;
}

}  // namespace h5ddp::ckpt
