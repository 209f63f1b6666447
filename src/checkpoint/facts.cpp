// What a checkpoint holds, for the rules of rules.cpp: read from a file in one walk of its objects
// and attributes (read_facts), or foreseen from the state a save is about to write (facts_of_plan).
#include <algorithm>
#include <cstring>
#include <set>

#include "checkpoint/plan.hpp"
#include "checkpoint/reader.hpp"
#include "checkpoint/rules.hpp"
#include "h5/h5.hpp"
#include "h5ddp/error.hpp"
#include "h5ddp/format.hpp"

namespace h5ddp::ckpt {
namespace {

using AK = AttrFact::Kind;

bool is_le_integer(hid_t t, size_t size, H5T_sign_t sign) {
  return H5Tget_class(t) == H5T_INTEGER && H5Tget_size(t) == size && H5Tget_sign(t) == sign &&
         H5Tget_order(t) == H5T_ORDER_LE;
}

// A one-element attribute of kind string, int64, uint64 or float64, with its value (and whether its dataspace is
// scalar, R18); kOther otherwise (no element or several: not a scalar either).
AttrFact read_attr_fact(hid_t loc, const char* name) {
  AttrFact a;
  h5::Handle attr = h5::attribute(H5Aopen(loc, name, H5P_DEFAULT));
  h5::Handle t = h5::datatype(H5Aget_type(attr));
  h5::Handle s = h5::dataspace(H5Aget_space(attr));
  a.scalar = H5Sget_simple_extent_type(s) == H5S_SCALAR;
  if (H5Sget_simple_extent_type(s) == H5S_NULL || H5Sget_simple_extent_npoints(s) != 1) return a;
  if (H5Tget_class(t) == H5T_STRING) {
    a.kind = AK::kString;
    a.text = h5::read_attr_string(loc, name);
  } else if (is_le_integer(t, 8, H5T_SGN_2)) {
    a.kind = AK::kInt64;
    H5DDP_CHECK_H5(H5Aread(attr, H5T_NATIVE_INT64, &a.i));
  } else if (is_le_integer(t, 8, H5T_SGN_NONE)) {
    a.kind = AK::kUint64;
    H5DDP_CHECK_H5(H5Aread(attr, H5T_NATIVE_UINT64, &a.u));
  } else if (H5Tget_class(t) == H5T_FLOAT && H5Tget_size(t) == 8 && H5Tget_order(t) == H5T_ORDER_LE) {
    a.kind = AK::kFloat64;
    H5DDP_CHECK_H5(H5Aread(attr, H5T_NATIVE_DOUBLE, &a.d));
  }
  return a;
}

herr_t attr_cb(hid_t loc, const char* name, const H5A_info_t*, void* data) {
  auto* o = static_cast<ObjectFact*>(data);
  o->attrs[name] = read_attr_fact(loc, name);
  return 0;
}

// Whether `t` is a strings dataset's type: fixed-length, NUL-padded, ASCII or UTF-8.
bool is_names_type(hid_t t) {
  if (H5Tget_class(t) != H5T_STRING || H5Tis_variable_str(t) > 0 || H5Tget_size(t) < 1) return false;
  const H5T_cset_t cset = H5Tget_cset(t);
  return H5Tget_strpad(t) == H5T_STR_NULLPAD && (cset == H5T_CSET_ASCII || cset == H5T_CSET_UTF8);
}

// The walk's state: the facts, and each dtype's HDF5 file type made once (thousands of datasets share a few).
struct Walk {
  FileFacts& facts;
  std::map<std::string, h5::Handle> types;
  hid_t type_of(const std::string& dtype) {
    auto it = types.find(dtype);
    if (it == types.end()) it = types.emplace(dtype, h5::file_type(dtype_from_name(dtype))).first;
    return it->second;
  }
};

// Shape and type of a dataset; the elements of a strings dataset named "params".
void dataset_facts(Walk& w, hid_t ds, const std::string& path, ObjectFact& o) {
  h5::Handle space = h5::dataspace(H5Dget_space(ds));
  o.null_space = H5Sget_simple_extent_type(space) == H5S_NULL;
  o.shape = h5::space_shape(space);
  const haddr_t offset = H5Dget_offset(ds);
  if (offset != HADDR_UNDEF) o.offset = static_cast<uint64_t>(offset);
  o.storage = static_cast<uint64_t>(H5Dget_storage_size(ds));
  h5::Handle t = h5::datatype(H5Dget_type(ds));
  const std::string dtype = o.dtype();
  if (dtype == "string") {
    o.type_matches = is_names_type(t);
    if (o.type_matches && o.shape.size() == 1 && path.size() > 7 && path.compare(path.size() - 7, 7, "/params") == 0)
      o.strings = read_string_elements(ds, t, static_cast<size_t>(o.shape[0]));
    return;
  }
  try {
    o.type_matches = H5Tequal(t, w.type_of(dtype)) > 0;
  } catch (const Error&) {
    o.type_matches = false;  // an unknown dtype name: the rules report it
  }
}

// The format nests four levels deep (/optimizer/state/<p>/<key>); deeper objects are listed, never entered, so
// that a file whose links form a cycle cannot make the walk endless.
constexpr int kMaxDepth = 6;

// Whether the link `name` of group `g` is a hard link; otherwise `o` records its kind (never followed: R20).
bool hard_link(hid_t g, const std::string& name, ObjectFact& o) {
  H5L_info_t info;
  H5DDP_CHECK_H5(H5Lget_info(g, name.c_str(), &info, H5P_DEFAULT));
  if (info.type == H5L_TYPE_HARD) return true;
  o.kind = ObjectFact::Kind::kLink;
  o.link = info.type == H5L_TYPE_SOFT ? "soft" : info.type == H5L_TYPE_EXTERNAL ? "external" : "user-defined";
  return false;
}

// Facts of the object `path` (open as `obj`) and, for a group, of everything under it.
void walk(Walk& w, hid_t obj, const std::string& path, int depth) {
  ObjectFact& o = w.facts.objects[path];
  const H5I_type_t kind = H5Iget_type(obj);
  o.kind = kind == H5I_GROUP     ? ObjectFact::Kind::kGroup
           : kind == H5I_DATASET ? ObjectFact::Kind::kDataset
                                 : ObjectFact::Kind::kOther;
  hsize_t idx = 0;
  H5DDP_CHECK_H5(H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, &idx, attr_cb, &o));
  if (o.kind == ObjectFact::Kind::kDataset) dataset_facts(w, obj, path, o);
  if (o.kind != ObjectFact::Kind::kGroup || depth >= kMaxDepth) return;
  for (const auto& n : h5::children(obj, ".")) {
    const std::string child = (path == "/" ? "" : path) + "/" + n;
    if (!hard_link(obj, n, w.facts.objects[child])) continue;
    with_context("reading " + child, [&] {
      h5::Handle c(H5Oopen(obj, n.c_str(), H5P_DEFAULT), H5Oclose);
      H5DDP_CHECK_H5(c.get());
      walk(w, c, child, depth + 1);
    });
  }
}

AttrFact text_attr(const std::string& v) {
  AttrFact a;
  a.kind = AK::kString;
  a.text = v;
  return a;
}
AttrFact int_attr(int64_t v) {
  AttrFact a;
  a.kind = AK::kInt64;
  a.i = v;
  return a;
}
AttrFact float_attr(double v) {
  AttrFact a;
  a.kind = AK::kFloat64;
  a.d = v;
  return a;
}

ObjectFact group_fact() {
  ObjectFact o;
  o.kind = ObjectFact::Kind::kGroup;
  return o;
}

// A planned dataset as a reader will find it (attributes dtype and xxh3, its shape, the HDF5 type its dtype names).
ObjectFact planned_dataset(const DatasetPlan& d) {
  ObjectFact o;
  o.kind = ObjectFact::Kind::kDataset;
  o.attrs[format::kAttrDtype] = text_attr(d.string_size ? "string" : dtype_name(d.dtype));
  o.attrs[format::kAttrChecksum].kind = AK::kUint64;
  o.shape = d.shape;
  o.type_matches = true;
  if (d.string_size && d.src)
    for (int64_t i = 0; i < d.shape.at(0); ++i) {
      const char* e = static_cast<const char*>(d.src) + i * d.string_size;
      o.strings.emplace_back(e, strnlen(e, d.string_size));
    }
  return o;
}

TensorInfo tensor_of(const FileFacts& f, const std::string& path, const std::string& name) {
  const ObjectFact& o = f.objects.at(path);
  TensorInfo t;
  t.name = name;
  t.dtype = dtype_from_name(o.dtype());
  t.shape = o.shape;
  t.checksum = o.attrs.at(format::kAttrChecksum).u;
  return t;
}

const AttrFact& attr_of(const FileFacts& f, const std::string& object, const char* name) {
  return f.objects.at(object).attrs.at(name);
}

}  // namespace

CheckpointManifest manifest_of(const FileFacts& f) {
  CheckpointManifest m;
  m.path = f.path;
  m.format_version = static_cast<int>(attr_of(f, "/", format::kAttrFormatVersion).i);
  m.step = attr_of(f, "/", format::kAttrStep).i;
  m.world_size = static_cast<int>(attr_of(f, "/", format::kAttrWorldSize).i);
  m.h5ddp_version = attr_of(f, "/", format::kAttrH5ddpVersion).text;
  m.torch_version = attr_of(f, "/", format::kAttrTorchVersion).text;
  m.created = attr_of(f, "/", format::kAttrCreated).text;
  for (const auto& key : f.children(format::kModelGroup))
    m.model.push_back(tensor_of(f, format::model_dataset(key), key));
  m.optimizer_type = attr_of(f, format::kOptimizerGroup, format::kAttrOptimizerType).text;
  for (size_t i = 0; i < f.children(format::kParamGroupsGroup).size(); ++i) {
    const std::string g = format::param_group_path(i);
    ParamGroup pg;
    for (const auto& [k, a] : f.objects.at(g).attrs)
      if (a.kind == AttrFact::Kind::kFloat64) pg.hyper[k] = a.d;
    if (const ObjectFact* names = f.find(g + "/" + format::kParamNamesDataset)) pg.params = names->strings;
    m.param_groups.push_back(std::move(pg));
  }
  for (const auto& param : f.children(format::kOptimizerStateGroup))
    for (const auto& key : f.children(std::string(format::kOptimizerStateGroup) + "/" + param))
      if (is_state_key(key))  // others: a newer revision's optional additions (the rules refuse them otherwise)
        m.optimizer_state.push_back(
            tensor_of(f, format::optimizer_state_dataset(param + "/" + key), param + "/" + key));
  if (f.find(format::kUserGroup))
    for (const auto& key : f.children(format::kUserGroup))
      m.user.push_back(tensor_of(f, format::user_dataset(key), key));
  m.rng_cpu_bytes = static_cast<size_t>(f.objects.at(format::kRngCpu).shape.at(1));
  if (const ObjectFact* cuda = f.find(format::kRngCuda)) m.rng_cuda_bytes = static_cast<size_t>(cuda->shape.at(1));
  for (const auto* list : {&m.model, &m.optimizer_state, &m.user})
    for (const auto& t : *list) m.tensor_bytes += t.nbytes();
  return m;
}

FileFacts facts_of_plan(const SavePlan& plan, const TrainState& state, int world, const std::string& path) {
  FileFacts f;
  f.path = path;
  ObjectFact& root = f.objects["/"] = group_fact();
  root.attrs[format::kAttrFormat] = text_attr(format::kFormatName);
  root.attrs[format::kAttrFormatVersion] = int_attr(format::kFormatVersion);
  root.attrs[format::kAttrFormatMinorVersion] = int_attr(kFormatMinorVersion);
  for (const char* a : {format::kAttrH5ddpVersion, format::kAttrTorchVersion, format::kAttrCreated})
    root.attrs[a] = text_attr("");
  root.attrs[format::kAttrWorldSize] = int_attr(world);
  root.attrs[format::kAttrStep] = int_attr(state.counters.step);
  for (const char* g : {format::kModelGroup, format::kOptimizerGroup, format::kParamGroupsGroup,
                        format::kOptimizerStateGroup, format::kTrainGroup, format::kDataGroup, format::kRngGroup})
    f.objects[g] = group_fact();
  if (!state.user.empty()) f.objects[format::kUserGroup] = group_fact();
  const OptimizerState& opt = plan.optimizer;
  f.objects[format::kOptimizerGroup].attrs[format::kAttrOptimizerType] = text_attr(opt.type);
  for (size_t i = 0; i < opt.groups.size(); ++i) {
    ObjectFact& g = f.objects[format::param_group_path(i)] = group_fact();
    for (const auto& [k, v] : opt.groups[i].hyper) g.attrs[k] = float_attr(v);
  }
  for (const auto& t : opt.state) {
    const std::string ds = format::optimizer_state_dataset(t.name);
    f.objects[ds.substr(0, ds.rfind('/'))] = group_fact();
  }
  ObjectFact& sched = f.objects[format::kSchedulerGroup] = group_fact();
  sched.attrs[format::kAttrSchedulerType] = text_attr(state.scheduler.type);
  for (const auto& [k, v] : state.scheduler.values) sched.attrs[k] = float_attr(v);
  ObjectFact& meta = f.objects[format::kMetaGroup] = group_fact();
  for (const auto& [k, v] : state.meta) meta.attrs[k] = text_attr(v);
  for (const auto& d : plan.datasets) f.objects[d.path] = planned_dataset(d);
  return f;
}

FileFacts read_facts(hid_t file, const std::string& path) {
  FileFacts facts;
  facts.path = path;
  Walk w{facts, {}};
  h5::SilenceErrors quiet;
  try {
    h5::Handle root = h5::group(H5Gopen2(file, "/", H5P_DEFAULT));
    walk(w, root, "/", 0);
  } catch (const Error& e) {
    throw CheckpointError(path + ": cannot read its layout, damaged: " + e.what());
  }
  return facts;
}

}  // namespace h5ddp::ckpt
