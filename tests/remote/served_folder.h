// ferry::test::ServedFolder: a test whose HttpServer serves a folder of its own (root_, made
// empty before the test and removed after it), skipped where ferry cannot read remote sources.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include "ferry/remote.h"
#include "http_server.h"

namespace ferry::test {

class ServedFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!remote_support().available) {
      GTEST_SKIP() << "remote sources unavailable: " << remote_support().description;
    }
    const ::testing::TestInfo& test = *::testing::UnitTest::GetInstance()->current_test_info();
    root_ = std::filesystem::temp_directory_path() /
            ("ferry-" + std::string(test.test_suite_name()) + "-" + std::to_string(::getpid()) +
             "-" + test.name());
    std::filesystem::create_directories(root_);
    server_ = std::make_unique<HttpServer>(root_);
  }
  void TearDown() override {
    server_.reset();
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }

  std::filesystem::path root_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace ferry::test
