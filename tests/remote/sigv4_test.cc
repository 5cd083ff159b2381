// ferry's SigV4 signer (src/remote/sigv4.h) against AWS's published Signature Version 4 test
// suite (its "get-vanilla" family and the session-token case: example.amazonaws.com, service
// "service", us-east-1, 2015-08-30T12:36:00Z, key AKIDEXAMPLE) and the GET Object example of
// S3's documentation (a ranged GET, service s3). Skipped, saying why, where libcrypto is absent.
#include "remote/sigv4.h"

#include <gtest/gtest.h>

#include <string>

namespace ferry::remote {
namespace {

constexpr const char* kSuiteDate = "20150830T123600Z";
constexpr const char* kSuiteScope =
    "Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request";

class SigV4 : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!can_sign(&why)) GTEST_SKIP() << "no libcrypto: " << why;
  }
  // A request of the suite: Host and X-Amz-Date signed, an empty payload.
  static std::string suite(const char* method, std::string_view query,
                           std::vector<std::pair<std::string, std::string>> more = {}) {
    SigV4Request r;
    r.method = method;
    r.path = "/";
    r.query = query;
    r.headers = {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", kSuiteDate}};
    for (auto& h : more) r.headers.push_back(std::move(h));
    r.payload_sha256 = kEmptyPayloadSha256;
    const S3Credentials c{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""};
    return sigv4_authorization(r, c, "us-east-1", "service", kSuiteDate);
  }
  static std::string expected(const char* signed_headers, const char* signature) {
    return std::string("AWS4-HMAC-SHA256 ") + kSuiteScope + ", SignedHeaders=" + signed_headers +
           ", Signature=" + signature;
  }
};

TEST_F(SigV4, GetVanilla) {
  EXPECT_EQ(suite("GET", ""),
            expected("host;x-amz-date",
                     "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"));
}

TEST_F(SigV4, GetVanillaEmptyQueryKey) {
  EXPECT_EQ(suite("GET", "Param1=value1"),
            expected("host;x-amz-date",
                     "a67d582fa61cc504c4bae71f336f98b97f1ea3c7a6bfe1b6e45aec72011b9aeb"));
}

TEST_F(SigV4, GetVanillaQueryOrderKeyCaseSortsTheParameters) {
  EXPECT_EQ(suite("GET", "Param2=value2&Param1=value1"),
            expected("host;x-amz-date",
                     "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"));
}

TEST_F(SigV4, GetVanillaQueryUnreservedIsNotEncoded) {
  const std::string unreserved =
      "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  EXPECT_EQ(suite("GET", unreserved + "=" + unreserved),
            expected("host;x-amz-date",
                     "9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197"));
}

TEST_F(SigV4, GetVanillaUtf8QueryIsPercentEncoded) {
  const std::string want = expected(
      "host;x-amz-date", "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04");
  EXPECT_EQ(suite("GET", "\xe1\x88\xb4=bar"), want);
  EXPECT_EQ(suite("GET", "%e1%88%b4=bar"), want) << "an escape is kept, in capitals";
}

TEST_F(SigV4, ASessionTokenIsSigned) {
  // post-sts-header-before: the token is a signed header.
  const std::string token =
      "AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAeMicRXmxfpSP"
      "fIeoIYRqTflfKD8YUuwthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburEDy0KPkyQDYwT"
      "7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6fE8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+scqKmlz"
      "m8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/oLxBA==";
  EXPECT_EQ(suite("POST", "", {{"X-Amz-Security-Token", token}}),
            expected("host;x-amz-date;x-amz-security-token",
                     "85d96828115b5dc0cfc3bd16ad9e210dd772bbebba041836c64533a82be05ead"));
}

TEST_F(SigV4, S3GetObjectExampleWithARange) {
  SigV4Request r;
  r.method = "GET";
  r.path = "/test.txt";
  r.headers = {{"Host", "examplebucket.s3.amazonaws.com"},
               {"Range", "bytes=0-9"},
               {"x-amz-content-sha256", kEmptyPayloadSha256},
               {"x-amz-date", "20130524T000000Z"}};
  r.payload_sha256 = kEmptyPayloadSha256;
  const S3Credentials c{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
  EXPECT_EQ(sigv4_authorization(r, c, "us-east-1", "s3", "20130524T000000Z"),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST_F(SigV4, S3LinesCarryTheDateThePayloadHashTheTokenAndTheRegion) {
  RemoteTarget t;
  t.region = "eu-west-3";
  t.credentials = S3Credentials{"AKIDEXAMPLE", "secret", "the-token"};
  // 2015-08-30T12:36:00Z
  const std::string lines =
      s3_signature_lines("GET", "127.0.0.1:9000", "/b/k%20one.bin", t, std::time_t{1440938160});
  EXPECT_NE(lines.find("x-amz-date: 20150830T123600Z\r\n"), std::string::npos) << lines;
  EXPECT_NE(lines.find(std::string("x-amz-content-sha256: ") + kEmptyPayloadSha256 + "\r\n"),
            std::string::npos);
  EXPECT_NE(lines.find("x-amz-security-token: the-token\r\n"), std::string::npos);
  EXPECT_NE(lines.find("Authorization: AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/eu-west-3/"
                       "s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date;"
                       "x-amz-security-token, Signature="),
            std::string::npos)
      << lines;
  EXPECT_EQ(lines.find("secret\r\n"), std::string::npos);
}

}  // namespace
}  // namespace ferry::remote
