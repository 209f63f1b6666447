#include "pickle.hpp"

#include <charconv>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "h5ddp/error.hpp"

namespace h5ddp::interop {

// Python dicts replace the value of a key they already hold; these find the key in O(1). Keys other than
// str and int (rare in a state dict) are appended as they come, as the reader always did.
struct PyValue::DictIndex {
  std::unordered_map<std::string_view, size_t> str;  // views into the keys' own (never changed) strings
  std::unordered_map<int64_t, size_t> num;
};

std::string printable(std::string_view s, size_t max) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == max) return out + "...";
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

PyValue& Pickle::add() {
  if (chunk_used_ == chunk_capacity_) {
    chunk_capacity_ = chunk_capacity_ ? std::min<size_t>(2 * chunk_capacity_, 16384) : 64;
    chunks_.push_back(std::make_unique<PyValue[]>(chunk_capacity_));
    chunk_used_ = 0;
  }
  ++size_;
  return chunks_.back()[chunk_used_++];
}

PyValue::PyValue() = default;
PyValue::~PyValue() = default;

const PyValue* PyValue::get(std::string_view key) const {
  if (kind != Kind::kDict || !index) return nullptr;
  auto it = index->str.find(key);
  return it == index->str.end() ? nullptr : dict[it->second].second;
}

std::string PyValue::type_name() const {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kStr:
      return "str";
    case Kind::kTuple:
      return "tuple";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kTensor:
      return "tensor";
    case Kind::kGlobal:
      return printable(s);
    case Kind::kStorage:
      return "storage";
  }
  return "?";
}

namespace {

using Kind = PyValue::Kind;

struct StorageType {
  const char* name;
  const char* dtype;
  size_t element_size;
};

// Storage classes of torch.save that h5ddp can store (float, int and bool tensors).
const StorageType* storage_type(const std::string& global) {
  static const StorageType kTypes[] = {{"torch.FloatStorage", "float32", 4}, {"torch.DoubleStorage", "float64", 8},
                                       {"torch.HalfStorage", "float16", 2},  {"torch.BFloat16Storage", "bfloat16", 2},
                                       {"torch.LongStorage", "int64", 8},    {"torch.IntStorage", "int32", 4},
                                       {"torch.ShortStorage", "int16", 2},   {"torch.CharStorage", "int8", 1},
                                       {"torch.ByteStorage", "uint8", 1},    {"torch.BoolStorage", "bool", 1}};
  for (const auto& t : kTypes)
    if (global == t.name) return &t;
  return nullptr;
}

constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();
uint64_t saturating_add(uint64_t a, uint64_t b) {
  return a > kMaxU64 - b ? kMaxU64 : a + b;
}

std::string opcode_name(uint8_t op) {
  char text[16];
  if (op >= 0x21 && op < 0x7f)
    std::snprintf(text, sizeof text, "'%c'", op);
  else
    std::snprintf(text, sizeof text, "0x%02x", op);
  return text;
}

}  // namespace

// Not in the anonymous namespace: Pickle names it as a friend.
class Unpickler {
 public:
  Unpickler(const std::string& file, const char* data, size_t size, const PickleLimits& limits)
      : file_(file), begin_(data), p_(data), end_(data + size), limits_(limits) {}

  Pickle run();

 private:
  [[noreturn]] void fail(const std::string& what) const { throw CheckpointError(file_ + ": " + what); }
  [[noreturn]] void malformed(const std::string& what) const {
    fail("data.pkl is malformed (" + what + " at byte " + std::to_string(op_at_) + ")");
  }
  // `what` says which limit of PickleLimits the file exceeds.
  [[noreturn]] void over(const std::string& what) const {
    fail("data.pkl " + what + " (h5ddp-ckpt import's limit; a damaged or hostile file?)");
  }
  static std::string num(uint64_t v) { return std::to_string(v); }

  void need(uint64_t n) const {
    if (static_cast<uint64_t>(end_ - p_) < n)
      fail("data.pkl is truncated (opcode " + opcode_name(op_) + " at byte " + std::to_string(op_at_) + " needs " +
           std::to_string(n) + " more bytes, " + std::to_string(end_ - p_) + " are left)");
  }
  template <class T>
  T read_le() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_, sizeof(T));  // the pickle protocol is little endian, like every host we build for
    p_ += sizeof(T);
    return v;
  }
  std::string read_string(uint64_t n) {
    need(n);  // first: a declared size beyond the data allocates nothing
    if (n > limits_.max_string_bytes)
      over("holds a string of " + std::to_string(n) + " bytes, more than " + std::to_string(limits_.max_string_bytes));
    std::string s(p_, static_cast<size_t>(n));
    p_ += n;
    return s;
  }
  // One '\n'-terminated line of a protocol-0 opcode (at most max_name_bytes long).
  std::string_view read_line() {
    const size_t window = std::min<size_t>(static_cast<size_t>(end_ - p_), limits_.max_name_bytes + 1);
    const char* nl = static_cast<const char*>(std::memchr(p_, '\n', window));
    if (!nl) {
      if (window > limits_.max_name_bytes)
        malformed("a line longer than " + std::to_string(limits_.max_name_bytes) + " bytes");
      fail("data.pkl is truncated (opcode " + opcode_name(op_) + " at byte " + std::to_string(op_at_) +
           " has no end of line)");
    }
    std::string_view s(p_, static_cast<size_t>(nl - p_));
    p_ = nl + 1;
    return s;
  }
  template <class T>
  T parse_number(std::string_view text) {
    T v{};
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size()) malformed("'" + printable(text) + "' is not a number");
    return v;
  }

  PyValue* create(Kind k) {
    if (pickle_.size() >= limits_.max_objects) over("holds more than " + num(limits_.max_objects) + " objects");
    PyValue& v = pickle_.add();
    v.kind = k;
    if (k == Kind::kTuple || k == Kind::kList || k == Kind::kDict) v.depth = 1;
    if (k == Kind::kDict) v.index = std::make_unique<PyValue::DictIndex>();
    return &v;
  }
  // Every value lives in pickle_, which this unpickler owns; containers hold const pointers so
  // that readers of a Pickle cannot change it, and the stack takes a value back out of one with this.
  static PyValue* own(const PyValue* v) { return const_cast<PyValue*>(v); }

  void push(PyValue* v) {
    if (stack_.size() >= limits_.max_stack) over("keeps more than " + num(limits_.max_stack) + " values on its stack");
    stack_.push_back(v);
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  PyValue* pop() {
    if (stack_.size() <= floor()) malformed("stack underflow");
    PyValue* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  PyValue* top() {
    if (stack_.empty()) malformed("empty stack");
    return stack_.back();
  }
  std::vector<PyValue*> pop_to_mark() {
    if (marks_.empty()) malformed("no MARK");
    const size_t m = marks_.back();
    marks_.pop_back();
    if (m > stack_.size()) malformed("stack below its MARK");
    std::vector<PyValue*> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  // A container on the stack that an opcode is about to change.
  PyValue& changing(PyValue* v, Kind kind, const char* opcode) {
    if (v->kind != kind) malformed(std::string(opcode) + " to a " + v->type_name());
    if (v->nested)
      fail("data.pkl changes a " + v->type_name() + " after putting it into another container " +
           "(self-referencing objects are not supported)");
    return *v;
  }
  // Bookkeeping of `item` going into `container` (not yet held by any container).
  void adopt(PyValue& container, const PyValue* item) {
    if (item == &container)
      fail("data.pkl puts a " + container.type_name() + " inside itself (self-referencing objects are not supported)");
    if (++items_ > limits_.max_items)
      over("puts more than " + num(limits_.max_items) + " items into lists, tuples and dicts");
    own(item)->nested = true;
    if (item->depth + 1 > container.depth) {
      container.depth = item->depth + 1;
      if (container.depth > limits_.max_depth) over("nests deeper than " + num(limits_.max_depth) + " levels");
    }
  }
  PyValue* make_sequence(Kind kind, const std::vector<PyValue*>& items) {
    PyValue* c = create(kind);
    c->items.reserve(items.size());
    for (PyValue* x : items) {
      adopt(*c, x);
      c->items.push_back(x);
    }
    return c;
  }
  void set_item(PyValue& d, const PyValue* k, const PyValue* v);
  void set_items(PyValue& d, const std::vector<PyValue*>& kv) {
    if (kv.size() % 2) malformed("odd number of SETITEMS values");
    for (size_t i = 0; i < kv.size(); i += 2) set_item(d, kv[i], kv[i + 1]);
  }
  // The pickler numbers memo entries 0, 1, 2, ...: those go to a vector, any other key to a map.
  size_t memo_size() const { return memo_dense_.size() + memo_sparse_.size(); }
  void memo_put(uint64_t key, PyValue* v) {
    if (key < memo_dense_.size()) {
      memo_dense_[key] = v;
      return;
    }
    auto it = memo_sparse_.find(key);
    if (it != memo_sparse_.end()) {
      it->second = v;
      return;
    }
    if (memo_size() >= limits_.max_memo) over("memoizes more than " + num(limits_.max_memo) + " values");
    if (key == memo_dense_.size()) {
      memo_dense_.push_back(v);
      // Keys stored out of order earlier may now continue the vector.
      for (auto next = memo_sparse_.find(memo_dense_.size()); next != memo_sparse_.end();
           next = memo_sparse_.find(memo_dense_.size())) {
        memo_dense_.push_back(next->second);
        memo_sparse_.erase(next);
      }
    } else {
      memo_sparse_.emplace(key, v);
    }
  }
  PyValue* memo_get(uint64_t key) {
    if (key < memo_dense_.size()) return memo_dense_[key];
    auto it = memo_sparse_.find(key);
    if (it == memo_sparse_.end()) malformed("memo key " + std::to_string(key) + " was never stored");
    return it->second;
  }
  void push_int(int64_t v) {
    PyValue* x = create(Kind::kInt);
    x->i = v;
    push(x);
  }
  void push_str(std::string s) {
    PyValue* x = create(Kind::kStr);
    x->s = std::move(s);
    push(x);
  }
  void push_global(std::string_view module, std::string_view name) {
    if (module.size() + name.size() + 1 > limits_.max_name_bytes)
      malformed("a global name longer than " + std::to_string(limits_.max_name_bytes) + " bytes");
    PyValue* g = create(Kind::kGlobal);
    g->s.reserve(module.size() + name.size() + 1);
    g->s.append(module).append(".").append(name);
    push(g);
  }
  PyValue* call(const PyValue* callable, const PyValue* args);
  PyValue* persistent_load(const PyValue* pid);
  PyValue* rebuild_tensor(const std::vector<const PyValue*>& a);

  const std::string& file_;
  const char* begin_;
  const char* p_;
  const char* end_;
  const PickleLimits& limits_;
  uint8_t op_ = 0;  // opcode being run, and where it starts (for messages)
  size_t op_at_ = 0;
  Pickle pickle_;
  std::vector<PyValue*> stack_;
  std::vector<size_t> marks_;                           // stack_ sizes at each open MARK
  std::vector<PyValue*> memo_dense_;                    // keys 0 .. size - 1
  std::unordered_map<uint64_t, PyValue*> memo_sparse_;  // the others
  std::unordered_map<std::string, PyValue*> storages_;  // by record key: tensors sharing a storage share it
  size_t items_ = 0;
  // Bytes of the storages and of the tensors made so far; tensor_bytes_ <= storage_bytes_ + max_extra_tensor_bytes.
  uint64_t storage_bytes_ = 0, tensor_bytes_ = 0;
  // Shared immutable values: a flood of one-byte opcodes costs stack slots, not objects.
  PyValue* none_ = nullptr;
  PyValue* true_ = nullptr;
  PyValue* false_ = nullptr;
};

void Unpickler::set_item(PyValue& d, const PyValue* k, const PyValue* v) {
  adopt(d, k);
  adopt(d, v);
  const size_t next = d.dict.size();
  size_t at = next;
  if (k->kind == Kind::kStr)
    at = d.index->str.try_emplace(k->s, next).first->second;
  else if (k->kind == Kind::kInt)
    at = d.index->num.try_emplace(k->i, next).first->second;
  if (at == next)
    d.dict.emplace_back(k, v);
  else
    d.dict[at].second = v;  // as Python does: the first key object and its position stay
}

PyValue* Unpickler::persistent_load(const PyValue* pid) {
  // torch.save's persistent id of a storage: ("storage", storage class, key, location, numel).
  const auto& t = pid->items;
  if (pid->kind != Kind::kTuple || t.size() < 5 || t[0]->kind != Kind::kStr || t[0]->s != "storage" ||
      t[1]->kind != Kind::kGlobal || t[2]->kind != Kind::kStr || t[4]->kind != Kind::kInt)
    fail("unsupported persistent id in data.pkl (not a torch.save storage)");
  const std::string& key = t[2]->s;
  if (auto it = storages_.find(key); it != storages_.end()) return it->second;
  const StorageType* type = storage_type(t[1]->s);
  if (!type)
    fail("tensor storage of type " + printable(t[1]->s) +
         " is not supported (h5ddp stores float, int and bool tensors)");
  const int64_t numel = t[4]->i;
  const int64_t max_numel = std::numeric_limits<int64_t>::max() / static_cast<int64_t>(type->element_size);
  if (numel < 0 || numel > max_numel)
    fail("storage data/" + printable(key) + " declares " + std::to_string(numel) + " elements (damaged file?)");
  // Declared sizes: check_storage_records confirms them against the archive before anything is allocated.
  storage_bytes_ = saturating_add(storage_bytes_, static_cast<uint64_t>(numel) * type->element_size);
  PyValue* st = create(Kind::kStorage);
  st->storage =
      std::make_unique<PickledStorage>(PickledStorage{key, type->name, type->dtype, type->element_size, numel});
  storages_.emplace(key, st);
  pickle_.storages_.push_back(st);
  return st;
}

PyValue* Unpickler::rebuild_tensor(const std::vector<const PyValue*>& a) {
  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
  if (a.size() < 4 || a[0]->kind != Kind::kStorage || a[1]->kind != Kind::kInt || a[2]->kind != Kind::kTuple ||
      a[3]->kind != Kind::kTuple)
    fail("malformed torch._utils._rebuild_tensor_v2 arguments in data.pkl");
  const PickledStorage& storage = *a[0]->storage;
  auto info = std::make_unique<PickledTensor>();
  info->storage = a[0];
  info->offset = a[1]->i;
  // Lengths first: a memoized tuple of millions of strides, passed again and again, is no work.
  if (a[2]->items.size() > limits_.max_tensor_dims)
    fail("a tensor in data.pkl has " + std::to_string(a[2]->items.size()) + " dimensions (at most " +
         std::to_string(limits_.max_tensor_dims) + ")");
  if (a[2]->items.size() != a[3]->items.size()) fail("tensor size and stride differ in length in data.pkl");
  for (const auto* d : a[2]->items) {
    if (d->kind != Kind::kInt) fail("malformed tensor size in data.pkl");
    info->size.push_back(d->i);
  }
  for (const auto* d : a[3]->items) {
    if (d->kind != Kind::kInt) fail("malformed tensor stride in data.pkl");
    info->stride.push_back(d->i);
  }
  // The view must stay inside its storage before anything copies it out; every product and sum is
  // checked, since a hostile size can wrap around int64 back into the storage.
  const std::string where = "a tensor over storage data/" + printable(storage.key);
  bool empty = false;
  int64_t numel = 1, last = info->offset;
  bool overflow = false;
  for (size_t d = 0; d < info->size.size(); ++d) {
    if (info->size[d] < 0 || info->stride[d] < 0) fail(where + " has a negative size or stride");
    if (info->size[d] == 0) {
      empty = true;
      continue;
    }
    int64_t reach = 0;
    overflow |= __builtin_mul_overflow(numel, info->size[d], &numel);
    overflow |= __builtin_mul_overflow(info->size[d] - 1, info->stride[d], &reach);
    overflow |= __builtin_add_overflow(last, reach, &last);
  }
  if (overflow) fail(where + " has a size or stride too large for int64 (damaged file?)");
  if (empty) numel = 0;
  if (!empty && (info->offset < 0 || last >= storage.numel))
    fail(where + " reaches outside it (offset " + std::to_string(info->offset) + ", last element " +
         std::to_string(last) + ", storage of " + std::to_string(storage.numel) + " elements)");
  // Each tensor is copied out of its storage. Views that repeat elements (stride 0, as expand() makes) or
  // overlap can make the copies larger than the storages, i.e. than the file: by max_extra_tensor_bytes
  // at most. (A tensor the pickle refers to twice, like tied weights, is one value and one copy.)
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), storage.element_size, &bytes)) bytes = kMaxU64;
  if (bytes > saturating_add(storage_bytes_, limits_.max_extra_tensor_bytes) - tensor_bytes_)
    fail(where + " has " + std::to_string(numel) + " elements: copied out, the tensors would take more than their " +
         "storages' " + std::to_string(storage_bytes_) + " bytes plus " +
         std::to_string(limits_.max_extra_tensor_bytes) + " (views that repeat or overlap elements)");
  tensor_bytes_ += bytes;
  info->numel = numel;
  info->index = pickle_.tensors_.size();
  PyValue* t = create(Kind::kTensor);
  t->tensor = std::move(info);
  pickle_.tensors_.push_back(t);
  return t;
}

PyValue* Unpickler::call(const PyValue* callable, const PyValue* args) {
  // A loop, not recursion: _rebuild_from_type_v2 hands on to the call inside its arguments, which is
  // nested one level deeper each time, so this ends within max_depth rounds.
  while (true) {
    if (callable->kind != Kind::kGlobal) malformed("call of a " + callable->type_name());
    if (args->kind != Kind::kTuple) malformed("arguments are a " + args->type_name());
    const std::string& g = callable->s;
    const auto& a = args->items;
    if (g == "collections.OrderedDict" || g == "builtins.dict") {
      PyValue* d = create(Kind::kDict);
      if (!a.empty() && a[0]->kind == Kind::kList)  // OrderedDict([(k, v), ...])
        for (const PyValue* kv : a[0]->items) {
          if (kv->kind != Kind::kTuple || kv->items.size() != 2) fail("malformed OrderedDict items in data.pkl");
          set_item(*d, kv->items[0], kv->items[1]);
        }
      return d;
    }
    if (g == "torch._utils._rebuild_tensor_v2" || g == "torch._utils._rebuild_tensor") return rebuild_tensor(a);
    if (g == "torch._utils._rebuild_parameter" || g == "torch._utils._rebuild_parameter_with_state") {
      if (a.empty() || a[0]->kind != Kind::kTensor) fail("malformed " + g + " arguments in data.pkl");
      return own(a[0]);  // a Parameter's data; requires_grad and hooks do not cross into a checkpoint
    }
    // TorchScript's pickler (torch::pickle_save, as h5ddp-ckpt export writes): a container's static type rides
    // along as (value, "Dict[str, Tensor]"), and typed lists are built from plain ones. The values are what count.
    if (g == "torch.jit._pickle.restore_type_tag" || g == "torch.jit._pickle.build_intlist" ||
        g == "torch.jit._pickle.build_doublelist" || g == "torch.jit._pickle.build_boollist" ||
        g == "torch.jit._pickle.build_tensorlist" || g == "torch.jit._pickle.build_genericlist") {
      if (a.empty()) fail("malformed " + g + " arguments in data.pkl");
      return own(a[0]);
    }
    if (g == "torch._tensor._rebuild_from_type_v2") {  // (func, type, args, state): tensor subclasses
      if (a.size() < 3) fail("malformed " + g + " arguments in data.pkl");
      callable = a[0];
      args = a[2];
      continue;
    }
    fail("cannot read a pickled " + g +
         " (h5ddp-ckpt import reads dicts, lists, tuples, numbers, strings and tensors, as in a state dict)");
  }
}

Pickle Unpickler::run() {
  if (static_cast<uint64_t>(end_ - begin_) > limits_.max_pickle_bytes)
    over("is " + num(end_ - begin_) + " bytes, more than " + num(limits_.max_pickle_bytes));
  none_ = create(Kind::kNone);
  true_ = create(Kind::kBool);
  true_->b = true;
  false_ = create(Kind::kBool);
  while (true) {
    op_at_ = static_cast<size_t>(p_ - begin_);
    if (p_ == end_)
      fail("data.pkl is truncated (it ends at byte " + std::to_string(op_at_) + " without a STOP opcode)");
    op_ = static_cast<uint8_t>(*p_++);
    switch (op_) {
      case 0x80:  // PROTO
        read_le<uint8_t>();
        break;
      case 0x95:  // FRAME: a hint for buffered readers
        read_le<uint64_t>();
        break;
      case '.':  // STOP
        if (stack_.size() != 1) malformed(std::to_string(stack_.size()) + " values on the stack at STOP");
        pickle_.root_ = stack_.back();
        return std::move(pickle_);
      case '(':  // MARK
        if (marks_.size() >= limits_.max_depth) over("nests deeper than " + num(limits_.max_depth) + " levels");
        marks_.push_back(stack_.size());
        break;
      case '0':  // POP
        pop();
        break;
      case '1':  // POP_MARK
        pop_to_mark();
        break;
      case '2':  // DUP
        push(top());
        break;
      case 'N':
        push(none_);
        break;
      case 0x88:  // NEWTRUE
        push(true_);
        break;
      case 0x89:  // NEWFALSE
        push(false_);
        break;
      case 'J':  // BININT
        push_int(read_le<int32_t>());
        break;
      case 'K':  // BININT1
        push_int(read_le<uint8_t>());
        break;
      case 'M':  // BININT2
        push_int(read_le<uint16_t>());
        break;
      case 0x8a:    // LONG1
      case 0x8b: {  // LONG4
        const uint32_t n = op_ == 0x8a ? read_le<uint8_t>() : read_le<uint32_t>();
        if (n > 8) fail("integer too large for int64 in data.pkl");
        need(n);
        uint64_t v = 0;
        for (uint32_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p_[i])) << (8 * i);
        if (n > 0 && n < 8 && (static_cast<uint8_t>(p_[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);  // sign
        p_ += n;
        push_int(static_cast<int64_t>(v));
        break;
      }
      case 'I': {  // INT (protocol 0): "01"/"00" are booleans
        const std::string_view s = read_line();
        if (s == "01" || s == "00")
          push(s == "01" ? true_ : false_);
        else
          push_int(parse_number<int64_t>(s));
        break;
      }
      case 'G': {  // BINFLOAT, big endian
        need(8);
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(p_[i]);
        p_ += 8;
        PyValue* f = create(Kind::kFloat);
        std::memcpy(&f->f, &bits, 8);
        push(f);
        break;
      }
      case 'X':  // BINUNICODE
        push_str(read_string(read_le<uint32_t>()));
        break;
      case 0x8c:  // SHORT_BINUNICODE
        push_str(read_string(read_le<uint8_t>()));
        break;
      case 0x8d:  // BINUNICODE8
        push_str(read_string(read_le<uint64_t>()));
        break;
      case 'T':  // BINSTRING
      case 'B':  // BINBYTES
        push_str(read_string(read_le<uint32_t>()));
        break;
      case 'U':  // SHORT_BINSTRING
      case 'C':  // SHORT_BINBYTES
        push_str(read_string(read_le<uint8_t>()));
        break;
      case '}':  // EMPTY_DICT
        push(create(Kind::kDict));
        break;
      case ']':  // EMPTY_LIST
        push(create(Kind::kList));
        break;
      case ')':  // EMPTY_TUPLE
        push(create(Kind::kTuple));
        break;
      case 'd': {  // DICT
        const auto kv = pop_to_mark();
        PyValue* d = create(Kind::kDict);
        set_items(*d, kv);
        push(d);
        break;
      }
      case 'l':    // LIST
      case 't': {  // TUPLE
        const auto items = pop_to_mark();
        push(make_sequence(op_ == 'l' ? Kind::kList : Kind::kTuple, items));
        break;
      }
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        std::vector<PyValue*> items(op_ - 0x84);
        for (size_t i = items.size(); i-- > 0;) items[i] = pop();
        push(make_sequence(Kind::kTuple, items));
        break;
      }
      case 'a': {  // APPEND
        PyValue* v = pop();
        PyValue& list = changing(top(), Kind::kList, "APPEND");
        adopt(list, v);
        list.items.push_back(v);
        break;
      }
      case 'e': {  // APPENDS
        const auto items = pop_to_mark();
        PyValue& list = changing(top(), Kind::kList, "APPENDS");
        for (PyValue* v : items) {
          adopt(list, v);
          list.items.push_back(v);
        }
        break;
      }
      case 's': {  // SETITEM
        PyValue* v = pop();
        PyValue* k = pop();
        set_item(changing(top(), Kind::kDict, "SETITEM"), k, v);
        break;
      }
      case 'u': {  // SETITEMS
        const auto kv = pop_to_mark();
        set_items(changing(top(), Kind::kDict, "SETITEMS"), kv);
        break;
      }
      case 'c': {  // GLOBAL
        const std::string_view module = read_line();
        push_global(module, read_line());
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        const PyValue* name = pop();
        const PyValue* module = pop();
        if (name->kind != Kind::kStr || module->kind != Kind::kStr) malformed("STACK_GLOBAL of a non-str");
        push_global(module->s, name->s);
        break;
      }
      case 'R':     // REDUCE
      case 0x81: {  // NEWOBJ
        const PyValue* args = pop();
        const PyValue* callable = pop();
        push(call(callable, args));
        break;
      }
      case 'b': {  // BUILD: an OrderedDict's state is its _metadata attribute (state-dict versions): dropped
        pop();
        if (top()->kind != Kind::kDict && top()->kind != Kind::kTensor)
          fail("cannot read a pickled object of type " + top()->type_name() + " (BUILD)");
        break;
      }
      case 'Q':  // BINPERSID
        push(persistent_load(pop()));
        break;
      case 'q':  // BINPUT
        memo_put(read_le<uint8_t>(), top());
        break;
      case 'r':  // LONG_BINPUT
        memo_put(read_le<uint32_t>(), top());
        break;
      case 0x94:  // MEMOIZE
        memo_put(memo_size(), top());
        break;
      case 'p':  // PUT
        memo_put(parse_number<uint64_t>(read_line()), top());
        break;
      case 'h':  // BINGET
        push(memo_get(read_le<uint8_t>()));
        break;
      case 'j':  // LONG_BINGET
        push(memo_get(read_le<uint32_t>()));
        break;
      case 'g':  // GET
        push(memo_get(parse_number<uint64_t>(read_line())));
        break;
      default:
        fail("unsupported pickle opcode " + opcode_name(op_) + " at byte " + std::to_string(op_at_) + " of data.pkl");
    }
  }
}

Pickle unpickle(const std::string& file, const char* data, size_t size, const PickleLimits& limits) {
  return Unpickler(file, data, size, limits).run();
}

void check_storage_records(const std::string& file, const Pickle& pickle,
                           const std::function<std::optional<uint64_t>(const std::string& record)>& record_size) {
  for (const PyValue* v : pickle.storages()) {
    const PickledStorage& st = *v->storage;
    const std::string record = "data/" + st.key;
    const std::optional<uint64_t> size = record_size(record);
    if (!size) throw CheckpointError(file + ": archive has no record " + printable(record));
    const uint64_t want = static_cast<uint64_t>(st.numel) * st.element_size;  // no overflow: see persistent_load
    if (*size < want)
      throw CheckpointError(file + ": record " + printable(record) + " holds " + std::to_string(*size) +
                            " bytes, its storage needs " + std::to_string(want));
  }
}

}  // namespace h5ddp::interop
