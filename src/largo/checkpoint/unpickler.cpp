#include "unpickler.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <cstring>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace largo::checkpoint::detail {
namespace {

// Deeper nesting than any checkpoint has; refusing it keeps the recursive conversions and
// destructors of nested values off the end of the stack.
constexpr int kMaxDepth = 200;

struct TupleNode;

// An entry of the pickle machine's stack or memo. Tuples, globals and storages stay in this
// form until they are used: tuples may hold globals (a storage's type), which are not values.
struct Item {
  enum class Kind { Value, Global, Tuple, Storage };
  Kind kind = Kind::Value;
  c10::IValue value;                // Value; Storage: the c10::Storage
  std::string name;                 // Global: "module.name"
  std::shared_ptr<TupleNode> tuple; // Tuple (shared: a memo reference copies no elements)
  at::ScalarType dtype = at::kByte; // Storage
};

struct TupleNode {
  std::vector<Item> elements;
  int depth = 0;                        // nesting below it
  std::optional<c10::IValue> converted; // built once, however often it is referenced
};

Item value_item(c10::IValue value) {
  Item item;
  item.value = std::move(value);
  return item;
}

std::optional<at::ScalarType> storage_dtype(const std::string& global) {
  static const std::unordered_map<std::string, at::ScalarType> types = {
      {"torch.FloatStorage", at::kFloat},
      {"torch.DoubleStorage", at::kDouble},
      {"torch.HalfStorage", at::kHalf},
      {"torch.BFloat16Storage", at::kBFloat16},
      {"torch.LongStorage", at::kLong},
      {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort},
      {"torch.CharStorage", at::kChar},
      {"torch.ByteStorage", at::kByte},
      {"torch.BoolStorage", at::kBool},
      {"torch.ComplexFloatStorage", at::kComplexFloat},
      {"torch.ComplexDoubleStorage", at::kComplexDouble},
      {"torch.UntypedStorage", at::kByte},
      {"torch.storage.UntypedStorage", at::kByte}};
  auto it = types.find(global);
  return it == types.end() ? std::nullopt : std::optional<at::ScalarType>(it->second);
}

class Unpickler {
 public:
  Unpickler(std::string_view bytes, const StorageLoader& load) : bytes_(bytes), load_(load) {}

  c10::IValue run() {
    while (true) {
      const size_t at = position_;
      const auto opcode = static_cast<unsigned char>(read(1)[0]);
      if (opcode == '.') { // STOP
        if (stack_.size() != 1) {
          fail(at, fmt::format("the pickle ends with {} values instead of 1", stack_.size()));
        }
        c10::IValue result = to_value(stack_.back(), at);
        refine_untagged_types(result);
        return result;
      }
      step(opcode, at);
    }
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& what) const {
    throw UnpickleError(fmt::format("at byte {} of its pickle: {}", at, what));
  }

  std::string_view read(uint64_t n) {
    if (n > bytes_.size() - position_) {
      fail(position_, "the pickle ends early");
    }
    std::string_view out = bytes_.substr(position_, n);
    position_ += n;
    return out;
  }
  uint64_t read_le(size_t n) {
    std::string_view b = read(n);
    uint64_t value = 0;
    for (size_t i = 0; i < n; ++i) {
      value |= static_cast<uint64_t>(static_cast<unsigned char>(b[i])) << (8 * i);
    }
    return value;
  }

  Item pop(size_t at) {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      fail(at, "an instruction needs a value the pickle did not provide");
    }
    Item item = std::move(stack_.back());
    stack_.pop_back();
    return item;
  }
  Item& top(size_t at) {
    if (stack_.empty()) {
      fail(at, "an instruction needs a value the pickle did not provide");
    }
    return stack_.back();
  }
  size_t pop_mark(size_t at) {
    if (marks_.empty() || marks_.back() > stack_.size()) {
      fail(at, "a MARK is missing");
    }
    size_t start = marks_.back();
    marks_.pop_back();
    return start;
  }

  void step(unsigned char opcode, size_t at);
  void push_long(uint64_t length, size_t at);
  void push_tuple(size_t start, size_t at);
  void add_items(size_t start, size_t at, bool dict);
  void reduce(size_t at);
  void persistent_load(size_t at);
  Item call(const std::string& name, const std::vector<Item>& args, size_t at);
  Item rebuild_tensor(const std::vector<Item>& args, size_t at);
  Item restore_type_tag(const std::vector<Item>& args, size_t at);
  Item build_typed_list(const c10::TypePtr& type, const std::vector<Item>& args, size_t at);
  c10::IValue to_value(const Item& item, size_t at) const;
  int depth_of(const Item& item) const;
  void note_child(const c10::IValue& container, const Item& child, size_t at);
  void refine_untagged_types(const c10::IValue& root) const;

  std::string_view bytes_;
  const StorageLoader& load_;
  size_t position_ = 0;
  std::vector<Item> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Item> memo_;
  std::unordered_map<std::string, Item> storages_;       // by archive key
  std::unordered_map<const void*, int> container_depth_; // lists and dicts
  std::unordered_set<const void*> tagged_;               // containers with a type tag
};

void Unpickler::step(unsigned char opcode, size_t at) {
  switch (opcode) {
  case 0x80: // PROTO
    if (const auto version = read_le(1); version < 2 || version > 5) {
      fail(at, fmt::format("pickle protocol {} (torch files use 2 to 5)", version));
    }
    break;
  case 0x95: // FRAME (protocol 4): a length hint only
    read(8);
    break;
  case '(': // MARK
    marks_.push_back(stack_.size());
    break;
  case '}': // EMPTY_DICT
    stack_.push_back(value_item(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get())));
    break;
  case ']': // EMPTY_LIST
    stack_.push_back(value_item(c10::impl::GenericList(c10::AnyType::get())));
    break;
  case ')': // EMPTY_TUPLE
    push_tuple(stack_.size(), at);
    break;
  case 't': // TUPLE
    push_tuple(pop_mark(at), at);
    break;
  case 0x85: // TUPLE1
  case 0x86: // TUPLE2
  case 0x87: // TUPLE3
    if (stack_.size() < static_cast<size_t>(opcode - 0x84)) {
      fail(at, "a tuple needs more values than the pickle provided");
    }
    push_tuple(stack_.size() - (opcode - 0x84), at);
    break;
  case 'l': { // LIST
    const size_t start = pop_mark(at);
    stack_.insert(stack_.begin() + start, value_item(c10::impl::GenericList(c10::AnyType::get())));
    add_items(start + 1, at, /*dict=*/false);
    break;
  }
  case 'd': { // DICT
    const size_t start = pop_mark(at);
    stack_.insert(
        stack_.begin() + start,
        value_item(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get())));
    add_items(start + 1, at, /*dict=*/true);
    break;
  }
  case 'a': // APPEND
  case 's': // SETITEM
    add_items(
        stack_.size() - std::min<size_t>(stack_.size(), opcode == 'a' ? 1 : 2), at, opcode == 's');
    break;
  case 'e': // APPENDS
  case 'u': // SETITEMS
    add_items(pop_mark(at), at, opcode == 'u');
    break;
  case 'q': // BINPUT
  case 'r': // LONG_BINPUT
    memo_[read_le(opcode == 'q' ? 1 : 4)] = top(at);
    break;
  case 0x94: // MEMOIZE
    memo_[memo_.size()] = top(at);
    break;
  case 'h':   // BINGET
  case 'j': { // LONG_BINGET
    auto it = memo_.find(read_le(opcode == 'h' ? 1 : 4));
    if (it == memo_.end()) {
      fail(at, "it refers to a value it never stored");
    }
    stack_.push_back(it->second);
    break;
  }
  case 'N': // NONE
    stack_.push_back(value_item(c10::IValue()));
    break;
  case 0x88: // NEWTRUE
  case 0x89: // NEWFALSE
    stack_.push_back(value_item(opcode == 0x88));
    break;
  case 'K': // BININT1
    stack_.push_back(value_item(static_cast<int64_t>(read_le(1))));
    break;
  case 'M': // BININT2
    stack_.push_back(value_item(static_cast<int64_t>(read_le(2))));
    break;
  case 'J': // BININT
    stack_.push_back(value_item(static_cast<int64_t>(static_cast<int32_t>(read_le(4)))));
    break;
  case 0x8a: // LONG1
  case 0x8b: // LONG4
    push_long(read_le(opcode == 0x8a ? 1 : 4), at);
    break;
  case 'G': { // BINFLOAT, big endian
    uint64_t bits = 0;
    for (char c : read(8)) {
      bits = (bits << 8) | static_cast<unsigned char>(c);
    }
    double value = 0;
    std::memcpy(&value, &bits, sizeof value);
    stack_.push_back(value_item(value));
    break;
  }
  case 'X': // BINUNICODE
  case 'B': // BINBYTES
  case 'T': // BINSTRING
    stack_.push_back(value_item(std::string(read(read_le(4)))));
    break;
  case 0x8c: // SHORT_BINUNICODE
  case 'C':  // SHORT_BINBYTES
  case 'U':  // SHORT_BINSTRING
    stack_.push_back(value_item(std::string(read(read_le(1)))));
    break;
  case 0x8d: // BINUNICODE8
  case 0x8e: // BINBYTES8
    stack_.push_back(value_item(std::string(read(read_le(8)))));
    break;
  case 'c': { // GLOBAL: "module\nname\n"
    Item global;
    global.kind = Item::Kind::Global;
    for (int part = 0; part < 2; ++part) {
      const size_t end = bytes_.find('\n', position_);
      if (end == std::string_view::npos || end - position_ > 256) {
        fail(at, "a damaged GLOBAL instruction");
      }
      global.name += (part == 0 ? "" : ".") + std::string(read(end - position_));
      read(1);
    }
    stack_.push_back(std::move(global));
    break;
  }
  case 0x93: { // STACK_GLOBAL
    Item name = pop(at);
    Item module = pop(at);
    if (!name.value.isString() || !module.value.isString()) {
      fail(at, "a damaged STACK_GLOBAL instruction");
    }
    Item global;
    global.kind = Item::Kind::Global;
    global.name = module.value.toStringRef() + "." + name.value.toStringRef();
    stack_.push_back(std::move(global));
    break;
  }
  case 'R': // REDUCE
    reduce(at);
    break;
  case 'Q': // BINPERSID
    persistent_load(at);
    break;
  case 'b': { // BUILD: the attributes of an OrderedDict (a state_dict's _metadata)
    pop(at);
    const Item& target = top(at);
    if (target.kind != Item::Kind::Value || !target.value.isGenericDict()) {
      fail(at, "it holds a Python object with attributes, which Largo cannot read");
    }
    break;
  }
  case '0': // POP
    pop(at);
    break;
  case '1': // POP_MARK
    stack_.resize(pop_mark(at));
    break;
  case '2': // DUP
    stack_.push_back(top(at));
    break;
  default:
    fail(
        at,
        fmt::format(
            "instruction 0x{:02x} is not one torch files use (a damaged file, or "
            "a Python object Largo cannot read)",
            opcode));
  }
}

void Unpickler::push_long(uint64_t length, size_t at) {
  if (length > 8) {
    fail(at, "an integer beyond the 64-bit range");
  }
  uint64_t value = read_le(length);
  if (length > 0 && length < 8 && (value >> (8 * length - 1)) != 0) {
    value |= ~uint64_t{0} << (8 * length); // sign-extend the two's complement
  }
  stack_.push_back(value_item(static_cast<int64_t>(value)));
}

int Unpickler::depth_of(const Item& item) const {
  if (item.kind == Item::Kind::Tuple) {
    return item.tuple->depth;
  }
  if (item.kind == Item::Kind::Value && (item.value.isList() || item.value.isGenericDict())) {
    auto it = container_depth_.find(item.value.internalToPointer());
    return it == container_depth_.end() ? 0 : it->second;
  }
  return 0;
}

void Unpickler::note_child(const c10::IValue& container, const Item& child, size_t at) {
  if (child.kind == Item::Kind::Value && child.value.isSameIdentity(container)) {
    fail(at, "a container holds itself");
  }
  int& depth = container_depth_[container.internalToPointer()];
  depth = std::max(depth, depth_of(child) + 1);
  if (depth > kMaxDepth) {
    fail(at, fmt::format("values nested deeper than {} levels", kMaxDepth));
  }
}

void Unpickler::push_tuple(size_t start, size_t at) {
  Item tuple;
  tuple.kind = Item::Kind::Tuple;
  tuple.tuple = std::make_shared<TupleNode>();
  for (size_t i = start; i < stack_.size(); ++i) {
    tuple.tuple->depth = std::max(tuple.tuple->depth, depth_of(stack_[i]) + 1);
    tuple.tuple->elements.push_back(std::move(stack_[i]));
  }
  if (tuple.tuple->depth > kMaxDepth) {
    fail(at, fmt::format("values nested deeper than {} levels", kMaxDepth));
  }
  stack_.resize(start);
  stack_.push_back(std::move(tuple));
}

// APPEND(S) / SETITEM(S): the values from `start` on go into the container just below them.
void Unpickler::add_items(size_t start, size_t at, bool dict) {
  if (start == 0 || start > stack_.size() || (dict && (stack_.size() - start) % 2 != 0)) {
    fail(
        at,
        dict ? "a dict update without its dict or with an odd number of values"
             : "a list update without its list");
  }
  const Item& target = stack_[start - 1];
  if (target.kind != Item::Kind::Value ||
      (dict ? !target.value.isGenericDict() : !target.value.isList())) {
    fail(
        at,
        dict ? "it sets items on something that is not a dict"
             : "it appends to something that is not a list");
  }
  const c10::IValue container = target.value;
  for (size_t i = start; i < stack_.size(); i += dict ? 2 : 1) {
    note_child(container, stack_[i], at);
    if (!dict) {
      container.toList().push_back(to_value(stack_[i], at));
      continue;
    }
    note_child(container, stack_[i + 1], at);
    c10::IValue key = to_value(stack_[i], at);
    if (!key.isString() && !key.isInt() && !key.isDouble() && !key.isBool() && !key.isTensor()) {
      fail(
          at,
          fmt::format(
              "a dict key of type {} (torch files use strings and numbers)", key.tagKind()));
    }
    container.toGenericDict().insert_or_assign(std::move(key), to_value(stack_[i + 1], at));
  }
  stack_.resize(start);
}

c10::IValue Unpickler::to_value(const Item& item, size_t at) const {
  switch (item.kind) {
  case Item::Kind::Value:
    return item.value;
  case Item::Kind::Tuple: {
    if (!item.tuple->converted) {
      std::vector<c10::IValue> elements;
      elements.reserve(item.tuple->elements.size());
      for (const Item& element : item.tuple->elements) {
        elements.push_back(to_value(element, at));
      }
      item.tuple->converted = c10::ivalue::Tuple::create(std::move(elements));
    }
    return *item.tuple->converted;
  }
  case Item::Kind::Global:
    if (item.name.rfind("__torch__.", 0) == 0) {
      fail(
          at,
          "it is a TorchScript module (torch.jit.save), not a checkpoint; save its "
          "state_dict() with torch.save instead");
    }
    fail(
        at,
        fmt::format(
            "it holds a Python object ({}) that Largo cannot read; a checkpoint "
            "for Largo holds tensors, numbers, strings, lists, tuples and dicts",
            item.name));
  case Item::Kind::Storage:
    fail(at, "it holds a bare tensor storage, not a tensor");
  }
  return {};
}

void Unpickler::reduce(size_t at) {
  Item args = pop(at);
  Item callable = pop(at);
  if (callable.kind != Item::Kind::Global || args.kind != Item::Kind::Tuple) {
    fail(at, "a damaged REDUCE instruction");
  }
  stack_.push_back(call(callable.name, args.tuple->elements, at));
}

Item Unpickler::call(const std::string& name, const std::vector<Item>& args, size_t at) {
  const auto arg = [&](size_t i) -> const Item& {
    if (i >= args.size()) {
      fail(at, fmt::format("{} is called with {} arguments", name, args.size()));
    }
    return args[i];
  };
  if (name == "collections.OrderedDict") {
    return value_item(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
  }
  if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") {
    return rebuild_tensor(args, at);
  }
  if (name == "torch._utils._rebuild_parameter" ||
      name == "torch._utils._rebuild_parameter_with_state") {
    if (arg(0).kind != Item::Kind::Value || !arg(0).value.isTensor()) {
      fail(at, "a parameter without its tensor");
    }
    return arg(0); // an nn.Parameter's data; requires_grad and hooks do not apply here
  }
  if (name == "torch.jit._pickle.restore_type_tag") {
    return restore_type_tag(args, at);
  }
  static const std::unordered_map<std::string, c10::TypePtr> typed_lists = {
      {"torch.jit._pickle.build_intlist", c10::IntType::get()},
      {"torch.jit._pickle.build_doublelist", c10::FloatType::get()},
      {"torch.jit._pickle.build_boollist", c10::BoolType::get()},
      {"torch.jit._pickle.build_tensorlist", c10::TensorType::get()}};
  if (auto it = typed_lists.find(name); it != typed_lists.end()) {
    return build_typed_list(it->second, args, at);
  }
  if (name == "torch.Size") { // torch.Size((2, 3)) is a tuple of ints
    return arg(0);
  }
  Item global;
  global.kind = Item::Kind::Global;
  global.name = name;
  to_value(global, at); // throws: a Python object Largo cannot read
  return {};
}

void Unpickler::persistent_load(size_t at) {
  const Item id = pop(at);
  // ("storage", <torch.XStorage>, key, location, numel): the tensor data in "data/<key>".
  if (id.kind != Item::Kind::Tuple || id.tuple->elements.size() != 5) {
    fail(at, "a damaged tensor reference");
  }
  const std::vector<Item>& fields = id.tuple->elements;
  const bool well_formed =
      fields[0].value.isString() && fields[0].value.toStringRef() == "storage" &&
      fields[1].kind == Item::Kind::Global && fields[2].value.isString() && fields[4].value.isInt();
  if (!well_formed) {
    fail(at, "a damaged tensor reference");
  }
  const auto dtype = storage_dtype(fields[1].name);
  if (!dtype) {
    fail(at, fmt::format("a tensor storage of unknown type {}", fields[1].name));
  }
  const std::string& key = fields[2].value.toStringRef();
  const int64_t numel = fields[4].value.toInt();
  auto it = storages_.find(key);
  if (it == storages_.end()) {
    if (numel < 0) {
      fail(at, fmt::format("a tensor storage of {} elements", numel));
    }
    Item storage;
    storage.kind = Item::Kind::Storage;
    storage.dtype = *dtype;
    storage.value = c10::IValue(load_(key, *dtype, numel));
    it = storages_.emplace(key, std::move(storage)).first;
  } else if (it->second.dtype != *dtype) {
    fail(at, fmt::format("tensor storage '{}' is used with two element types", key));
  }
  stack_.push_back(it->second);
}

Item Unpickler::rebuild_tensor(const std::vector<Item>& args, size_t at) {
  // (storage, storage_offset, size, stride, ...): requires_grad, hooks and metadata do not
  // apply to a loaded state.
  const bool well_formed = args.size() >= 4 && args[0].kind == Item::Kind::Storage &&
                           args[1].value.isInt() && args[2].kind == Item::Kind::Tuple &&
                           args[3].kind == Item::Kind::Tuple &&
                           args[2].tuple->elements.size() == args[3].tuple->elements.size();
  if (!well_formed) {
    fail(at, "a damaged tensor record");
  }
  const std::vector<Item>& shape = args[2].tuple->elements;
  const std::vector<Item>& stride_items = args[3].tuple->elements;
  const c10::Storage storage = args[0].value.toStorage();
  const int64_t capacity = static_cast<int64_t>(storage.nbytes() / c10::elementSize(args[0].dtype));
  const int64_t offset = args[1].value.toInt();
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  // The last element the view reaches must lie inside the storage (checked without overflow).
  int64_t last = offset;
  bool empty = false;
  bool fits = offset >= 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    const c10::IValue& size = shape[d].value;
    const c10::IValue& stride = stride_items[d].value;
    if (!size.isInt() || !stride.isInt() || size.toInt() < 0 || stride.toInt() < 0) {
      fail(at, "a tensor with a damaged shape");
    }
    sizes.push_back(size.toInt());
    strides.push_back(stride.toInt());
    if (size.toInt() == 0) {
      empty = true;
      continue;
    }
    int64_t reach = 0;
    fits = fits && !__builtin_mul_overflow(size.toInt() - 1, stride.toInt(), &reach) &&
           !__builtin_add_overflow(last, reach, &last);
  }
  if (!empty && (!fits || last >= capacity)) {
    fail(
        at,
        fmt::format(
            "a tensor of shape [{}] reaches past its storage of {} elements",
            fmt::join(sizes, ", "),
            capacity));
  }
  at::Tensor tensor = at::empty({0}, at::TensorOptions().dtype(args[0].dtype));
  tensor.set_(storage, offset, sizes, strides);
  return value_item(tensor);
}

// The type annotations torch::pickle_save writes for its containers ("Dict[str, Tensor]",
// "List[str]"): builtin element types in Dict, List, Tuple and Optional. (libtorch's own
// parser returns mobile DynamicTypes, which typed accessors such as toIntVector reject.)
class TypeAnnotation {
 public:
  explicit TypeAnnotation(std::string_view text) : text_(text) {}
  c10::TypePtr parse() {
    c10::TypePtr type = parse_type(0);
    return type && position_ == text_.size() ? type : nullptr;
  }

 private:
  std::string_view word() {
    const size_t start = position_;
    while (position_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[position_])) != 0)) {
      ++position_;
    }
    return text_.substr(start, position_ - start);
  }
  bool accept(char c) {
    while (position_ < text_.size() && text_[position_] == ' ') {
      ++position_;
    }
    if (position_ < text_.size() && text_[position_] == c) {
      ++position_;
      return true;
    }
    return false;
  }
  c10::TypePtr parse_type(int depth) {
    static const std::unordered_map<std::string_view, c10::TypePtr> builtins = {
        {"str", c10::StringType::get()},
        {"int", c10::IntType::get()},
        {"float", c10::FloatType::get()},
        {"bool", c10::BoolType::get()},
        {"Tensor", c10::TensorType::get()},
        {"Any", c10::AnyType::get()},
        {"NoneType", c10::NoneType::get()}};
    accept(' ');
    const std::string_view name = word();
    if (auto it = builtins.find(name); it != builtins.end()) {
      return it->second;
    }
    if (depth > 16 || !accept('[')) {
      return nullptr;
    }
    std::vector<c10::TypePtr> contained;
    do {
      c10::TypePtr type = parse_type(depth + 1);
      if (!type) {
        return nullptr;
      }
      contained.push_back(std::move(type));
    } while (accept(','));
    if (!accept(']')) {
      return nullptr;
    }
    if (name == "List" && contained.size() == 1) {
      return c10::ListType::create(contained[0]);
    }
    if (name == "Dict" && contained.size() == 2) {
      return c10::DictType::create(contained[0], contained[1]);
    }
    if (name == "Optional" && contained.size() == 1) {
      return c10::OptionalType::create(contained[0]);
    }
    if (name == "Tuple") {
      return c10::TupleType::create(std::move(contained));
    }
    return nullptr;
  }

  std::string_view text_;
  size_t position_ = 0;
};

Item Unpickler::restore_type_tag(const std::vector<Item>& args, size_t at) {
  if (args.size() != 2 || args[0].kind != Item::Kind::Value || !args[1].value.isString()) {
    fail(at, "a damaged type tag");
  }
  const c10::IValue& container = args[0].value;
  const std::string& annotation = args[1].value.toStringRef();
  const c10::TypePtr type = TypeAnnotation(annotation).parse();
  if (!type) {
    fail(at, fmt::format("an unknown type tag '{}'", annotation.substr(0, 80)));
  }
  const auto check = [&](const c10::IValue& element, const c10::TypePtr& expected) {
    if (!element.type()->isSubtypeOf(*expected)) {
      fail(at, fmt::format("a {} whose elements do not match it", annotation));
    }
  };
  if (type->kind() == c10::DictType::Kind && container.isGenericDict()) {
    c10::impl::GenericDict dict = container.toGenericDict();
    for (const auto& entry : dict) {
      check(entry.key(), type->containedType(0));
      check(entry.value(), type->containedType(1));
    }
    dict.unsafeSetKeyType(type->containedType(0));
    dict.unsafeSetValueType(type->containedType(1));
  } else if (type->kind() == c10::ListType::Kind && container.isList()) {
    for (const c10::IValue& element : container.toListRef()) {
      check(element, type->containedType(0));
    }
    container.toList().unsafeSetElementType(type->containedType(0));
  } else {
    fail(at, fmt::format("a type tag {} on a {}", annotation, container.tagKind()));
  }
  tagged_.insert(container.internalToPointer());
  return args[0];
}

Item Unpickler::build_typed_list(
    const c10::TypePtr& type, const std::vector<Item>& args, size_t at) {
  if (args.size() != 1 || args[0].kind != Item::Kind::Value || !args[0].value.isList()) {
    fail(at, "a damaged typed list");
  }
  c10::impl::GenericList list = args[0].value.toList();
  for (const c10::IValue& element : list) {
    if (!element.type()->isSubtypeOf(*type)) {
      fail(at, fmt::format("a list of {} holding a {}", type->str(), element.tagKind()));
    }
  }
  list.unsafeSetElementType(type);
  tagged_.insert(args[0].value.internalToPointer());
  return args[0];
}

// The one type all `values` share among the scalar kinds and tensors, if any.
template <typename Values>
c10::TypePtr common_type(const Values& values) {
  c10::TypePtr common;
  for (const c10::IValue& value : values) {
    c10::TypePtr type;
    if (value.isTensor()) {
      type = c10::TensorType::get();
    } else if (value.isInt()) {
      type = c10::IntType::get();
    } else if (value.isDouble()) {
      type = c10::FloatType::get();
    } else if (value.isBool()) {
      type = c10::BoolType::get();
    } else if (value.isString()) {
      type = c10::StringType::get();
    }
    if (!type || (common && common != type)) {
      return nullptr;
    }
    common = type;
  }
  return common;
}

void Unpickler::refine_untagged_types(const c10::IValue& root) const {
  std::vector<c10::IValue> pending = {root};
  std::unordered_set<const void*> seen;
  while (!pending.empty()) {
    c10::IValue value = std::move(pending.back());
    pending.pop_back();
    if (!value.isList() && !value.isGenericDict() && !value.isTuple()) {
      continue;
    }
    if (!seen.insert(value.internalToPointer()).second) {
      continue;
    }
    const bool untagged = tagged_.count(value.internalToPointer()) == 0;
    if (value.isTuple()) {
      for (const auto& element : value.toTupleRef().elements()) {
        pending.push_back(element);
      }
    } else if (value.isList()) {
      c10::impl::GenericList list = value.toList();
      if (untagged && !list.empty()) {
        if (c10::TypePtr type = common_type(value.toListRef())) {
          list.unsafeSetElementType(type);
        }
      }
      pending.insert(pending.end(), list.begin(), list.end());
    } else {
      c10::impl::GenericDict dict = value.toGenericDict();
      std::vector<c10::IValue> keys;
      std::vector<c10::IValue> values;
      for (const auto& entry : dict) {
        keys.push_back(entry.key());
        values.push_back(entry.value());
      }
      if (untagged && !dict.empty()) {
        if (c10::TypePtr type = common_type(keys)) {
          dict.unsafeSetKeyType(type);
        }
        if (c10::TypePtr type = common_type(values)) {
          dict.unsafeSetValueType(type);
        }
      }
      pending.insert(pending.end(), values.begin(), values.end());
    }
  }
}

} // namespace

c10::IValue unpickle(std::string_view pickle, const StorageLoader& load_storage) {
  return Unpickler(pickle, load_storage).run();
}

} // namespace largo::checkpoint::detail
