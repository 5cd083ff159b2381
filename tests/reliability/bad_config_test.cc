// cufile.json inputs the platform suite (tests/platform/cufile_config_test.cc: malformed, empty,
// huge, not UTF-8, wrong types, unreadable) does not try, found by fuzzing (tests/fuzz). Every
// one must come back as a state with a reason, never as an exception.
#include <gtest/gtest.h>

#include <string>

#include "platform/cufile_config.h"

namespace ferry::platform {
namespace {

// Regression: tests/fuzz/corpus/cufile_json/regression-number-overflow-throws. nlohmann throws
// out_of_range (406), not parse_error, for a number beyond double; it escaped the parser.
TEST(BadCufileJson, NumberTooLargeForADoubleIsMalformedNotAnException) {
  CufileConfig c;
  EXPECT_NO_THROW(c = parse_cufile_config(R"({"execution": {"max_io_threads": 3E603}})", {}));
  EXPECT_EQ(c.state, CufileFileState::kMalformed) << c.state_detail;
  EXPECT_FALSE(c.max_io_threads.value.has_value());
}

// Regression: tests/fuzz/corpus/cufile_json/regression-unterminated-comment-offset-past-end.
// nlohmann counts past the end of an unterminated comment; the offset must stay in the text.
TEST(BadCufileJson, ParseErrorOffsetStaysInsideTheText) {
  const std::string text = "//\x12";
  CufileConfig c = parse_cufile_config(text, {});
  EXPECT_EQ(c.state, CufileFileState::kMalformed);
  ASSERT_TRUE(c.parse_error.has_value());
  EXPECT_LE(c.parse_error->byte_offset, text.size());
}

TEST(BadCufileJson, DeepNestingIsMalformedWithoutExhaustingTheStack) {
  std::string text(100000, '[');
  CufileConfig c = parse_cufile_config(text, {});
  EXPECT_EQ(c.state, CufileFileState::kMalformed);
  std::string closed = text + std::string(100000, ']');
  c = parse_cufile_config(closed, {});
  EXPECT_EQ(c.state, CufileFileState::kMalformed) << "a top-level array is not a configuration";
}

TEST(BadCufileJson, NulBytesAndControlCharactersAreMalformed) {
  CufileConfig c = parse_cufile_config(std::string("{\"properties\": {\0}}", 19), {});
  EXPECT_EQ(c.state, CufileFileState::kMalformed);
  c = parse_cufile_config("{\"properties\": {\"allow_compat_mode\": \"\x01\"}}", {});
  EXPECT_EQ(c.state, CufileFileState::kMalformed);
}

TEST(BadCufileJson, DuplicateKeysAndOverlongUtf8AreHandled) {
  CufileConfig c =
      parse_cufile_config(R"({"execution": {"parallel_io": true, "parallel_io": false}})", {});
  EXPECT_EQ(c.state, CufileFileState::kLoaded);
  EXPECT_TRUE(c.parallel_io.value.has_value());
  c = parse_cufile_config("{\"x\": \"\xC0\xAF\"}", {});  // overlong '/'
  EXPECT_EQ(c.state, CufileFileState::kNotUtf8);
}

}  // namespace
}  // namespace ferry::platform
