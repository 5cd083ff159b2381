// torch.save's zip, as PyTorchStreamWriter (miniz) writes it: every entry stored, local headers
// with zero sizes and a data descriptor, zip64 end records, and the storages' local headers padded
// so that their bytes start 64-byte aligned. Sizes therefore come from the central directory,
// and a data start from its local header (whose extra field differs from the central one).
#include "checkpoint/torch_save_blob.h"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>

#include "checkpoint/pickle_reader.h"
#include "ferry/checkpoint.h"

namespace ferry::checkpoint {

namespace {

constexpr std::uint64_t kMaxDirectory = 16u << 20;
constexpr std::uint64_t kMaxDataPkl = 64u << 20;

std::uint64_t le(std::string_view b, std::size_t at, unsigned n) {
  std::uint64_t v = 0;
  for (unsigned i = 0; i < n; ++i)
    v |= std::uint64_t{static_cast<unsigned char>(b[at + i])} << 8 * i;
  return v;
}

struct Entry {
  std::string name;
  unsigned method = 0;
  std::uint64_t size = 0;
  std::uint64_t local = 0;  // the local header, from the blob's start
};

class Blob {
 public:
  Blob(const ReadAt& read, std::uint64_t offset, std::uint64_t length, const std::string& file)
      : read_(read), offset_(offset), length_(length), file_(file) {}

  [[noreturn]] void fail(std::uint64_t at, const std::string& why) const {
    throw CheckpointError(file_, "",
                          fmt::format("torch.save blob at offset {} (+{} B): offset {}: {}",
                                      offset_, length_, offset_ + at, why));
  }
  // Bytes [at, at + n) of the blob, refused when they pass its end.
  std::string get(std::uint64_t at, std::uint64_t n) const {
    if (at > length_ || n > length_ - at) {
      fail(at, fmt::format("needs {} B, past the blob's end: truncated or not a zip", n));
    }
    std::string out = read_(offset_ + at, n);
    if (out.size() != n) fail(at, "the file ended early");
    return out;
  }

  std::vector<Entry> directory() const {
    const std::uint64_t tail_at = length_ > kTorchSaveTailBytes ? length_ - kTorchSaveTailBytes : 0;
    const std::string tail = get(tail_at, length_ - tail_at);
    std::size_t eocd = std::string_view::npos;
    for (std::size_t i = tail.size() >= 22 ? tail.size() - 22 + 1 : 0; i-- > 0;) {
      if (tail.compare(i, 4, "PK\5\6") == 0 && le(tail, i + 20, 2) == tail.size() - i - 22) {
        eocd = i;
        break;
      }
    }
    if (eocd == std::string_view::npos) fail(tail_at, "no zip end record in the blob's last bytes");
    std::uint64_t count = le(tail, eocd + 10, 2);
    std::uint64_t size = le(tail, eocd + 12, 4);
    std::uint64_t at = le(tail, eocd + 16, 4);
    if (count == 0xFFFF || size == 0xFFFFFFFF || at == 0xFFFFFFFF) {
      if (eocd < 20 || tail.compare(eocd - 20, 4, "PK\6\7") != 0) {
        fail(tail_at + eocd, "zip64 sizes without a zip64 locator");
      }
      const std::uint64_t z64 = le(tail, eocd - 20 + 8, 8);
      const std::string rec = get(z64, 56);
      if (rec.compare(0, 4, "PK\6\6") != 0) fail(z64, "no zip64 end record where its locator says");
      count = le(rec, 32, 8);
      size = le(rec, 40, 8);
      at = le(rec, 48, 8);
    }
    if (size > kMaxDirectory) fail(at, fmt::format("a central directory of {} B", size));
    const std::string dir = get(at, size);
    std::vector<Entry> out;
    std::size_t p = 0;
    for (std::uint64_t k = 0; k < count; ++k) {
      if (dir.size() - p < 46 || dir.compare(p, 4, "PK\1\2") != 0) {
        fail(at + p, "not a central directory entry");
      }
      const std::uint64_t name_len = le(dir, p + 28, 2), extra_len = le(dir, p + 30, 2);
      const std::uint64_t comment_len = le(dir, p + 32, 2);
      if (dir.size() - p - 46 < name_len + extra_len + comment_len) {
        fail(at + p, "a central directory entry past the directory's end");
      }
      Entry e{dir.substr(p + 46, name_len), static_cast<unsigned>(le(dir, p + 10, 2)),
              le(dir, p + 24, 4), le(dir, p + 42, 4)};
      // Zip64 extra field: the 64-bit values of the 32-bit fields that hold 0xFFFFFFFF, in order.
      const std::uint64_t csize = le(dir, p + 20, 4);
      for (std::size_t x = p + 46 + name_len; x + 4 <= p + 46 + name_len + extra_len;) {
        const std::uint64_t id = le(dir, x, 2), n = le(dir, x + 2, 2);
        if (x + 4 + n > p + 46 + name_len + extra_len) break;
        if (id == 1) {
          std::size_t f = x + 4;
          auto next = [&](std::uint64_t& field) {
            if (field != 0xFFFFFFFF) return;
            if (f + 8 > x + 4 + n) fail(at + x, "a zip64 field too short");
            field = le(dir, f, 8);
            f += 8;
          };
          std::uint64_t compressed = csize;
          next(e.size);
          next(compressed);
          next(e.local);
        }
        x += 4 + n;
      }
      out.push_back(std::move(e));
      p += 46 + name_len + extra_len + comment_len;
    }
    return out;
  }

  // Where an entry's bytes start, from its local header, and that they lie inside the blob.
  std::uint64_t data_start(const Entry& e) const {
    if (e.method != 0) {
      fail(e.local,
           fmt::format("entry '{}' is compressed (method {}); only stored entries are read", e.name,
                       e.method));
    }
    const std::string h = get(e.local, 30);
    if (h.compare(0, 4, "PK\3\4") != 0)
      fail(e.local, fmt::format("no local header for '{}'", e.name));
    const std::uint64_t start = e.local + 30 + le(h, 26, 2) + le(h, 28, 2);
    if (start > length_ || e.size > length_ - start) {
      fail(e.local, fmt::format("entry '{}' ({} B) passes the blob's end", e.name, e.size));
    }
    return start;
  }

  std::uint64_t offset() const { return offset_; }

 private:
  const ReadAt& read_;
  std::uint64_t offset_;
  std::uint64_t length_;
  const std::string& file_;
};

std::vector<std::uint64_t> ints(const PickleValue* v, const Blob& blob, std::uint64_t at,
                                const char* what) {
  if (v == nullptr || v->kind != PickleValue::Kind::kTuple) {
    blob.fail(at, fmt::format("data.pkl: the tensor's {} is not a tuple", what));
  }
  std::vector<std::uint64_t> out;
  for (const PickleRef& i : v->items) {
    if (i->kind != PickleValue::Kind::kInt || i->integer < 0) {
      blob.fail(at, fmt::format("data.pkl: the tensor's {} holds a value not a size", what));
    }
    out.push_back(static_cast<std::uint64_t>(i->integer));
  }
  return out;
}

}  // namespace

bool torch_save_class_allowed(std::string_view name) {
  if (name == "torch._utils._rebuild_tensor_v2" || name == "collections.OrderedDict" ||
      name == "torch.storage.UntypedStorage") {
    return true;
  }
  // The typed storages: torch.FloatStorage, torch.BFloat16Storage...
  return name.starts_with("torch.") && name.ends_with("Storage") &&
         name.find('.', 6) == std::string_view::npos && name.size() > 13;
}

TorchTensorRecord read_torch_save_tensor(const ReadAt& read, std::uint64_t blob_offset,
                                         std::uint64_t blob_length, const std::string& file) {
  const Blob blob(read, blob_offset, blob_length, file);
  const std::vector<Entry> entries = blob.directory();
  const Entry* pkl = nullptr;
  for (const Entry& e : entries) {
    if (e.name == "data.pkl" || e.name.ends_with("/data.pkl")) pkl = &e;
  }
  if (pkl == nullptr) blob.fail(0, "no data.pkl entry: not a torch.save blob");
  if (pkl->size > kMaxDataPkl) blob.fail(pkl->local, fmt::format("data.pkl of {} B", pkl->size));
  const std::uint64_t pkl_at = blob.data_start(*pkl);
  const PickleRef root = read_pickle(blob.get(pkl_at, pkl->size), torch_save_class_allowed, file,
                                     blob_offset + pkl_at);
  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, hooks[, metadata])
  if (!root->is_class("torch._utils._rebuild_tensor_v2") || root->args->items.size() < 4) {
    blob.fail(pkl_at, "data.pkl does not hold one tensor (_rebuild_tensor_v2)");
  }
  const auto& args = root->args->items;
  const PickleValue& pid = *args[0];
  const PickleValue* id = pid.items.empty() ? nullptr : pid.items[0].get();
  if (pid.kind != PickleValue::Kind::kPersistentId || id->kind != PickleValue::Kind::kTuple ||
      id->items.size() < 3 || id->items[1]->kind != PickleValue::Kind::kClass ||
      id->items[2]->kind != PickleValue::Kind::kStr) {
    blob.fail(pkl_at, "data.pkl: the tensor's storage is not ('storage', class, key, ...)");
  }
  if (args[1]->kind != PickleValue::Kind::kInt || args[1]->integer < 0) {
    blob.fail(pkl_at, "data.pkl: the tensor's storage offset is not a size");
  }
  TorchTensorRecord out;
  out.storage_class = id->items[1]->text;
  out.storage_offset = static_cast<std::uint64_t>(args[1]->integer);
  out.size = ints(args[2].get(), blob, pkl_at, "size");
  out.stride = ints(args[3].get(), blob, pkl_at, "stride");
  if (out.size.size() != out.stride.size())
    blob.fail(pkl_at, "data.pkl: size and stride differ in rank");
  const std::string prefix = pkl->name.substr(0, pkl->name.size() - 8);  // "archive/"
  const std::string data_name = prefix + "data/" + id->items[2]->text;
  for (const Entry& e : entries) {
    if (e.name != data_name) continue;
    out.data_offset = blob_offset + blob.data_start(e);
    out.data_length = e.size;
    return out;
  }
  blob.fail(0, fmt::format("no entry '{}' for the storage data.pkl names", data_name));
}

std::vector<TorchSaveEntry> read_torch_save_entries(const ReadAt& read, std::uint64_t blob_offset,
                                                    std::uint64_t blob_length,
                                                    const std::string& file) {
  const Blob blob(read, blob_offset, blob_length, file);
  const std::vector<Entry> entries = blob.directory();
  if (std::none_of(entries.begin(), entries.end(), [](const Entry& e) {
        return e.name == "data.pkl" || e.name.ends_with("/data.pkl");
      })) {
    blob.fail(0, "no data.pkl entry: not a torch.save file");
  }
  std::vector<TorchSaveEntry> out;
  out.reserve(entries.size());
  for (const Entry& e : entries) out.push_back({e.name, blob_offset + blob.data_start(e), e.size});
  return out;
}

}  // namespace ferry::checkpoint
