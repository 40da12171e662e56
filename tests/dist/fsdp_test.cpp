// FSDP's flat shard layout (src/dist/fsdp.h): every trained element belongs to exactly one shard, pieces are the
// runs of a parameter inside a shard, and with one process the collectives over the layout are the identity.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dist/fsdp.h"

namespace trl::dist {
namespace {

// Parameters of odd sizes, an empty one among them, so that shard edges fall inside tensors.
const std::vector<std::pair<std::string, int64_t>> kParams = {{"a", 7}, {"b", 0}, {"c", 13}, {"d", 1}, {"e", 10}};

TEST(FlatShards, EveryElementIsInExactlyOneShard) {
  for (int F : {1, 2, 3, 4, 31, 40}) {
    SCOPED_TRACE(F);
    std::map<std::string, std::vector<int>> owners;  // parameter -> how many shards hold each element
    for (const auto& [name, n] : kParams) owners[name].assign(static_cast<size_t>(n), 0);
    int64_t held = 0;
    for (int j = 0; j < F; ++j) {
      const FlatShards fs(kParams, F, j);
      EXPECT_EQ(fs.total(), 31);
      EXPECT_EQ(fs.shard_size(), (31 + F - 1) / F);
      int64_t at = 0;
      for (const FlatShards::Piece& p : fs.pieces()) {
        EXPECT_GT(p.length, 0) << p.name;
        EXPECT_EQ(p.at, at) << "pieces are consecutive in the shard";
        at += p.length;
        for (int64_t i = p.offset; i < p.offset + p.length; ++i) ++owners.at(p.name).at(static_cast<size_t>(i));
      }
      EXPECT_LE(at, fs.shard_size());
      held += at;
    }
    EXPECT_EQ(held, 31);
    for (const auto& [name, counts] : owners)
      for (size_t i = 0; i < counts.size(); ++i) EXPECT_EQ(counts[i], 1) << name << "[" << i << "]";
  }
}

TEST(FlatShards, RunsCoverARangeInOrder) {
  const FlatShards fs(kParams, 2, 0);
  std::vector<std::tuple<size_t, int64_t, int64_t, int64_t>> runs;
  fs.for_each_run(5, 40, [&](size_t p, int64_t offset, int64_t length, int64_t flat) { runs.emplace_back(p, offset, length, flat); });
  // a[5..7), c[0..13), d[0..1), e[0..10): the padding past 31 has no parameter, the empty b no run.
  const std::vector<std::tuple<size_t, int64_t, int64_t, int64_t>> want = {{0, 5, 2, 5}, {2, 0, 13, 7}, {3, 0, 1, 20}, {4, 0, 10, 21}};
  EXPECT_EQ(runs, want);
}

TEST(FlatShards, CollectivesOfOneProcessAreTheIdentity) {
  // One process, F = 1: the shard is everything.
  auto& one = world();
  if (one.size() != 1) GTEST_SKIP() << "run as one process";
  const FlatShards fs(kParams, 1, 0);
  std::map<std::string, Tensor> grads, whole;
  std::map<std::string, Shape> shapes;
  float x = 0.5f;
  for (const auto& [name, n] : kParams) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& e : v) e = x, x += 1.0f;
    grads[name] = Tensor::from_f32(v, {n});
    whole[name] = Tensor::from_f32(v, {n}, DType::BF16);
    shapes[name] = {n};
  }
  std::vector<float> shard(static_cast<size_t>(fs.shard_size()), -1.0f);
  reduce_scatter_flat(one, fs, grads, shard.data());
  for (size_t i = 0; i < shard.size(); ++i) EXPECT_EQ(shard[i], 0.5f + static_cast<float>(i));
  all_gather_flat(one, fs, whole);  // the only shard is this rank's: unchanged
  EXPECT_EQ(whole.at("c").to_f32_vector(), grads.at("c").to_f32_vector());
  std::map<std::string, Tensor> pieces;
  for (const FlatShards::Piece& p : fs.pieces()) pieces[p.name] = grads.at(p.name).slice_flat(p.offset, {p.length});
  const auto gathered = gather_whole(one, fs, pieces, shapes);
  for (const auto& [name, n] : kParams) EXPECT_EQ(gathered.at(name).to_f32_vector(), grads.at(name).to_f32_vector()) << name;
}

}  // namespace
}  // namespace trl::dist
