#include "ferry/settings.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/variables.h"
#include "ferry/error.h"
#include "ferry/sizes.h"
#include "test_hooks.h"

namespace ferry {
namespace {

TEST(ParseSize, AcceptsPlainBytesAndUnits) {
  EXPECT_EQ(parse_size("4096", "X"), 4096u);
  EXPECT_EQ(parse_size("4MiB", "X"), 4u << 20);
  EXPECT_EQ(parse_size("16KiB", "X"), 16u << 10);
  EXPECT_EQ(parse_size("1GiB", "X"), 1u << 30);
  EXPECT_EQ(parse_size("4M", "X"), 4u << 20);
  EXPECT_EQ(parse_size(" 8 KiB ", "X"), 8u << 10);
  EXPECT_EQ(parse_size("2T", "X"), std::uint64_t{2} << 40);
  EXPECT_EQ(parse_size("7B", "X"), 7u);
}

// Regression (issue 46): "5GB" was 5 GiB here and 5,000,000,000 bytes in save_checkpoint. KB, MB,
// GB and TB are powers of 1000, as huggingface_hub reads max_shard_size="5GB"; the IEC units and
// the bare letters stay powers of 1024.
TEST(ParseSize, SiUnitsArePowersOfAThousandAndIecUnitsOf1024) {
  EXPECT_EQ(parse_size("5GB", "X"), 5'000'000'000u);
  EXPECT_EQ(parse_size("4mb", "X"), 4'000'000u);
  EXPECT_EQ(parse_size("300KB", "X"), 300'000u);
  EXPECT_EQ(parse_size("2TB", "X"), 2'000'000'000'000u);
  EXPECT_EQ(parse_size("5GiB", "X"), std::uint64_t{5} << 30);
  EXPECT_EQ(parse_size("5G", "X"), std::uint64_t{5} << 30);
  EXPECT_THROW(parse_size("20000000TB", "X"), SettingError);
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

// KvikIO's environment variables (issue 16). Each test sets the variables it needs, with every
// other FERRY_* and KVIKIO_* one that ferry reads (base/variables.h) unset, and reads the
// environment again; the destructor puts the environment back and reads it again.
class Environment {
 public:
  explicit Environment(std::initializer_list<std::pair<std::string, std::string>> set) {
    for (const base::Variable* v : base::kVariables) {
      for (const char* name : {v->env, v->kvikio[0], v->kvikio[1]}) {
        if (name == nullptr) continue;
        const char* old = std::getenv(name);
        saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
        unsetenv(name);
      }
    }
    for (const auto& [name, value] : set) setenv(name.c_str(), value.c_str(), 1);
    reload_settings_from_environment();
  }
  ~Environment() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
    reload_settings_from_environment();
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

SettingInfo row_of(const std::string& name) {
  for (const SettingInfo& row : describe_settings()) {
    if (row.name == name) return row;
  }
  ADD_FAILURE() << "no setting " << name;
  return {};
}

// The SettingError that settings() throws, or nullopt when it throws none.
std::optional<SettingError> settings_error() {
  try {
    settings();
  } catch (const SettingError& e) {
    return e;
  }
  return std::nullopt;
}

TEST(KvikioEnvironment, HonouredWhenTheFerryVariableIsUnset) {
  Environment env({{"KVIKIO_COMPAT_MODE", "ON"},
                   {"KVIKIO_TASK_SIZE", "1048576"},
                   {"KVIKIO_GDS_THRESHOLD", "65536"},
                   {"KVIKIO_NTHREADS", "3"},
                   {"KVIKIO_BOUNCE_BUFFER_SIZE", "8388608"}});
  Settings s = settings();
  EXPECT_EQ(s.compat_mode, CompatMode::kOn);  // KvikIO's ON: POSIX only, as ferry's on
  EXPECT_EQ(s.task_size, 1u << 20);
  EXPECT_EQ(s.gds_threshold, 64u << 10);
  EXPECT_EQ(s.nthreads, 3u);  // KvikIO's one pool: both of ferry's thread counts
  EXPECT_EQ(s.host_nthreads, 3u);
  EXPECT_EQ(s.bounce_buffer_size, 8u << 20);
  EXPECT_EQ(s.require, Require::kAny);
  for (const auto& [name, var] :
       std::map<std::string, std::string>{{"compat_mode", "KVIKIO_COMPAT_MODE"},
                                          {"task_size", "KVIKIO_TASK_SIZE"},
                                          {"gds_threshold", "KVIKIO_GDS_THRESHOLD"},
                                          {"nthreads", "KVIKIO_NTHREADS"},
                                          {"host_nthreads", "KVIKIO_NTHREADS"},
                                          {"bounce_buffer_size", "KVIKIO_BOUNCE_BUFFER_SIZE"}}) {
    SettingInfo row = row_of(name);
    EXPECT_EQ(row.source, SettingSource::kEnvironment) << name;
    EXPECT_EQ(row.source_env, var) << name;
    EXPECT_EQ(row.env.rfind("FERRY_", 0), 0u) << name;  // env still names ferry's own
  }
  EXPECT_EQ(row_of("require").source, SettingSource::kDefault);
  EXPECT_EQ(row_of("require").source_env, "");
  EXPECT_TRUE(row_of("require").kvikio_env.empty());
  EXPECT_EQ(row_of("nthreads").kvikio_env,
            (std::vector<std::string>{"KVIKIO_NTHREADS", "KVIKIO_NUM_THREADS"}));
}

TEST(KvikioEnvironment, FerryVariableTakesPrecedence) {
  Environment env({{"FERRY_TASK_SIZE", "2MiB"},
                   {"KVIKIO_TASK_SIZE", "1048576"},
                   {"FERRY_NTHREADS", "5"},
                   {"KVIKIO_NTHREADS", "3"},
                   // ignored, malformed as it is, because FERRY_COMPAT_MODE is set
                   {"FERRY_COMPAT_MODE", "off"},
                   {"KVIKIO_COMPAT_MODE", "sometimes"}});
  Settings s = settings();
  EXPECT_EQ(s.task_size, 2u << 20);
  EXPECT_EQ(s.nthreads, 5u);
  EXPECT_EQ(s.host_nthreads, 3u);  // FERRY_HOST_NTHREADS is unset: KVIKIO_NTHREADS counts
  EXPECT_EQ(s.compat_mode, CompatMode::kOff);
  EXPECT_EQ(row_of("task_size").source_env, "FERRY_TASK_SIZE");
  EXPECT_EQ(row_of("nthreads").source_env, "FERRY_NTHREADS");
  EXPECT_EQ(row_of("host_nthreads").source_env, "KVIKIO_NTHREADS");
  EXPECT_EQ(row_of("compat_mode").source_env, "FERRY_COMPAT_MODE");
}

TEST(KvikioEnvironment, EitherNameOfTheThreadCountAndBothWhenTheyAgree) {
  {
    Environment env({{"KVIKIO_NUM_THREADS", "6"}});
    EXPECT_EQ(settings().nthreads, 6u);
    EXPECT_EQ(row_of("nthreads").source_env, "KVIKIO_NUM_THREADS");
  }
  {
    Environment env({{"KVIKIO_NTHREADS", "4"}, {"KVIKIO_NUM_THREADS", " 4 "}});
    EXPECT_EQ(settings().nthreads, 4u);
    EXPECT_EQ(row_of("nthreads").source_env, "KVIKIO_NTHREADS");
  }
}

TEST(KvikioEnvironment, TheTwoThreadCountNamesMustAgree) {
  Environment env({{"KVIKIO_NTHREADS", "4"}, {"KVIKIO_NUM_THREADS", "8"}});
  std::optional<SettingError> e = settings_error();
  ASSERT_TRUE(e);
  std::string what = e->what();
  EXPECT_EQ(e->setting(), "KVIKIO_NUM_THREADS");
  EXPECT_EQ(e->value(), "8");
  EXPECT_NE(what.find("KVIKIO_NTHREADS is also set, to '4'"), std::string::npos) << what;
  EXPECT_NE(what.find("FERRY_"), std::string::npos) << what;  // says which variable wins
}

// The same parser, limits and messages as the FERRY_* variable, with the KVIKIO_* name in them.
TEST(KvikioEnvironment, MalformedValuesAreTheFerryErrorsNamingTheKvikioVariable) {
  const std::pair<const char*, const char*> kBad[] = {
      {"TASK_SIZE", "lots"},  {"TASK_SIZE", "0"},          {"TASK_SIZE", "-4"},
      {"TASK_SIZE", ""},      {"TASK_SIZE", "1000"},       {"GDS_THRESHOLD", "1.5K"},
      {"GDS_THRESHOLD", "0"}, {"BOUNCE_BUFFER_SIZE", "1"}, {"NTHREADS", "0"},
      {"NTHREADS", "eight"},  {"NTHREADS", "4097"},        {"COMPAT_MODE", "maybe"},
  };
  for (const auto& [suffix, value] : kBad) {
    const std::string kvikio = std::string("KVIKIO_") + suffix;
    const std::string ferry = std::string("FERRY_") + suffix;
    std::string kvikio_what, ferry_what;
    {
      Environment env({{kvikio, value}});
      std::optional<SettingError> e = settings_error();
      ASSERT_TRUE(e) << kvikio << "=" << value << " was accepted";
      EXPECT_EQ(e->setting(), kvikio);
      EXPECT_EQ(e->value(), value);
      kvikio_what = e->what();
    }
    {
      Environment env({{ferry, value}});
      std::optional<SettingError> e = settings_error();
      ASSERT_TRUE(e) << ferry << "=" << value << " was accepted";
      ferry_what = e->what();
    }
    EXPECT_NE(kvikio_what.find(kvikio + "='" + value + "'"), std::string::npos) << kvikio_what;
    // Word for word the FERRY_* message, with the other name.
    std::string expected = ferry_what;
    for (size_t at; (at = expected.find(ferry)) != std::string::npos;) {
      expected.replace(at, ferry.size(), kvikio);
    }
    EXPECT_EQ(kvikio_what, expected);
  }
}

TEST(KvikioEnvironment, AMalformedKvikioVariableIsRepairedBySettingTheSetting) {
  Environment env({{"KVIKIO_TASK_SIZE", "1000"}});  // KvikIO accepts it, ferry's floor is 4 KiB
  std::optional<SettingError> e = settings_error();
  ASSERT_TRUE(e);
  EXPECT_NE(std::string(e->what()).find("must be from 4 KiB"), std::string::npos) << e->what();
  SettingsOverride repair;
  repair.set("task_size", "64KiB");
  set_settings(repair);
  EXPECT_EQ(settings().task_size, 64u << 10);
  EXPECT_EQ(row_of("task_size").source, SettingSource::kCode);
  EXPECT_EQ(row_of("task_size").source_env, "");
}

TEST(KvikioEnvironment, AScopeShowsAsCodeWithNoVariable) {
  Environment env({{"KVIKIO_TASK_SIZE", "1048576"}});
  SettingsOverride o;
  o.set("task_size", "2MiB");
  {
    ScopedSettings scope(o);
    EXPECT_EQ(row_of("task_size").source, SettingSource::kCode);
    EXPECT_EQ(row_of("task_size").source_env, "");
  }
  EXPECT_EQ(row_of("task_size").source_env, "KVIKIO_TASK_SIZE");
}

// Issue 46: the variables read where they are used (the remote policy, the statistics, the
// libraries) are described beside the settings, and a malformed one is reported as a setting's is.
TEST(EnvironmentOnly, EveryVariableFerryReadsIsDescribed) {
  Environment env({{"FERRY_CURL_LIBRARY", "/opt/curl.so"}, {"KVIKIO_HTTP_TIMEOUT", "20"}});
  for (const base::Variable* v : base::kVariables) {
    bool found = false;
    for (const SettingInfo& row : describe_settings()) {
      if (row.env != v->env) continue;
      found = true;
      EXPECT_EQ(row.environment_only, v->name != nullptr) << row.name;
      EXPECT_EQ(row.name, v->name != nullptr ? v->name : row.name);
    }
    EXPECT_TRUE(found) << v->env << " is not described";
  }
  EXPECT_EQ(row_of("curl_library").value, "/opt/curl.so");
  EXPECT_EQ(row_of("curl_library").source, SettingSource::kEnvironment);
  EXPECT_EQ(row_of("remote_deadline").value, "20");
  EXPECT_EQ(row_of("remote_deadline").source_env, "KVIKIO_HTTP_TIMEOUT");
  EXPECT_EQ(row_of("crypto_library").value, "libcrypto.so.3");
  EXPECT_EQ(row_of("crypto_library").source, SettingSource::kDefault);
}

TEST(EnvironmentOnly, MalformedRemoteVariableIsASettingErrorNamingIt) {
  const std::pair<const char*, const char*> kBad[] = {
      {"FERRY_REMOTE_RETRIES", "lots"},  {"FERRY_REMOTE_RETRIES", "101"},
      {"KVIKIO_HTTP_MAX_ATTEMPTS", "0"}, {"FERRY_REMOTE_TIMEOUT", "0"},
      {"KVIKIO_HTTP_TIMEOUT", "0"},      {"KVIKIO_HTTP_STATUS_CODES", "500,abc"},
      {"FERRY_STATS_PUBLISH", "maybe"}};
  for (const auto& [var, value] : kBad) {
    Environment env({{var, value}});
    EXPECT_FALSE(settings_error()) << var << ": only what reads it fails, not every request";
    const SettingsCheck check = check_settings();
    ASSERT_EQ(check.errors.size(), 1u) << var << "=" << value << " was accepted";
    EXPECT_EQ(check.errors[0].setting(), var);
    EXPECT_EQ(check.errors[0].value(), value);
    const std::string what = check.errors[0].what();
    EXPECT_EQ(what.find(std::string("invalid ") + var + "='" + value + "': "), 0u) << what;
  }
}

TEST(FormatSize, UsesTheLargestExactUnit) {
  EXPECT_EQ(format_size(4u << 20), "4 MiB");
  EXPECT_EQ(format_size(5000), "5000 B");
  EXPECT_EQ(format_size(16u << 10), "16 KiB");
  EXPECT_EQ(format_size(1536u << 10), "1536 KiB");
}

// The one form of running totals (stats, progress), in the same units: the CLI, the stats text
// and Python's progress line each had a formatter of their own.
TEST(FormatSize, RoundedGivesThreeSignificantDigitsOfTheLargestUnitReached) {
  EXPECT_EQ(format_size(4917248, true), "4.69 MiB");
  EXPECT_EQ(format_size(4u << 20, true), "4.00 MiB");
  EXPECT_EQ(format_size(12u << 20, true), "12.0 MiB");
  EXPECT_EQ(format_size(512u << 10, true), "512 KiB");
  EXPECT_EQ(format_size(512, true), "512 B");
  EXPECT_EQ(format_size(0, true), "0 B");
  EXPECT_EQ(format_rate(2.454e9), "2.45 GB/s");
  EXPECT_EQ(format_rate(312e6), "312 MB/s");
  EXPECT_EQ(format_rate(18e3), "18.0 kB/s");
  EXPECT_EQ(format_rate(12), "12.0 B/s");
}

}  // namespace
}  // namespace ferry
