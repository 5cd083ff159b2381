// What torch.load reads (PyTorchStreamReader on miniz): the zip's end record, the central
// directory's sizes and offsets (relative to the blob's start, which a DCP reader opens as a file
// view), and each record's local header. Local headers here carry their sizes (no data
// descriptor); the alignment padding is an extra field of the tensor's local header, as torch
// pads its own ("FB" and 'Z's). The tensor's CRC-32 is written as 0, as torch.save writes it
// under torch.serialization.set_crc32_options(False): torch.load does not check it (torch 1.13
// and 2.x load such a blob; tests/python/test_dcp_writer.py), and computing it would read every
// tensor byte once more on the host. The small records carry their real CRC.
#include "checkpoint/torch_save_writer.h"

#include <fmt/format.h>

#include <array>

#include "checkpoint/pickle_writer.h"

namespace ferry::checkpoint {

namespace {

constexpr std::uint64_t k32 = 0xFFFFFFFF;

void put(std::string& out, std::uint64_t v, unsigned n) {
  for (unsigned i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> 8 * i) & 0xFF));
}

std::uint32_t crc32(std::string_view bytes) {
  static const std::array<std::uint32_t, 256> kTable = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : bytes) c = kTable[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

struct Record {
  std::string name;
  std::uint64_t size = 0;
  std::uint32_t crc = 0;
  std::uint64_t local = 0;  // its local header, from the blob's start
};

bool needs_zip64(const Record& r) { return r.size >= k32 || r.local >= k32; }

// The local header of `r` at blob offset `r.local`, padded so that its data starts at a multiple
// of `alignment` of the file (the blob starts at `blob_offset`).
std::string local_header(const Record& r, std::uint64_t blob_offset, std::uint64_t alignment) {
  const bool z64 = r.size >= k32;
  std::string h;
  put(h, 0x04034b50, 4);
  put(h, z64 ? 45 : 20, 2);  // version needed
  put(h, 0x0800, 2);         // flags: UTF-8 names
  put(h, 0, 2);              // stored
  put(h, 0, 4);              // time, date
  put(h, r.crc, 4);
  put(h, z64 ? k32 : r.size, 4);
  put(h, z64 ? k32 : r.size, 4);
  put(h, r.name.size(), 2);
  const std::uint64_t zip64_extra = z64 ? 20 : 0;
  const std::uint64_t before_pad = blob_offset + r.local + 30 + r.name.size() + zip64_extra + 4;
  const std::uint64_t pad = (alignment - before_pad % alignment) % alignment;
  put(h, zip64_extra + 4 + pad, 2);
  h += r.name;
  if (z64) {
    put(h, 1, 2);
    put(h, 16, 2);
    put(h, r.size, 8);
    put(h, r.size, 8);
  }
  put(h, 0x4246, 2);  // "FB": torch's padding field
  put(h, pad, 2);
  h.append(pad, 'Z');
  return h;
}

std::string central_entry(const Record& r) {
  const bool big_size = r.size >= k32, big_local = r.local >= k32;
  std::string extra;
  if (big_size || big_local) {
    put(extra, 1, 2);
    put(extra, (big_size ? 16 : 0) + (big_local ? 8 : 0), 2);
    if (big_size) {
      put(extra, r.size, 8);
      put(extra, r.size, 8);
    }
    if (big_local) put(extra, r.local, 8);
  }
  std::string e;
  put(e, 0x02014b50, 4);
  put(e, 45, 2);                        // made by
  put(e, needs_zip64(r) ? 45 : 20, 2);  // needed
  put(e, 0x0800, 2);
  put(e, 0, 2);
  put(e, 0, 4);
  put(e, r.crc, 4);
  put(e, big_size ? k32 : r.size, 4);
  put(e, big_size ? k32 : r.size, 4);
  put(e, r.name.size(), 2);
  put(e, extra.size(), 2);
  put(e, 0, 2);  // comment
  put(e, 0, 2);  // disk
  put(e, 0, 2);  // internal attributes
  put(e, 0, 4);  // external attributes
  put(e, big_local ? k32 : r.local, 4);
  return e + r.name + extra;
}

// The central directory at blob offset `at` and the end records.
std::string directory(const std::vector<Record>& records, std::uint64_t at) {
  std::string d;
  for (const Record& r : records) d += central_entry(r);
  const std::uint64_t size = d.size();
  const bool z64 = at + size >= k32;
  if (z64) {
    const std::uint64_t record_at = at + size;
    put(d, 0x06064b50, 4);
    put(d, 44, 8);
    put(d, 45, 2);
    put(d, 45, 2);
    put(d, 0, 4);
    put(d, 0, 4);
    put(d, records.size(), 8);
    put(d, records.size(), 8);
    put(d, size, 8);
    put(d, at, 8);
    put(d, 0x07064b50, 4);
    put(d, 0, 4);
    put(d, record_at, 8);
    put(d, 1, 4);
  }
  put(d, 0x06054b50, 4);
  put(d, 0, 4);
  put(d, records.size(), 2);
  put(d, records.size(), 2);
  put(d, z64 ? k32 : size, 4);
  put(d, z64 ? k32 : at, 4);
  put(d, 0, 2);
  return d;
}

struct StorageName {
  Dtype dtype;
  const char* name;
};
constexpr std::array<StorageName, 11> kStorages{{
    {Dtype::kBool, "BoolStorage"},
    {Dtype::kU8, "ByteStorage"},
    {Dtype::kI8, "CharStorage"},
    {Dtype::kI16, "ShortStorage"},
    {Dtype::kI32, "IntStorage"},
    {Dtype::kI64, "LongStorage"},
    {Dtype::kF16, "HalfStorage"},
    {Dtype::kBF16, "BFloat16Storage"},
    {Dtype::kF32, "FloatStorage"},
    {Dtype::kF64, "DoubleStorage"},
    {Dtype::kC64, "ComplexFloatStorage"},
}};

// data.pkl: _rebuild_tensor_v2(('storage', torch.<Class>, '0', 'cpu', numel), 0, size, stride,
// False, OrderedDict()), as torch.save pickles a CPU tensor.
std::string data_pkl(const std::string& storage, std::span<const std::uint64_t> shape,
                     std::uint64_t numel) {
  PickleWriter p;
  p.global("torch._utils", "_rebuild_tensor_v2");
  p.mark();
  p.mark();
  p.str("storage");
  p.global("torch", storage);
  p.str("0");
  p.str("cpu");
  p.integer(static_cast<std::int64_t>(numel));
  p.tuple();
  p.persistent_id();
  p.integer(0);
  p.mark();
  for (std::uint64_t s : shape) p.integer(static_cast<std::int64_t>(s));
  p.tuple();
  std::vector<std::uint64_t> stride(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;) stride[d - 1] = stride[d] * shape[d];
  p.mark();
  for (std::uint64_t s : stride) p.integer(static_cast<std::int64_t>(s));
  p.tuple();
  p.boolean(false);
  p.global("collections", "OrderedDict");
  p.empty_tuple();
  p.reduce();
  p.tuple();
  p.reduce();
  return p.finish();
}

}  // namespace

std::string torch_storage_class(Dtype dtype) {
  for (const StorageName& s : kStorages) {
    if (s.dtype == dtype) return s.name;
  }
  return "";
}

ZipLayout torch_zip_layout(std::span<const ZipEntry> entries, std::uint64_t base_offset) {
  ZipLayout z;
  std::vector<Record> records;
  std::string* piece = nullptr;  // the records being gathered since the last external entry
  std::uint64_t at = 0;          // from the zip's start
  auto open_piece = [&] {
    if (piece == nullptr) {
      z.pieces.push_back({base_offset + at, ""});
      piece = &z.pieces.back().bytes;
    }
  };
  for (const ZipEntry& e : entries) {
    const std::uint64_t size = e.external ? e.size : e.bytes.size();
    records.push_back({e.name, size, e.external ? 0 : crc32(e.bytes), at});
    open_piece();
    const std::string h = local_header(records.back(), base_offset, e.alignment);
    *piece += h;
    at += h.size();
    z.data_offset.push_back(base_offset + at);
    at += size;
    if (e.external) {
      piece = nullptr;
    } else {
      *piece += e.bytes;
    }
  }
  open_piece();
  *piece += directory(records, at);
  z.length = z.pieces.back().offset - base_offset + piece->size();
  return z;
}

TorchSaveBlob torch_save_blob(const std::string& name, Dtype dtype,
                              std::span<const std::uint64_t> shape, std::uint64_t blob_offset,
                              std::uint64_t alignment) {
  const std::string storage = torch_storage_class(dtype);
  if (storage.empty()) {
    throw CheckpointError("", name,
                          fmt::format("dtype {} has no torch.save storage class that torch 1.13 "
                                      "and 2.x both load; ferry's DCP writer does not save it yet",
                                      to_string(dtype)));
  }
  std::uint64_t numel = 1;
  for (std::uint64_t s : shape) numel *= s;
  const std::uint64_t nbytes = numel * (dtype_bits(dtype) / 8);
  const ZipEntry entries[] = {
      {"archive/data.pkl", data_pkl(storage, shape, numel)},
      {"archive/byteorder", "little"},
      {"archive/data/0", "", true, nbytes, alignment},
      {"archive/version", "3\n"},
  };
  ZipLayout z = torch_zip_layout(entries, blob_offset);
  TorchSaveBlob b;
  b.head = std::move(z.pieces[0].bytes);
  b.data_offset = z.data_offset[2];
  b.tail = std::move(z.pieces[1].bytes);
  b.length = z.length;
  return b;
}

}  // namespace ferry::checkpoint
