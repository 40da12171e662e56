#include "trl/backend/registry.h"

#include <omp.h>

#include <gtest/gtest.h>

#include "test_util.h"
#include "trl/backend/cpu/cpu_backend.h"
#include "trl/core/error.h"
#include "trl/runtime/runtime.h"

namespace trl {
namespace {

using test::error_of;

TEST(Registry, MakesEveryBuiltBackendByNameAndAutoPicksTheBestDevice) {
  EXPECT_EQ(make_backend("cpu")->name(), "cpu");
  EXPECT_EQ(make_backend("reference")->name(), "reference");
  EXPECT_EQ(make_backend("auto")->name(), "cpu");  // never the oracle
  EXPECT_EQ(resolve_backend("auto"), "cpu");
  EXPECT_EQ(available_backends(), (std::vector<std::string>{"cpu", "reference"}));
  EXPECT_EQ(available_devices(), (std::vector<std::string>{"cpu"}));
  // The bucket of pad_to_multiple_of="auto" belongs to the backend.
  EXPECT_EQ(make_backend("cpu")->auto_pad_multiple(), 64);
  EXPECT_EQ(make_backend("reference")->auto_pad_multiple(), 128);
  // Host backends use the caller's tensors in place.
  auto cpu = make_backend("cpu");
  const Tensor t = Tensor::from_f32(std::vector<float>{1, 2, 3}, {3});
  EXPECT_TRUE(cpu->host_memory());
  EXPECT_EQ(cpu->upload(t).data(), t.data());
  EXPECT_EQ(cpu->download(t).data(), t.data());
}

TEST(Registry, ABackendThatIsNotHereIsAnErrorNamingWhatIs) {
  const std::string cuda = error_of([] { make_backend("cuda"); });
  EXPECT_NE(cuda.find("'cuda' is not built"), std::string::npos) << cuda;
  EXPECT_NE(cuda.find("available: cpu, reference, or auto"), std::string::npos) << cuda;
  const std::string unknown = error_of([] { make_backend("tpu"); });
  EXPECT_NE(unknown.find("unknown backend 'tpu'"), std::string::npos) << unknown;
  const std::string device = error_of([] { resolve_device("cuda"); });
  EXPECT_NE(device.find("not built"), std::string::npos) << device;
  const std::string oracle = error_of([] { resolve_device("reference"); });
  EXPECT_NE(oracle.find("'reference' is not a device (devices: cpu, or auto)"), std::string::npos) << oracle;
}

// Compiling and running a program uses the backend's thread count and leaves the process's setting as it was.
TEST(Registry, CpuProgramsScopeTheirThreadCount) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  auto backend = make_cpu_backend(CpuBackendOptions{.num_threads = 2});
  graph::Builder b;
  const auto x = b.input("x", {4, 8}, DType::F32);
  const auto w = b.input("w", {8}, DType::F32);
  b.output(b.rms_norm(x, w, 1e-6));
  auto program = backend->compile(b.finish());
  EXPECT_EQ(omp_get_max_threads(), 1);
  TensorMap in;
  in["x"] = Tensor::from_f32(std::vector<float>(32, 1.0f), {4, 8});
  in["w"] = Tensor::from_f32(std::vector<float>(8, 2.0f), {8});
  const std::vector<float> out = program->run(in).at(0).to_f32_vector();
  EXPECT_EQ(omp_get_max_threads(), 1);
  for (float v : out) EXPECT_NEAR(v, 2.0f, 1e-5f);
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace trl
