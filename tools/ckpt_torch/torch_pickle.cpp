#include "torch_pickle.hpp"

#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <unordered_map>

#include "h5ddp/error.hpp"

namespace h5ddp::interop {

PyPtr PyValue::get(const std::string& key) const {
  if (kind != Kind::kDict) return nullptr;
  for (const auto& [k, v] : dict)
    if (k->kind == Kind::kStr && k->s == key) return v;
  return nullptr;
}

std::string PyValue::type_name() const {
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kStr: return "str";
    case Kind::kTuple: return "tuple";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kTensor: return "tensor";
    case Kind::kGlobal: return s;
    case Kind::kStorage: return "storage";
  }
  return "?";
}

namespace {

using Kind = PyValue::Kind;

PyPtr make(Kind k) {
  auto v = std::make_shared<PyValue>();
  v->kind = k;
  return v;
}

// Storage class names of torch.save ("torch.FloatStorage", ...) -> dtype.
std::optional<torch::ScalarType> storage_dtype(const std::string& global) {
  static const std::map<std::string, torch::ScalarType> kTypes = {
      {"torch.FloatStorage", torch::kFloat32}, {"torch.DoubleStorage", torch::kFloat64},
      {"torch.HalfStorage", torch::kFloat16},  {"torch.BFloat16Storage", torch::kBFloat16},
      {"torch.LongStorage", torch::kInt64},    {"torch.IntStorage", torch::kInt32},
      {"torch.ShortStorage", torch::kInt16},   {"torch.CharStorage", torch::kInt8},
      {"torch.ByteStorage", torch::kUInt8},    {"torch.BoolStorage", torch::kBool}};
  auto it = kTypes.find(global);
  if (it == kTypes.end()) return std::nullopt;
  return it->second;
}

class Unpickler {
 public:
  Unpickler(std::string path, caffe2::serialize::PyTorchStreamReader& zip, const char* data, size_t size)
      : path_(std::move(path)), zip_(zip), p_(data), end_(data + size) {}

  PyPtr run();

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw CheckpointError(path_ + ": " + what);
  }
  void need(size_t n) const {
    if (static_cast<size_t>(end_ - p_) < n) fail("truncated pickle data (data.pkl)");
  }
  template <class T>
  T read_le() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_, sizeof(T));  // the pickle protocol is little endian, like every host we build for
    p_ += sizeof(T);
    return v;
  }
  std::string read_bytes(size_t n) {
    need(n);
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  std::string read_line() {
    const char* nl = static_cast<const char*>(std::memchr(p_, '\n', end_ - p_));
    if (!nl) fail("truncated pickle data (data.pkl)");
    std::string s(p_, nl);
    p_ = nl + 1;
    return s;
  }
  PyPtr pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back()))
      fail("malformed pickle data (stack underflow)");
    PyPtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  PyPtr& top() {
    if (stack_.empty()) fail("malformed pickle data (empty stack)");
    return stack_.back();
  }
  std::vector<PyPtr> pop_to_mark() {
    if (marks_.empty()) fail("malformed pickle data (no mark)");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<PyPtr> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  PyPtr memo_get(uint64_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) fail("malformed pickle data (memo key " + std::to_string(key) + " unknown)");
    return it->second;
  }
  void push_int(int64_t v) {
    auto x = make(Kind::kInt);
    x->i = v;
    stack_.push_back(x);
  }
  void push_str(std::string s) {
    auto x = make(Kind::kStr);
    x->s = std::move(s);
    stack_.push_back(x);
  }
  void set_items(PyValue& target, const std::vector<PyPtr>& kv);
  PyPtr call(const PyPtr& callable, const PyPtr& args);
  PyPtr persistent_load(const PyPtr& pid);
  PyPtr rebuild_tensor(const std::vector<PyPtr>& a);

  std::string path_;
  caffe2::serialize::PyTorchStreamReader& zip_;
  const char* p_;
  const char* end_;
  std::vector<PyPtr> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PyPtr> memo_;
  std::map<std::string, PyPtr> storages_;  // by record key: tensors sharing a storage share its bytes
};

void Unpickler::set_items(PyValue& target, const std::vector<PyPtr>& kv) {
  if (target.kind != Kind::kDict) fail("malformed pickle data (SETITEMS on a " + target.type_name() + ")");
  if (kv.size() % 2) fail("malformed pickle data (odd SETITEMS)");
  for (size_t i = 0; i < kv.size(); i += 2) {
    bool replaced = false;
    for (auto& [k, v] : target.dict)
      if ((k->kind == Kind::kStr && kv[i]->kind == Kind::kStr && k->s == kv[i]->s) ||
          (k->kind == Kind::kInt && kv[i]->kind == Kind::kInt && k->i == kv[i]->i)) {
        v = kv[i + 1];
        replaced = true;
      }
    if (!replaced) target.dict.emplace_back(kv[i], kv[i + 1]);
  }
}

PyPtr Unpickler::persistent_load(const PyPtr& pid) {
  // torch.save's persistent id of a storage: ("storage", storage class, key, location, numel).
  if (pid->kind != Kind::kTuple || pid->items.size() < 5 || pid->items[0]->kind != Kind::kStr ||
      pid->items[0]->s != "storage" || pid->items[1]->kind != Kind::kGlobal || pid->items[2]->kind != Kind::kStr ||
      pid->items[4]->kind != Kind::kInt)
    fail("unsupported persistent id in data.pkl (not a torch.save storage)");
  const std::string& key = pid->items[2]->s;
  if (auto it = storages_.find(key); it != storages_.end()) return it->second;
  const auto dtype = storage_dtype(pid->items[1]->s);
  if (!dtype) fail("tensor storage of type " + pid->items[1]->s + " is not supported (h5ddp stores float, int and bool tensors)");
  const int64_t numel = pid->items[4]->i;
  const std::string record = "data/" + key;
  if (!zip_.hasRecord(record)) fail("archive has no record " + record);
  auto [ptr, size] = zip_.getRecord(record);
  const size_t want = static_cast<size_t>(numel) * c10::elementSize(*dtype);
  if (size < want)
    fail("record " + record + " holds " + std::to_string(size) + " bytes, its storage needs " + std::to_string(want));
  auto st = make(Kind::kStorage);
  st->tensor = torch::empty({numel}, torch::TensorOptions().dtype(*dtype));
  if (want) std::memcpy(st->tensor.data_ptr(), ptr.get(), want);
  storages_[key] = st;
  return st;
}

PyPtr Unpickler::rebuild_tensor(const std::vector<PyPtr>& a) {
  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
  if (a.size() < 4 || a[0]->kind != Kind::kStorage || a[1]->kind != Kind::kInt || a[2]->kind != Kind::kTuple ||
      a[3]->kind != Kind::kTuple)
    fail("malformed torch._utils._rebuild_tensor_v2 arguments");
  std::vector<int64_t> size, stride;
  for (const auto& d : a[2]->items) {
    if (d->kind != Kind::kInt) fail("malformed tensor size");
    size.push_back(d->i);
  }
  for (const auto& d : a[3]->items) {
    if (d->kind != Kind::kInt) fail("malformed tensor stride");
    stride.push_back(d->i);
  }
  if (size.size() != stride.size()) fail("tensor size and stride differ in length");
  const torch::Tensor& storage = a[0]->tensor;
  // Check the view stays inside the storage before as_strided touches it.
  int64_t last = a[1]->i;
  bool empty = false;
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] < 0 || stride[d] < 0) fail("negative tensor size or stride");
    if (size[d] == 0) empty = true;
    else last += (size[d] - 1) * stride[d];
  }
  if (!empty && (a[1]->i < 0 || last >= storage.numel())) fail("tensor view reaches outside its storage");
  auto t = make(Kind::kTensor);
  t->tensor = empty ? torch::empty(size, storage.options())
                    : storage.as_strided(size, stride, a[1]->i).clone(at::MemoryFormat::Contiguous);
  return t;
}

PyPtr Unpickler::call(const PyPtr& callable, const PyPtr& args) {
  if (callable->kind != Kind::kGlobal) fail("malformed pickle data (call of a " + callable->type_name() + ")");
  if (args->kind != Kind::kTuple) fail("malformed pickle data (arguments are a " + args->type_name() + ")");
  const std::string& g = callable->s;
  const auto& a = args->items;
  if (g == "collections.OrderedDict" || g == "builtins.dict") {
    auto d = make(Kind::kDict);
    if (!a.empty() && a[0]->kind == Kind::kList)  // OrderedDict([(k, v), ...])
      for (const auto& kv : a[0]->items) {
        if (kv->kind != Kind::kTuple || kv->items.size() != 2) fail("malformed OrderedDict items");
        set_items(*d, kv->items);
      }
    return d;
  }
  if (g == "torch._utils._rebuild_tensor_v2" || g == "torch._utils._rebuild_tensor") return rebuild_tensor(a);
  if (g == "torch._utils._rebuild_parameter" || g == "torch._utils._rebuild_parameter_with_state") {
    if (a.empty() || a[0]->kind != Kind::kTensor) fail("malformed " + g + " arguments");
    return a[0];  // a Parameter's data; requires_grad and hooks do not cross into a checkpoint
  }
  if (g == "torch._tensor._rebuild_from_type_v2") {  // (func, type, args, state): tensor subclasses
    if (a.size() < 3) fail("malformed " + g + " arguments");
    return call(a[0], a[2]);
  }
  fail("cannot read a pickled " + g +
       " (h5ddp-ckpt import reads dicts, lists, tuples, numbers, strings and tensors, as in a state dict)");
}

PyPtr Unpickler::run() {
  while (true) {
    need(1);
    const auto op = static_cast<uint8_t>(*p_++);
    switch (op) {
      case 0x80: read_le<uint8_t>(); break;   // PROTO
      case 0x95: read_le<uint64_t>(); break;  // FRAME
      case '.':                               // STOP
        if (stack_.size() != 1) fail("malformed pickle data (stack at STOP)");
        return stack_.back();
      case '(': marks_.push_back(stack_.size()); break;  // MARK
      case '0': pop(); break;                            // POP
      case '1': pop_to_mark(); break;                    // POP_MARK
      case '2': stack_.push_back(top()); break;          // DUP
      case 'N': stack_.push_back(make(Kind::kNone)); break;
      case 0x88:
      case 0x89: {  // NEWTRUE, NEWFALSE
        auto b = make(Kind::kBool);
        b->b = op == 0x88;
        stack_.push_back(b);
        break;
      }
      case 'J': push_int(read_le<int32_t>()); break;   // BININT
      case 'K': push_int(read_le<uint8_t>()); break;   // BININT1
      case 'M': push_int(read_le<uint16_t>()); break;  // BININT2
      case 0x8a:                                       // LONG1
      case 0x8b: {                                     // LONG4
        const uint32_t n = op == 0x8a ? read_le<uint8_t>() : read_le<uint32_t>();
        if (n > 8) fail("integer too large for int64 in data.pkl");
        const std::string b = read_bytes(n);
        uint64_t v = 0;
        for (uint32_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(b[i])) << (8 * i);
        if (n > 0 && n < 8 && (static_cast<uint8_t>(b[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);  // sign
        push_int(static_cast<int64_t>(v));
        break;
      }
      case 'I': {  // INT (protocol 0): "01"/"00" are booleans
        const std::string s = read_line();
        if (s == "01" || s == "00") {
          auto b = make(Kind::kBool);
          b->b = s == "01";
          stack_.push_back(b);
        } else {
          push_int(std::stoll(s));
        }
        break;
      }
      case 'G': {  // BINFLOAT, big endian
        need(8);
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(p_[i]);
        p_ += 8;
        auto f = make(Kind::kFloat);
        std::memcpy(&f->f, &bits, 8);
        stack_.push_back(f);
        break;
      }
      case 'X': push_str(read_bytes(read_le<uint32_t>())); break;   // BINUNICODE
      case 0x8c: push_str(read_bytes(read_le<uint8_t>())); break;  // SHORT_BINUNICODE
      case 0x8d: push_str(read_bytes(read_le<uint64_t>())); break; // BINUNICODE8
      case 'T':
      case 'B': push_str(read_bytes(read_le<uint32_t>())); break;  // BINSTRING, BINBYTES
      case 'U':
      case 'C': push_str(read_bytes(read_le<uint8_t>())); break;   // SHORT_BINSTRING, SHORT_BINBYTES
      case '}': stack_.push_back(make(Kind::kDict)); break;        // EMPTY_DICT
      case ']': stack_.push_back(make(Kind::kList)); break;        // EMPTY_LIST
      case ')': stack_.push_back(make(Kind::kTuple)); break;       // EMPTY_TUPLE
      case 'd': {                                                  // DICT
        auto d = make(Kind::kDict);
        set_items(*d, pop_to_mark());
        stack_.push_back(d);
        break;
      }
      case 'l':    // LIST
      case 't': {  // TUPLE
        auto c = make(op == 'l' ? Kind::kList : Kind::kTuple);
        c->items = pop_to_mark();
        stack_.push_back(c);
        break;
      }
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        auto t = make(Kind::kTuple);
        t->items.resize(op - 0x84);
        for (size_t i = t->items.size(); i-- > 0;) t->items[i] = pop();
        stack_.push_back(t);
        break;
      }
      case 'a': {  // APPEND
        PyPtr v = pop();
        if (top()->kind != Kind::kList) fail("malformed pickle data (APPEND to a " + top()->type_name() + ")");
        top()->items.push_back(v);
        break;
      }
      case 'e': {  // APPENDS
        auto items = pop_to_mark();
        if (top()->kind != Kind::kList) fail("malformed pickle data (APPENDS to a " + top()->type_name() + ")");
        top()->items.insert(top()->items.end(), items.begin(), items.end());
        break;
      }
      case 's': {  // SETITEM
        PyPtr v = pop();
        PyPtr k = pop();
        set_items(*top(), {k, v});
        break;
      }
      case 'u': {  // SETITEMS
        auto kv = pop_to_mark();
        set_items(*top(), kv);
        break;
      }
      case 'c': {  // GLOBAL
        const std::string module = read_line();
        auto g = make(Kind::kGlobal);
        g->s = module + "." + read_line();
        stack_.push_back(g);
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        PyPtr name = pop();
        PyPtr module = pop();
        if (name->kind != Kind::kStr || module->kind != Kind::kStr) fail("malformed pickle data (STACK_GLOBAL)");
        auto g = make(Kind::kGlobal);
        g->s = module->s + "." + name->s;
        stack_.push_back(g);
        break;
      }
      case 'R':      // REDUCE
      case 0x81: {   // NEWOBJ
        PyPtr args = pop();
        PyPtr callable = pop();
        stack_.push_back(call(callable, args));
        break;
      }
      case 'b': {  // BUILD: an OrderedDict's state is its _metadata attribute (state-dict versions): dropped
        PyPtr state = pop();
        if (top()->kind != Kind::kDict && top()->kind != Kind::kTensor)
          fail("cannot read a pickled object of type " + top()->type_name() + " (BUILD)");
        break;
      }
      case 'Q': stack_.push_back(persistent_load(pop())); break;  // BINPERSID
      case 'q': memo_[read_le<uint8_t>()] = top(); break;          // BINPUT
      case 'r': memo_[read_le<uint32_t>()] = top(); break;         // LONG_BINPUT
      case 0x94: memo_[memo_.size()] = top(); break;               // MEMOIZE
      case 'p': memo_[std::stoull(read_line())] = top(); break;    // PUT
      case 'h': stack_.push_back(memo_get(read_le<uint8_t>())); break;   // BINGET
      case 'j': stack_.push_back(memo_get(read_le<uint32_t>())); break;  // LONG_BINGET
      case 'g': stack_.push_back(memo_get(std::stoull(read_line()))); break;  // GET
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        fail(std::string("unsupported pickle opcode ") + hex + " in data.pkl");
      }
    }
  }
}

}  // namespace

PyPtr read_torch_save(const std::string& path) {
  char magic[4] = {};
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw CheckpointError(path + ": cannot open the file");
    in.read(magic, 4);
  }
  if (std::memcmp(magic, "PK\x03\x04", 4) != 0) {
    // The legacy format starts with a pickled magic number (protocol 2: 0x80 0x02 0x8a 0x0a).
    const bool legacy = static_cast<uint8_t>(magic[0]) == 0x80 && static_cast<uint8_t>(magic[2]) == 0x8a;
    throw CheckpointError(path + (legacy ? ": written by torch.save in PyTorch's legacy (pre-1.6) format; re-save it "
                                           "with torch.save(obj, path) in PyTorch >= 1.6 (the zip format)"
                                         : ": not a torch.save file (no zip archive)"));
  }
  try {
    caffe2::serialize::PyTorchStreamReader zip(path);
    if (!zip.hasRecord("data.pkl")) throw CheckpointError(path + ": zip archive without data.pkl (not a torch.save file)");
    auto [pkl, size] = zip.getRecord("data.pkl");
    Unpickler u(path, zip, static_cast<const char*>(pkl.get()), size);
    return u.run();
  } catch (const CheckpointError&) {
    throw;
  } catch (const c10::Error& e) {
    throw CheckpointError(path + ": cannot read the torch.save archive: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw CheckpointError(path + ": cannot read the torch.save archive: " + e.what());
  }
}

}  // namespace h5ddp::interop
