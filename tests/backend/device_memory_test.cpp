// Tensors in device memory and the test backend that stands for a device ("reference-device"): the host cannot read
// a device tensor (every read names it and says what to do), programs of a device backend take and return device
// tensors only, and what crosses between host and device is counted.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "test_util.h"
#include "trl/backend/backend.h"
#include "trl/backend/registry.h"
#include "trl/graph/graph.h"

namespace trl {
namespace {

using test::error_of;

TEST(DeviceMemory, TheHostCannotReadADeviceTensorAndIsToldWhatToDo) {
  auto dev = make_backend("reference-device");
  EXPECT_FALSE(dev->host_memory());
  const Tensor host = Tensor::from_f32(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor d = dev->upload(host, "lm_head.weight");
  EXPECT_TRUE(d.is_device());
  EXPECT_EQ(d.shape(), host.shape());
  EXPECT_EQ(d.device_label(), "'lm_head.weight' in reference-device memory");
  for (const std::string& e : {error_of([&] { (void)d.data(); }), error_of([&] { (void)d.mutable_data(); }), error_of([&] { (void)d.to_f32_vector(); }),
                               error_of([&] { (void)d.clone(); }), error_of([&] { (void)d.to(DType::BF16); }),
                               error_of([&] { Tensor::zeros(DType::F32, {2, 3}).copy_from(d); })}) {
    EXPECT_NE(e.find("'lm_head.weight' in reference-device memory"), std::string::npos) << e;
    EXPECT_NE(e.find("download it first"), std::string::npos) << e;
  }
  // Views keep the device: a reshape is still unreadable.
  EXPECT_NE(error_of([&] { (void)d.reshape({3, 2}).data(); }).find("reference-device"), std::string::npos);
  // Download gives the bytes back; both directions are counted.
  EXPECT_EQ(dev->download(d).to_f32_vector(), host.to_f32_vector());
  const Backend::Transfers t = dev->transfers();
  EXPECT_EQ(t.uploads, 1);
  EXPECT_EQ(t.upload_bytes, 24);
  EXPECT_EQ(t.downloads, 1);
  EXPECT_EQ(t.download_bytes, 24);
  // Host backends move nothing and count nothing.
  auto cpu = make_backend("cpu");
  EXPECT_EQ(cpu->upload(host, "x").data(), host.data());
  EXPECT_EQ(cpu->transfers().uploads, 0);
}

// y = rms_norm(x @ w^T + b) in f32: the same numbers from device tensors as from host ones, outputs on the device,
// and only the uploads and the one download counted.
TEST(DeviceMemory, AProgramOnDeviceTensorsEqualsTheHostOracleAndMovesOnlyWhatIsAsked) {
  graph::Builder b;
  const auto x = b.input("x", {2, 4}, DType::F32);
  const auto w = b.input("w", {3, 4}, DType::F32);
  const auto bias = b.input("b", {3}, DType::F32);
  const auto g = b.input("g", {3}, DType::F32);
  b.output(b.rms_norm(b.matmul(x, w, bias, DType::F32), g, 1e-6), "y");
  const graph::Graph graph = b.finish();
  TensorMap host;
  host["x"] = Tensor::from_f32(std::vector<float>{1, -2, 3, 0.5f, 0, 1, -1, 2}, {2, 4});
  host["w"] = Tensor::from_f32(std::vector<float>{0.1f, 0.2f, -0.3f, 0.4f, 1, 0, 0, -1, 0.5f, 0.5f, 0.5f, 0.5f}, {3, 4});
  host["b"] = Tensor::from_f32(std::vector<float>{0.1f, -0.1f, 0}, {3});
  host["g"] = Tensor::from_f32(std::vector<float>{1, 2, 0.5f}, {3});
  const std::vector<float> want = make_backend("reference")->compile(graph)->run(host).at(0).to_f32_vector();

  auto dev = make_backend("reference-device");
  TensorMap on_device;
  int64_t bytes = 0;
  for (const auto& [name, t] : host) on_device[name] = dev->upload(t, name), bytes += static_cast<int64_t>(t.nbytes());
  auto program = dev->compile(graph);
  const std::vector<Tensor> out = program->run(on_device);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].is_device());
  EXPECT_EQ(out[0].device_label(), "'y' in reference-device memory");
  const std::vector<float> got = dev->download(out[0]).to_f32_vector();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(std::isfinite(got[i]) && got[i] == want[i]) << i << ": " << got[i] << " vs " << want[i];
  // A second run reuses the uploaded tensors: nothing more goes up.
  (void)program->run(on_device);
  const Backend::Transfers t = dev->transfers();
  EXPECT_EQ(t.uploads, 4);
  EXPECT_EQ(t.upload_bytes, bytes);
  EXPECT_EQ(t.downloads, 1);
  EXPECT_EQ(t.download_bytes, 2 * 3 * 4);

  // A host tensor bound on the device backend, and a device tensor bound on a host backend: errors that name the
  // input and say what to do.
  TensorMap mixed = on_device;
  mixed["w"] = host["w"];
  const std::string up = error_of([&] { program->run(mixed); });
  EXPECT_NE(up.find("program input 'w' is in host memory"), std::string::npos) << up;
  EXPECT_NE(up.find("upload it first"), std::string::npos) << up;
  const std::string down = error_of([&] { make_backend("cpu")->compile(graph)->run(on_device); });
  EXPECT_NE(down.find("program input 'x' is in device memory ('x' in reference-device memory)"), std::string::npos) << down;
  EXPECT_NE(down.find("download it first"), std::string::npos) << down;
}

// The memory a backend plans against: on the host, the process's budget, or TRL_MEMORY_LIMIT when set.
TEST(DeviceMemory, HostBackendsReportTheProcessMemoryBudget) {
  const Backend::Memory m = make_backend("cpu")->memory();
  EXPECT_GT(m.available, 0u);
  EXPECT_GE(m.total, m.available);
  EXPECT_FALSE(m.source.empty());
  const char* old = std::getenv("TRL_MEMORY_LIMIT");
  const std::string saved = old ? old : "";
  ::setenv("TRL_MEMORY_LIMIT", "3GB", 1);
  const Backend::Memory limited = make_backend("reference-device")->memory();
  if (old) ::setenv("TRL_MEMORY_LIMIT", saved.c_str(), 1);
  else ::unsetenv("TRL_MEMORY_LIMIT");
  EXPECT_EQ(limited.available, 3'000'000'000u);
  EXPECT_EQ(limited.total, 3'000'000'000u);
  EXPECT_EQ(limited.source, "TRL_MEMORY_LIMIT");
}

// The trainer's work between programs (gradient accumulation, the global norm, clipping) as backend calls: the same
// values on the host backends and on device tensors, where nothing crosses to the host but the sums.
TEST(DeviceMemory, AccumulationNormAndClippingRunWhereTheTensorsLive) {
  for (const std::string name : {"cpu", "reference", "reference-device"}) {
    SCOPED_TRACE(name);
    auto be = make_backend(name);
    auto put = [&](std::vector<float> v) {
      const Tensor h = Tensor::from_f32(v, {static_cast<int64_t>(v.size())});
      return be->host_memory() ? h : be->upload(h, "g");
    };
    auto get = [&](const Tensor& t) { return be->download(t).to_f32_vector(); };
    Tensor acc = put({0, 0, 0});
    be->accumulate(acc, put({1, -2, 3}), /*first=*/true);
    be->accumulate(acc, put({0.5f, 0.25f, -3}), /*first=*/false);
    EXPECT_EQ(get(acc), (std::vector<float>{1.5f, -1.75f, 0}));
    std::vector<Tensor> xs = {acc, put({3, 4}), put({0})};
    const std::vector<double> sq = be->sum_of_squares(xs, {});
    ASSERT_EQ(sq.size(), 3u);
    EXPECT_DOUBLE_EQ(sq[0], 1.5 * 1.5 + 1.75 * 1.75);
    EXPECT_DOUBLE_EQ(sq[1], 25.0);
    EXPECT_EQ(sq[2], 0.0);  // a zero gradient has a zero norm
    // Grouped (tensor parallel's whole and split parameters): only the groups' sums come back.
    const std::vector<double> grouped = be->sum_of_squares(xs, {1, 0, 1});
    ASSERT_EQ(grouped.size(), 2u);
    EXPECT_EQ(grouped[0], sq[1]);
    EXPECT_EQ(grouped[1], sq[0] + sq[2]);
    be->scale(xs, 0.5f);
    EXPECT_EQ(get(xs[1]), (std::vector<float>{1.5f, 2}));
    EXPECT_EQ(get(acc), (std::vector<float>{0.75f, -0.875f, 0}));  // xs[0] shares acc's storage
    // NaN and Inf propagate into the norm (the trainer stops on them, naming the step).
    EXPECT_TRUE(std::isnan(be->sum_of_squares({put({1, std::nanf("")})}, {})[0]));
    EXPECT_TRUE(std::isinf(be->sum_of_squares({put({1, INFINITY})}, {})[0]));
    // Misuse is named: another shape, another dtype.
    EXPECT_NE(error_of([&] { be->accumulate(acc, put({1}), false); }).find("accumulate: shapes [3] and [1] differ"), std::string::npos);
    if (be->host_memory()) {
      Tensor i32 = Tensor::zeros(DType::I32, {3});
      EXPECT_NE(error_of([&] { be->accumulate(i32, acc, true); }).find("expected a contiguous f32 tensor"), std::string::npos);
    } else {
      // Only the uploads of this test and the sums crossed (3 downloads of the test, 4 of the norm's sums): no
      // accumulation, norm or scaling moved a tensor.
      const Backend::Transfers t = be->transfers();
      EXPECT_EQ(t.uploads, 8);
      EXPECT_EQ(t.downloads, 3 + 4);
      EXPECT_EQ(t.largest_download, 3 * 8);  // the three sums of one call
      Tensor host = Tensor::zeros(DType::F32, {3});
      EXPECT_NE(error_of([&] { be->accumulate(host, acc, true); }).find("a tensor in host memory (upload it first)"), std::string::npos);
    }
  }
}

// The test backend is made by name only: it is neither listed nor a device a user can ask for.
TEST(DeviceMemory, TheTestBackendIsNotListed) {
  for (const std::string& n : available_backends()) EXPECT_NE(n, "reference-device");
  for (const std::string& n : available_devices()) EXPECT_NE(n, "reference-device");
  EXPECT_EQ(make_backend("reference-device")->name(), "reference-device");
}

}  // namespace
}  // namespace trl
