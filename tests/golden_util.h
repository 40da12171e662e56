// Helpers of the golden tests (tests/reference/ scripts' outputs in tests/data/goldens/): the tiny model they are
// computed on, and the comparison of gradients with a golden's summary of them.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "trl/models/causal_lm.h"
#include "trl/models/init.h"

namespace trl::test {

// The tiny f32 model of tests/reference/make_goldens.sh (preset tiny, seed 1234, initializer_range 0.1, random
// norms), written to a temporary folder and loaded from there.
struct GoldenModel {
  test::TempDir dir;
  CausalLM model;
  GoldenModel() : model(make()) {}
  CausalLM make() {
    InitOptions o;  // as tests/reference/make_goldens.sh makes it
    o.preset = "tiny";
    o.dtype = DType::F32;
    o.seed = 1234;
    o.initializer_range = 0.1;
    o.randomize_norms = true;
    init_model(o, dir.file("m"));
    return CausalLM::from_pretrained(dir.file("m"));
  }
};

// Step 1's gradient of every parameter against the golden's summary of it (norm, sum, L1 norm, 8 entries). The
// tolerances scale with the parameter's gradient norm: f32 sums in another order differ by ~1e-6 of it.
inline void expect_gradients(const nlohmann::json& want, const TensorMap& got, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what << ": the trained parameters differ from PyTorch's";
  for (const auto& [name, w] : want.items()) {
    ASSERT_TRUE(got.count(name)) << what << ": no gradient for " << name;
    const std::vector<float> g = got.at(name).to_f32_vector();
    double sq = 0, sum = 0, l1 = 0;
    for (float x : g) sq += static_cast<double>(x) * x, sum += x, l1 += std::fabs(x);
    const double norm = w["norm"].get<double>(), scale = std::max(norm, 1e-8);
    const auto near = [&, name = name](double value, double golden, double tol, const std::string& part) {
      EXPECT_TRUE(std::isfinite(value) && std::fabs(value - golden) <= tol)
          << what << " " << name << " " << part << ": " << value << ", PyTorch " << golden << " (tolerance " << tol << ")";
    };
    near(std::sqrt(sq), norm, 1e-4 * scale, "norm");
    near(sum, w["sum"].get<double>(), 1e-4 * std::max(w["abs_sum"].get<double>(), 1e-8), "sum");
    near(l1, w["abs_sum"].get<double>(), 1e-4 * std::max(w["abs_sum"].get<double>(), 1e-8), "L1 norm");
    for (size_t k = 0; k < w["at"].size(); ++k) {
      const size_t at = w["at"][k].get<size_t>();
      ASSERT_LT(at, g.size()) << what << " " << name;
      near(g[at], w["values"][k].get<double>(), 1e-4 * std::fabs(w["values"][k].get<double>()) + 1e-5 * scale, "entry " + std::to_string(at));
    }
  }
}

}  // namespace trl::test
