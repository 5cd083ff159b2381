// Opcodes as pickletools lists them (protocol 2); integers little-endian.
#include "checkpoint/pickle_writer.h"

namespace ferry::checkpoint {

namespace {

void put_le(std::string& out, std::uint64_t v, unsigned n) {
  for (unsigned i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> 8 * i) & 0xFF));
}

}  // namespace

PickleWriter::PickleWriter() : out_("\x80\x02", 2) {}

void PickleWriter::global(std::string_view module, std::string_view name) {
  out_ += 'c';
  out_ += module;
  out_ += '\n';
  out_ += name;
  out_ += '\n';
}

void PickleWriter::mark() { out_ += '('; }
void PickleWriter::tuple() { out_ += 't'; }
void PickleWriter::empty_tuple() { out_ += ')'; }
void PickleWriter::empty_dict() { out_ += '}'; }
void PickleWriter::set_items() { out_ += 'u'; }
void PickleWriter::empty_list() { out_ += ']'; }
void PickleWriter::appends() { out_ += 'e'; }
void PickleWriter::boolean(bool v) { out_ += v ? '\x88' : '\x89'; }
void PickleWriter::none() { out_ += 'N'; }
void PickleWriter::persistent_id() { out_ += 'Q'; }
void PickleWriter::reduce() { out_ += 'R'; }
void PickleWriter::new_object() { out_ += '\x81'; }
void PickleWriter::build() { out_ += 'b'; }

void PickleWriter::integer(std::int64_t v) {
  if (v >= 0 && v < 0x100) {
    out_ += 'K';  // BININT1
    put_le(out_, static_cast<std::uint64_t>(v), 1);
  } else if (v >= 0 && v < 0x10000) {
    out_ += 'M';  // BININT2
    put_le(out_, static_cast<std::uint64_t>(v), 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    out_ += 'J';  // BININT, signed
    put_le(out_, static_cast<std::uint32_t>(static_cast<std::int32_t>(v)), 4);
  } else {
    out_ += '\x8a';  // LONG1: 8 bytes of two's complement
    out_ += '\x08';
    put_le(out_, static_cast<std::uint64_t>(v), 8);
  }
}

void PickleWriter::str(std::string_view s) {
  out_ += 'X';  // BINUNICODE
  put_le(out_, s.size(), 4);
  out_ += s;
}

std::string PickleWriter::finish() {
  out_ += '.';
  return std::move(out_);
}

}  // namespace ferry::checkpoint
