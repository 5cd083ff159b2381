#include "ferry/settings.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <memory>
#include <thread>

#include "ferry/error.h"

namespace ferry {
namespace {

TEST(ParseSize, AcceptsPlainBytesAndUnits) {
  EXPECT_EQ(parse_size("4096", "X"), 4096u);
  EXPECT_EQ(parse_size("4MiB", "X"), 4u << 20);
  EXPECT_EQ(parse_size("16KiB", "X"), 16u << 10);
  EXPECT_EQ(parse_size("1GiB", "X"), 1u << 30);
  EXPECT_EQ(parse_size("4M", "X"), 4u << 20);
  EXPECT_EQ(parse_size("4mb", "X"), 4u << 20);
  EXPECT_EQ(parse_size(" 8 KiB ", "X"), 8u << 10);
  EXPECT_EQ(parse_size("2T", "X"), std::uint64_t{2} << 40);
  EXPECT_EQ(parse_size("7B", "X"), 7u);
}

TEST(ParseSize, RejectsEveryBadFormWithTheSettingValueAndForms) {
  for (const char* bad :
       {"abc", "0", "-1", "4XB", "", "1.5M", "0KiB", "M", "99999999999999999999", "20000000T"}) {
    try {
      parse_size(bad, "FERRY_TASK_SIZE");
      FAIL() << "accepted '" << bad << "'";
    } catch (const SettingError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("FERRY_TASK_SIZE"), std::string::npos) << what;
      EXPECT_NE(what.find(std::string("'") + bad + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("expected"), std::string::npos) << what;
      EXPECT_EQ(e.setting(), "FERRY_TASK_SIZE");
      EXPECT_EQ(e.value(), bad);
    }
  }
}

TEST(ParseCount, RejectsZeroNegativeAndGarbage) {
  EXPECT_EQ(parse_count("16", "FERRY_NTHREADS"), 16u);
  for (const char* bad : {"0", "-1", "abc", "4x", "", "100000"}) {
    EXPECT_THROW(parse_count(bad, "FERRY_NTHREADS"), SettingError) << bad;
  }
}

TEST(ParseCompatMode, AcceptsThreeModesOnly) {
  EXPECT_EQ(parse_compat_mode("auto", "X"), CompatMode::kAuto);
  EXPECT_EQ(parse_compat_mode("ON", "X"), CompatMode::kOn);
  EXPECT_EQ(parse_compat_mode("off", "X"), CompatMode::kOff);
  EXPECT_THROW(parse_compat_mode("sometimes", "X"), SettingError);
  EXPECT_EQ(parse_require("gds", "X"), Require::kGds);
  EXPECT_THROW(parse_require("nvfs", "X"), SettingError);
}

TEST(Settings, ScopedOverrideRestoresOnExitAndRecordsSource) {
  Settings before = settings();
  {
    SettingsOverride o;
    o.set("task_size", "1MiB");
    o.set("compat_mode", "on");
    ScopedSettings scope(o);
    EXPECT_EQ(settings().task_size, 1u << 20);
    EXPECT_EQ(settings().compat_mode, CompatMode::kOn);
    bool found = false;
    for (const SettingInfo& row : describe_settings()) {
      if (row.name == "task_size") {
        EXPECT_EQ(row.value, "1 MiB");
        EXPECT_EQ(row.source, SettingSource::kCode);
        found = true;
      }
    }
    EXPECT_TRUE(found);
  }
  EXPECT_EQ(settings().task_size, before.task_size);
  EXPECT_EQ(settings().compat_mode, before.compat_mode);
}

// Regression (reliability issue): a scope in one thread changed another thread's requests.
TEST(Settings, ScopeChangesOnlyTheThreadThatMadeIt) {
  const std::size_t before = settings().task_size;
  SettingsOverride o;
  o.set("task_size", "64KiB");
  std::atomic<int> phase{0};
  std::size_t other_during = 0, other_scoped = 0;
  std::thread other([&] {
    while (phase.load() != 1) std::this_thread::yield();
    other_during = settings().task_size;
    SettingsOverride mine;
    mine.set("task_size", "128KiB");
    ScopedSettings scope(mine);
    other_scoped = settings().task_size;
    phase = 2;
    while (phase.load() != 3) std::this_thread::yield();
  });
  {
    ScopedSettings scope(o);
    phase = 1;
    while (phase.load() != 2) std::this_thread::yield();
    EXPECT_EQ(settings().task_size, 64u << 10);  // the other thread's scope is not ours
  }
  EXPECT_EQ(settings().task_size, before);
  phase = 3;
  other.join();
  EXPECT_EQ(other_during, before);
  EXPECT_EQ(other_scoped, 128u << 10);
  EXPECT_EQ(settings().task_size, before);
}

// Regression (issue 19, bug 4): a scope ended out of order left its change in place.
TEST(Settings, ScopesEndedOutOfOrderRemoveExactlyTheirOwnChanges) {
  const Settings before = settings();
  SettingsOverride first, second;
  first.set("task_size", "1MiB");
  second.set("nthreads", "3");
  auto outer = std::make_unique<ScopedSettings>(first);
  auto inner = std::make_unique<ScopedSettings>(second);
  outer.reset();
  EXPECT_EQ(settings().task_size, before.task_size);
  EXPECT_EQ(settings().nthreads, 3u);
  inner.reset();
  EXPECT_EQ(settings().nthreads, before.nthreads);
}

TEST(Settings, ProcessWideChangeShowsUnderAScopeThatDoesNotSetIt) {
  const Settings before = settings();
  SettingsOverride scoped;
  scoped.set("task_size", "1MiB");
  ScopedSettings scope(scoped);
  SettingsOverride global;
  global.set("nthreads", "5");
  set_settings(global);
  EXPECT_EQ(settings().nthreads, 5u);
  EXPECT_EQ(settings().task_size, 1u << 20);
  SettingsOverride restore;
  restore.nthreads = before.nthreads;
  set_settings(restore);
}

TEST(Settings, UnknownSettingNameIsAnError) {
  SettingsOverride o;
  EXPECT_THROW(o.set("tasksize", "4MiB"), SettingError);
  EXPECT_THROW(o.set("task_size", "4XB"), SettingError);
}

TEST(Settings, OverrideAppliesOnlyTheFieldsItSets) {
  SettingsOverride o;
  o.nthreads = 3;
  Settings s = o.apply_to(Settings{});
  EXPECT_EQ(s.nthreads, 3u);
  EXPECT_EQ(s.task_size, Settings{}.task_size);
}

TEST(FormatSize, UsesTheLargestExactUnit) {
  EXPECT_EQ(format_size(4u << 20), "4 MiB");
  EXPECT_EQ(format_size(5000), "5000 B");
  EXPECT_EQ(format_size(16u << 10), "16 KiB");
}

}  // namespace
}  // namespace ferry
