#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "trl/core/error.h"
#include "core/fs.h"
#include "trl/io/safetensors.h"
#include "test_util.h"

namespace trl {
namespace {

namespace fs = std::filesystem;

TensorMap sample_tensors() {
  TensorMap m;
  std::vector<float> a(6 * 7);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.25f * static_cast<float>(i) - 3.0f;
  m["model.a.weight"] = Tensor::from_f32(a, {6, 7});
  m["model.b.weight"] = Tensor::from_f32(std::vector<float>(a.begin(), a.begin() + 5), {5}, DType::BF16);
  m["model.c.weight"] = Tensor::from_f32(std::vector<float>(a.begin(), a.begin() + 12), {3, 4}, DType::F16);
  m["ids"] = Tensor::from_i32(std::vector<int32_t>{1, -2, 3}, {3});
  m["big"] = Tensor::zeros(DType::I64, {2, 2});
  m["big"].mutable_data_as<int64_t>()[3] = 1ll << 40;
  m["empty"] = Tensor::zeros(DType::F32, {0, 4});
  m["scalar"] = Tensor::from_f32(std::vector<float>{42.0f}, {});
  return m;
}

std::string bytes_of(const Tensor& t) { return std::string(static_cast<const char*>(t.data()), t.nbytes()); }

void expect_same(const TensorMap& want, const Checkpoint& got) {
  ASSERT_EQ(got.names().size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.contains(name)) << name;
    Tensor r = got.get(name);
    EXPECT_EQ(r.dtype(), t.dtype()) << name;
    EXPECT_EQ(r.shape(), t.shape()) << name;
    EXPECT_EQ(bytes_of(r), bytes_of(t)) << name;
  }
}

TEST(SafeTensors, RoundTripIsBitIdentical) {
  test::TempDir dir;
  const TensorMap m = sample_tensors();
  save_safetensors(dir.file("a.safetensors"), m, {{"format", "pt"}, {"note", "x"}});
  SafeTensorsFile f = SafeTensorsFile::open(dir.file("a.safetensors"));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "x");
  expect_same(m, Checkpoint::open(dir.file("a.safetensors")));
  // Zero-copy: the tensor points into the mapping and is aligned to its element size.
  Tensor w = f.get("model.a.weight");
  EXPECT_EQ(w.storage_kind(), StorageKind::Mapped);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.data()) % 4, 0u);
  EXPECT_THROW(w.mutable_data(), Error);
  // Saving what we read gives the same file, byte for byte.
  TensorMap again;
  for (const auto& name : f.names()) again[name] = f.get(name);
  save_safetensors(dir.file("b.safetensors"), again, f.metadata());
  EXPECT_EQ(test::read_file(dir.file("a.safetensors")), test::read_file(dir.file("b.safetensors")));
  // Header padded so that the data starts at a multiple of 8.
  const std::string raw = test::read_file(dir.file("a.safetensors"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(raw[static_cast<size_t>(i)]);
  EXPECT_EQ((8 + n) % 8, 0u);
}

TEST(SafeTensors, ShardedRoundTrip) {
  test::TempDir dir;
  TensorMap m = sample_tensors();
  for (int i = 0; i < 5; ++i) m["layer." + std::to_string(i)] = Tensor::zeros(DType::F32, {100});  // 400 bytes each
  auto files = save_checkpoint(dir.path(), m, 500);
  EXPECT_GT(files.size(), 3u);
  EXPECT_TRUE(fs::exists(dir.file("model.safetensors.index.json")));
  EXPECT_FALSE(fs::exists(dir.file("model.safetensors")));
  const auto index = nlohmann::json::parse(test::read_file(dir.file("model.safetensors.index.json")));
  EXPECT_EQ(index["weight_map"].size(), m.size());
  uint64_t total = 0;
  for (const auto& [name, t] : m) total += t.nbytes();
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  Checkpoint ck = Checkpoint::open(dir.path());
  expect_same(m, ck);
  for (const auto& f : ck.files()) EXPECT_LE(fs::file_size(f.path()) - 8, 500u + 1024u);  // data <= 500 except lone tensors
  // Saving again unsharded replaces the shards: the folder never mixes two checkpoints.
  save_checkpoint(dir.path(), m, 0);
  EXPECT_FALSE(fs::exists(dir.file("model.safetensors.index.json")));
  EXPECT_FALSE(fs::exists(dir.file("model-00001-of-" + fs::path(files[0]).filename().string().substr(15, 5) + ".safetensors")));
  expect_same(m, Checkpoint::open(dir.path()));
}

TEST(SafeTensors, AtomicWriteLeavesNoPartialFile) {
  test::TempDir dir;
  const std::string path = dir.file("out.bin");
  write_text_file_atomic(path, "old contents");
  EXPECT_THROW(write_file_atomic(path,
                                 [&](int fd) {
                                   write_all(fd, "half", 4, path);
                                   fail("simulated failure while writing");
                                 }),
               Error);
  EXPECT_EQ(test::read_file(path), "old contents");
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) (void)e, ++entries;
  EXPECT_EQ(entries, 1) << "the temporary file was left behind";
  EXPECT_THROW(save_safetensors(dir.file("missing-dir/x.safetensors"), sample_tensors()), Error);
}

TEST(SafeTensors, ParsesByteSizes) {
  EXPECT_EQ(parse_byte_size("5GB"), 5000000000ull);
  EXPECT_EQ(parse_byte_size("500MB"), 500000000ull);
  EXPECT_EQ(parse_byte_size("2GiB"), 2147483648ull);
  EXPECT_EQ(parse_byte_size("123"), 123ull);
  EXPECT_THROW(parse_byte_size("5XB"), Error);
  EXPECT_THROW(parse_byte_size("GB"), Error);
}

// ---- malformed files: each gives a trl::Error that names the file (and the tensor), never a crash ----

std::string make_file(const std::string& header, const std::string& data, int64_t declared_len = -1) {
  std::string out(8, '\0');
  uint64_t n = declared_len >= 0 ? static_cast<uint64_t>(declared_len) : header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

void expect_error(const std::string& bytes, const std::vector<std::string>& fragments) {
  test::TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  test::write_file(path, bytes);
  try {
    SafeTensorsFile::open(path);
    FAIL() << "no error for " << fragments[0];
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
}

const std::string kData8(8, '\x01');

TEST(SafeTensorsMalformed, TooShort) { expect_error("abc", {"truncated"}); }
TEST(SafeTensorsMalformed, HeaderLengthBeyondFile) {
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", kData8, 1 << 20), {"header length", "beyond"});
}
TEST(SafeTensorsMalformed, ZeroHeaderLength) { expect_error(make_file("{}", "", 0), {"header of 0 bytes"}); }
TEST(SafeTensorsMalformed, BadJson) { expect_error(make_file(R"({"a":{"dtype":"F32",)", kData8), {"not valid JSON"}); }
TEST(SafeTensorsMalformed, NotAnObject) { expect_error(make_file("[1,2]", ""), {"JSON object"}); }
TEST(SafeTensorsMalformed, UnknownDtype) {
  expect_error(make_file(R"({"w":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})", kData8), {"'w'", "F8_E4M3"});
}
TEST(SafeTensorsMalformed, ShapeSizeMismatch) {
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", kData8), {"'w'", "12 bytes", "span 8"});
}
TEST(SafeTensorsMalformed, OffsetsOutOfRange) {
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", kData8), {"'w'", "outside the data buffer"});
}
TEST(SafeTensorsMalformed, OffsetsReversed) {
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", kData8), {"'w'", "begin after end"});
}
TEST(SafeTensorsMalformed, OverlappingTensors) {
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                         kData8),
               {"'a'", "'b'", "overlap"});
}
TEST(SafeTensorsMalformed, HoleInBuffer) {
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", kData8), {"belong to no tensor", "'a'"});
}
TEST(SafeTensorsMalformed, TrailingBytes) {
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", kData8), {"after the last tensor"});
}
TEST(SafeTensorsMalformed, NegativeShape) {
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", kData8), {"'w'", "non-negative"});
}
TEST(SafeTensorsMalformed, MissingField) {
  expect_error(make_file(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", kData8), {"'w'", "missing 'shape'"});
}
TEST(SafeTensorsMalformed, MetadataNotStrings) {
  expect_error(make_file(R"({"__metadata__":{"format":3}})", ""), {"__metadata__"});
}
TEST(SafeTensorsMalformed, TruncatedData) {
  // A valid file cut short: the last tensor no longer fits.
  test::TempDir dir;
  save_safetensors(dir.file("ok.safetensors"), sample_tensors());
  std::string raw = test::read_file(dir.file("ok.safetensors"));
  expect_error(raw.substr(0, raw.size() - 3), {"outside the data buffer"});
}
TEST(SafeTensorsMalformed, MissingTensorNamed) {
  test::TempDir dir;
  save_safetensors(dir.file("ok.safetensors"), sample_tensors());
  Checkpoint ck = Checkpoint::open(dir.file("ok.safetensors"));
  try {
    ck.get("model.nope.weight");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.nope.weight"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("ok.safetensors"), std::string::npos);
  }
}
TEST(SafeTensorsMalformed, IndexPointsToWrongShard) {
  test::TempDir dir;
  save_safetensors(dir.file("model-00001-of-00001.safetensors"), sample_tensors());
  write_text_file_atomic(dir.file("model.safetensors.index.json"), R"({"weight_map":{"ghost":"model-00001-of-00001.safetensors"}})");
  try {
    Checkpoint::open(dir.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ghost"), std::string::npos) << e.what();
  }
  write_text_file_atomic(dir.file("model.safetensors.index.json"), R"({"weight_map":{"ids":"../evil.safetensors"}})");
  EXPECT_THROW(Checkpoint::open(dir.path()), Error);
}

// Random corruption of a valid file never crashes: it either loads or throws trl::Error.
TEST(SafeTensorsMalformed, RandomCorruptionNeverCrashes) {
  test::TempDir dir;
  save_safetensors(dir.file("ok.safetensors"), sample_tensors());
  const std::string raw = test::read_file(dir.file("ok.safetensors"));
  uint32_t state = 7;
  for (int trial = 0; trial < 300; ++trial) {
    std::string bad = raw;
    for (int k = 0; k < 3; ++k) {
      state = state * 1664525u + 1013904223u;
      size_t pos = state % std::min<size_t>(bad.size(), 8 + 600);
      bad[pos] = static_cast<char>(state >> 24);
    }
    test::write_file(dir.file("bad.safetensors"), bad);
    try {
      SafeTensorsFile f = SafeTensorsFile::open(dir.file("bad.safetensors"));
      for (const auto& n : f.names()) (void)f.get(n).to_f32_vector().size();
    } catch (const Error&) {
    }
  }
}

}  // namespace
}  // namespace trl
