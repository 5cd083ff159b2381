// The pickle VM. It keeps Python's semantics for the opcodes it knows, with two restrictions
// that keep garbage from becoming undefined behaviour or unbounded work: a value stops changing
// once it is inside another (so no cycle can form, and destruction recurses at most
// kMaxPickleDepth deep), and the memo holds at most kMaxPickleMemo values.
#include "checkpoint/pickle_reader.h"

#include <fmt/format.h>

#include <bit>
#include <cstring>
#include <unordered_map>

#include "ferry/checkpoint.h"

namespace ferry {

const PickleValue* PickleValue::get(std::string_view key) const {
  const PickleValue* dict = kind == Kind::kObject && state ? state.get() : this;
  if (dict->kind != Kind::kDict) return nullptr;
  // Python keeps the last value of a repeated key.
  for (std::size_t i = dict->items.size(); i >= 2; i -= 2) {
    const PickleValue& k = *dict->items[i - 2];
    if (k.kind == Kind::kStr && k.text == key) return dict->items[i - 1].get();
  }
  return nullptr;
}

bool PickleValue::is_class(std::string_view name) const {
  return kind == Kind::kObject && cls && cls->text == name;
}

}  // namespace ferry

namespace ferry::checkpoint {

namespace {

using Value = PickleValue;
using Kind = PickleValue::Kind;
using Mutable = std::shared_ptr<PickleValue>;

class Vm {
 public:
  Vm(std::string_view bytes, const PickleAllowList& allowed, const std::string& file,
     std::uint64_t base)
      : bytes_(bytes), allowed_(allowed), file_(file), base_(base) {}

  PickleRef run() {
    for (;;) {
      op_at_ = pos_;
      const auto op = static_cast<unsigned char>(take(1)[0]);
      if (op == '.') {
        if (stack_.size() != 1 || !marks_.empty()) fail("STOP with a stack that is not one value");
        return stack_.back();
      }
      step(op);
    }
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw CheckpointError(file_, "", fmt::format("pickle offset {}: {}", base_ + op_at_, why));
  }

  std::string_view take(std::uint64_t n) {
    if (n > bytes_.size() - pos_) {
      throw CheckpointError(file_, "",
                            fmt::format("pickle offset {}: truncated: needs {} B, {} left",
                                        base_ + pos_, n, bytes_.size() - pos_));
    }
    std::string_view out = bytes_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  std::uint64_t little(unsigned n) {
    std::string_view b = take(n);
    std::uint64_t v = 0;
    for (unsigned i = 0; i < n; ++i) v |= std::uint64_t{static_cast<unsigned char>(b[i])} << 8 * i;
    return v;
  }
  std::string_view line() {
    const std::size_t end = bytes_.find('\n', pos_);
    if (end == std::string_view::npos) take(bytes_.size() - pos_ + 1);  // truncated
    const std::size_t n = end - pos_;
    return take(n + 1).substr(0, n);
  }

  Mutable make(Kind kind) {
    auto v = std::make_shared<Value>();
    v->kind = kind;
    return v;
  }
  Mutable pop() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) fail("pops an empty stack");
    Mutable v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  Mutable& top() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) fail("reads an empty stack");
    return stack_.back();
  }
  std::vector<Mutable> pop_mark() {
    if (marks_.empty()) fail("no MARK to pop to");
    std::vector<Mutable> out(std::make_move_iterator(stack_.begin() + marks_.back()),
                             std::make_move_iterator(stack_.end()));
    stack_.resize(marks_.back());
    marks_.pop_back();
    return out;
  }
  void push(Mutable v) { stack_.push_back(std::move(v)); }

  // `child` goes inside `parent`: it is frozen from now on, and bounds the parent's depth.
  void adopt(Value& parent, const Mutable& child) {
    if (child.get() == &parent || frozen_.contains(&parent)) {
      fail("changes a value already inside another (a cycle)");
    }
    frozen_.emplace(child.get(), child);
    parent.depth = std::max(parent.depth, child->depth + 1);
    if (parent.depth > kMaxPickleDepth) fail(fmt::format("nests deeper than {}", kMaxPickleDepth));
  }
  Mutable container(Kind kind, std::vector<Mutable> items) {
    Mutable v = make(kind);
    for (const Mutable& item : items) adopt(*v, item);
    v->items.assign(items.begin(), items.end());
    return v;
  }
  void append(const Mutable& list, std::vector<Mutable> items) {
    if (list->kind != Kind::kList) fail("APPEND to something not a list");
    for (const Mutable& item : items) adopt(*list, item);
    list->items.insert(list->items.end(), items.begin(), items.end());
  }
  // Into a dict, or an object (OrderedDict(), then its items: Python calls its __setitem__).
  void set_items(const Mutable& dict, std::vector<Mutable> items) {
    if (dict->kind != Kind::kDict && dict->kind != Kind::kObject) {
      fail("SETITEM on something not a dict");
    }
    if (items.size() % 2 != 0) fail("SETITEMS with a key and no value");
    for (const Mutable& item : items) adopt(*dict, item);
    dict->items.insert(dict->items.end(), items.begin(), items.end());
  }
  Mutable global(std::string name) {
    if (!allowed_(name)) {
      fail(fmt::format("refuses class {}: not one that this checkpoint format writes", name));
    }
    Mutable v = make(Kind::kClass);
    v->text = std::move(name);
    return v;
  }
  Mutable object(Mutable cls, Mutable args) {
    if (cls->kind != Kind::kClass) fail("calls something that is not an allowed class");
    if (args->kind != Kind::kTuple) fail("calls a class with arguments that are not a tuple");
    Mutable v = make(Kind::kObject);
    adopt(*v, cls);
    adopt(*v, args);
    v->cls = std::move(cls);
    v->args = std::move(args);
    return v;
  }
  Mutable text(Kind kind, std::uint64_t n) {
    Mutable v = make(kind);
    v->text = take(n);
    return v;
  }
  Mutable integer(std::int64_t i) {
    Mutable v = make(Kind::kInt);
    v->integer = i;
    return v;
  }
  void memo_put(std::uint64_t key) {
    if (memo_.size() >= kMaxPickleMemo && !memo_.contains(key)) {
      fail(fmt::format("memoizes more than {} values", kMaxPickleMemo));
    }
    memo_[key] = top();
  }
  void memo_get(std::uint64_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) fail(fmt::format("memo key {} was never stored", key));
    push(it->second);
  }

  void step(unsigned char op) {
    switch (op) {
      case 0x80:
        little(1);
        return;  // PROTO
      case 0x95:
        little(8);
        return;  // FRAME: a hint only
      case '(':
        marks_.push_back(stack_.size());
        return;
      case '0':
        pop();
        return;
      case '1':
        pop_mark();
        return;
      case '2':
        push(top());
        return;
      case 'N':
        push(make(Kind::kNone));
        return;
      case 0x88:
      case 0x89: {
        Mutable v = make(Kind::kBool);
        v->boolean = op == 0x88;
        push(std::move(v));
        return;
      }
      case 'K':
        push(integer(static_cast<std::int64_t>(little(1))));
        return;
      case 'M':
        push(integer(static_cast<std::int64_t>(little(2))));
        return;
      case 'J':
        push(integer(static_cast<std::int32_t>(little(4))));
        return;
      case 0x8a: {  // LONG1: little-endian two's complement
        const unsigned n = static_cast<unsigned>(little(1));
        if (n > 8) fail(fmt::format("an integer of {} B, more than 8", n));
        std::uint64_t v = n == 0 ? 0 : little(n);
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) != 0) v |= ~std::uint64_t{0} << 8 * n;
        push(integer(static_cast<std::int64_t>(v)));
        return;
      }
      case 'G': {  // BINFLOAT: big-endian
        std::uint64_t bits = 0;
        for (char c : take(8)) bits = bits << 8 | static_cast<unsigned char>(c);
        Mutable v = make(Kind::kFloat);
        v->real = std::bit_cast<double>(bits);
        push(std::move(v));
        return;
      }
      case 0x8c:  // SHORT_BINUNICODE; SHORT_BINSTRING (protocol 2's str), read as text too
      case 'U':
        push(text(Kind::kStr, little(1)));
        return;
      case 'X':  // BINUNICODE, BINSTRING
      case 'T':
        push(text(Kind::kStr, little(4)));
        return;
      case 0x8d:
        push(text(Kind::kStr, little(8)));
        return;
      case 'C':
        push(text(Kind::kBytes, little(1)));
        return;
      case 'B':
        push(text(Kind::kBytes, little(4)));
        return;
      case 0x8e:
        push(text(Kind::kBytes, little(8)));
        return;
      case ')':
        push(make(Kind::kTuple));
        return;
      case 't':
        push(container(Kind::kTuple, pop_mark()));
        return;
      case 0x85:
      case 0x86:
      case 0x87: {
        std::vector<Mutable> items(op - 0x84);
        for (auto it = items.rbegin(); it != items.rend(); ++it) *it = pop();
        push(container(Kind::kTuple, std::move(items)));
        return;
      }
      case ']':
        push(make(Kind::kList));
        return;
      case 'l':
        push(container(Kind::kList, pop_mark()));
        return;
      case 'a': {
        Mutable item = pop();
        append(top(), {std::move(item)});
        return;
      }
      case 'e': {
        std::vector<Mutable> items = pop_mark();
        append(top(), std::move(items));
        return;
      }
      case '}':
        push(make(Kind::kDict));
        return;
      case 'd': {
        Mutable dict = make(Kind::kDict);
        set_items(dict, pop_mark());
        push(std::move(dict));
        return;
      }
      case 's': {
        Mutable value = pop();
        Mutable key = pop();
        set_items(top(), {std::move(key), std::move(value)});
        return;
      }
      case 'u': {
        std::vector<Mutable> items = pop_mark();
        set_items(top(), std::move(items));
        return;
      }
      case 'c': {
        std::string module(line());
        std::string name(line());
        push(global(module + "." + name));
        return;
      }
      case 0x93: {
        Mutable name = pop();
        Mutable module = pop();
        if (module->kind != Kind::kStr || name->kind != Kind::kStr) {
          fail("STACK_GLOBAL of something not two strings");
        }
        push(global(module->text + "." + name->text));
        return;
      }
      case 'R':
      case 0x81: {
        Mutable args = pop();
        Mutable cls = pop();
        push(object(std::move(cls), std::move(args)));
        return;
      }
      case 'b': {
        Mutable state = pop();
        Mutable& target = top();
        if (target->kind != Kind::kObject || target->state)
          fail("BUILD on something not a fresh object");
        adopt(*target, state);
        target->state = std::move(state);
        return;
      }
      case 'Q': {
        Mutable id = make(Kind::kPersistentId);
        Mutable pid = pop();
        adopt(*id, pid);
        id->items.push_back(std::move(pid));
        push(std::move(id));
        return;
      }
      case 'h':
        memo_get(little(1));
        return;
      case 'j':
        memo_get(little(4));
        return;
      case 'q':
        memo_put(little(1));
        return;
      case 'r':
        memo_put(little(4));
        return;
      case 0x94:
        memo_put(memo_.size());
        return;
      default:
        fail(fmt::format("unknown or unsupported opcode 0x{:02x}", op));
    }
  }

  std::string_view bytes_;
  const PickleAllowList& allowed_;
  const std::string& file_;
  std::uint64_t base_;
  std::size_t pos_ = 0;
  std::size_t op_at_ = 0;
  std::vector<Mutable> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<std::uint64_t, Mutable> memo_;
  // Values inside another, held so that no new value reuses a frozen one's address.
  std::unordered_map<const Value*, Mutable> frozen_;
};

}  // namespace

PickleRef read_pickle(std::string_view bytes, const PickleAllowList& allowed,
                      const std::string& file, std::uint64_t base) {
  return Vm(bytes, allowed, file, base).run();
}

}  // namespace ferry::checkpoint
