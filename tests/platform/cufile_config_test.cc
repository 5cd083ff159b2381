#include "platform/cufile_config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "platform/fake_tree.h"
#include "platform/text_file.h"
#include "test_data.h"

namespace ferry::platform {
namespace {

using testing::FakeTree;

std::string stock_text() {
  return read_text_file(test::test_data("platform") / "cufile/stock.json").text;
}

TEST(CufileConfig, StockFileWithCommentsGivesTheMachineValuesFromTheFile) {
  auto c = parse_cufile_config(stock_text(), {});
  ASSERT_EQ(c.state, CufileFileState::kLoaded) << c.state_detail;
  EXPECT_TRUE(c.problems.empty());
  EXPECT_EQ(c.allow_compat_mode.value, true);
  EXPECT_EQ(c.allow_compat_mode.source, ValueSource::kFile);
  EXPECT_EQ(c.parallel_io.value, true);
  EXPECT_EQ(c.max_io_threads.value, 4u);
  EXPECT_EQ(c.min_io_threshold_size_kb.value, 8192u);
  EXPECT_EQ(c.max_request_parallelism.value, 4u);
  EXPECT_EQ(c.max_io_queue_depth.value, 128u);
  EXPECT_EQ(c.max_direct_io_size_kb.value, 16384u);
  EXPECT_EQ(c.use_pci_p2pdma.value, false);
  EXPECT_EQ(c.force_compat_mode.value, false);
  EXPECT_EQ(c.force_compat_mode.source, ValueSource::kDefault);
}

TEST(CufileConfig, AbsentKeysTakeDocumentedDefaults) {
  auto c = parse_cufile_config(R"({"execution": {"max_io_threads": 8}})", {});
  EXPECT_EQ(c.max_io_threads.value, 8u);
  EXPECT_EQ(c.max_io_threads.source, ValueSource::kFile);
  EXPECT_EQ(c.max_request_parallelism.value, 4u);
  EXPECT_EQ(c.max_request_parallelism.source, ValueSource::kDefault);
  EXPECT_EQ(c.min_io_threshold_size_kb.value, 8192u);
  EXPECT_EQ(c.max_io_queue_depth.value, 128u);
  EXPECT_EQ(c.parallel_io.value, true);
  EXPECT_EQ(c.allow_compat_mode.value, true);
}

TEST(CufileConfig, ReportsLineAndColumnOfSyntaxError) {
  auto text = read_text_file(test::test_data("platform") / "cufile/bad_syntax.json").text;
  auto c = parse_cufile_config(text, {});
  ASSERT_EQ(c.state, CufileFileState::kMalformed);
  ASSERT_TRUE(c.parse_error);
  // The missing comma after `"parallel_io": true` shows at the next key, line 5 column 9.
  EXPECT_EQ(c.parse_error->line, 5u);
  EXPECT_EQ(c.parse_error->column, 9u);
  EXPECT_EQ(text[c.parse_error->byte_offset], '"');
  EXPECT_NE(c.state_detail.find("line 5, column 9"), std::string::npos) << c.state_detail;
  EXPECT_FALSE(c.parallel_io.value) << "a broken file gives no values";
  EXPECT_FALSE(c.parallel_io.problem.empty());
}

TEST(CufileConfig, SyntaxErrorPointsAtTheStartOfTheBadToken) {
  auto c = parse_cufile_config("{\"a\": 12 345}", {});
  ASSERT_TRUE(c.parse_error);
  EXPECT_EQ(c.parse_error->column, 10u);
  auto end = parse_cufile_config("{\n  \"execution\": {\n", {});
  ASSERT_TRUE(end.parse_error);
  EXPECT_EQ(end.parse_error->line, 3u);
}

TEST(CufileConfig, LineAndColumnCountFromOne) {
  EXPECT_EQ(line_and_column("ab\ncd", 0), (std::pair<std::size_t, std::size_t>{1, 1}));
  EXPECT_EQ(line_and_column("ab\ncd", 4), (std::pair<std::size_t, std::size_t>{2, 2}));
}

TEST(CufileConfig, WrongValueTypesAreNamedByKey) {
  auto text = read_text_file(test::test_data("platform") / "cufile/wrong_types.json").text;
  auto c = parse_cufile_config(text, {});
  EXPECT_EQ(c.state, CufileFileState::kLoaded);
  ASSERT_EQ(c.problems.size(), 3u);
  EXPECT_FALSE(c.parallel_io.value);
  EXPECT_NE(c.parallel_io.problem.find("execution.parallel_io"), std::string::npos);
  EXPECT_NE(c.parallel_io.problem.find("\"yes\""), std::string::npos);
  EXPECT_FALSE(c.max_io_threads.value);
  EXPECT_NE(c.max_io_threads.problem.find("-2"), std::string::npos);
  EXPECT_FALSE(c.max_request_parallelism.value);
  EXPECT_EQ(c.allow_compat_mode.value, false);
}

TEST(CufileConfig, SectionThatIsNotAnObjectIsAProblem) {
  auto c = parse_cufile_config(R"({"execution": [1, 2]})", {});
  ASSERT_FALSE(c.problems.empty());
  EXPECT_NE(c.problems[0].find("execution: expected an object"), std::string::npos);
}

TEST(CufileConfig, EmptyFileIsReportedAndGivesNoValues) {
  auto c = parse_cufile_config("  \n", {});
  EXPECT_EQ(c.state, CufileFileState::kEmpty);
  EXPECT_FALSE(c.max_request_parallelism.value);
}

TEST(CufileConfig, InvalidUtf8IsLocated) {
  std::string text = "{\n  \"logging\": {\"dir\": \"/tmp/\xff\"}\n}";
  auto c = parse_cufile_config(text, {});
  EXPECT_EQ(c.state, CufileFileState::kNotUtf8);
  ASSERT_TRUE(c.parse_error);
  EXPECT_EQ(c.parse_error->line, 2u);
  EXPECT_EQ(c.parse_error->column, 28u);
}

TEST(CufileConfig, TopLevelThatIsNotAnObjectIsMalformed) {
  auto c = parse_cufile_config("[1]", {});
  EXPECT_EQ(c.state, CufileFileState::kMalformed);
}

TEST(CufileConfig, ForceCompatFromEnvironmentOverridesTheFile) {
  auto c = parse_cufile_config(
      R"({"properties": {"force_compat_mode": false}})",
      {{"CUFILE_FORCE_COMPAT_MODE", "true"}, {"CUFILE_LOGGING_LEVEL", "INFO"}, {"HOME", "/root"}});
  EXPECT_EQ(c.force_compat_mode.value, true);
  EXPECT_EQ(c.force_compat_mode.source, ValueSource::kEnvironment);
  ASSERT_EQ(c.cufile_env.size(), 2u);
  EXPECT_EQ(c.cufile_env[0].first, "CUFILE_FORCE_COMPAT_MODE");
}

TEST(CufileConfig, SlabLayoutLeavesMaxDirectIoSizeToCufile) {
  auto text = read_text_file(test::test_data("platform") / "cufile/slab_config.json").text;
  auto c = parse_cufile_config(text, {});
  EXPECT_FALSE(c.max_direct_io_size_kb.value);
  EXPECT_NE(c.max_direct_io_size_kb.problem.find("slab"), std::string::npos);
  EXPECT_EQ(c.force_compat_mode.value, true);
  EXPECT_EQ(c.max_request_parallelism.value, 8u);
}

TEST(CufileConfig, ReaderUsesEtcUnderRootByDefault) {
  FakeTree t;
  t.write("etc/cufile.json", stock_text());
  auto c = read_cufile_config(t.root(), {});
  EXPECT_EQ(c.path, "/etc/cufile.json");
  EXPECT_FALSE(c.path_from_env);
  EXPECT_EQ(c.state, CufileFileState::kLoaded);
}

TEST(CufileConfig, ReaderFollowsCufileEnvPathJson) {
  FakeTree t;
  t.write("etc/cufile.json", R"({"execution": {"max_io_threads": 1}})");
  t.write("home/u/my.json", R"({"execution": {"max_io_threads": 9}})");
  auto c = read_cufile_config(t.root(), {{"CUFILE_ENV_PATH_JSON", "/home/u/my.json"}});
  EXPECT_TRUE(c.path_from_env);
  EXPECT_EQ(c.max_io_threads.value, 9u);
}

TEST(CufileConfig, MissingFileMeansDefaultsAndSaysSo) {
  FakeTree t;
  auto c = read_cufile_config(t.root(), {});
  EXPECT_EQ(c.state, CufileFileState::kMissing);
  EXPECT_NE(c.state_detail.find("does not exist"), std::string::npos);
  EXPECT_EQ(c.max_request_parallelism.value, 4u);
  EXPECT_EQ(c.max_request_parallelism.source, ValueSource::kDefault);
}

TEST(CufileConfig, HugeFileIsCappedAndNotParsed) {
  FakeTree t;
  t.write("etc/cufile.json", "{" + std::string(kCufileJsonCap + 10, ' ') + "}");
  auto c = read_cufile_config(t.root(), {});
  EXPECT_EQ(c.state, CufileFileState::kTooLarge);
  EXPECT_NE(c.state_detail.find("at most"), std::string::npos);
  EXPECT_FALSE(c.parallel_io.value);
}

TEST(CufileConfig, UnreadableFileIsReportedNotThrown) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root: mode 000 does not stop root reading";
  FakeTree t;
  t.write("etc/cufile.json", stock_text());
  ::chmod(t.at("etc/cufile.json").c_str(), 0);
  auto c = read_cufile_config(t.root(), {});
  EXPECT_EQ(c.state, CufileFileState::kUnreadable);
  EXPECT_NE(c.state_detail.find("Permission denied"), std::string::npos);
  EXPECT_FALSE(c.parallel_io.value);
}

}  // namespace
}  // namespace ferry::platform
