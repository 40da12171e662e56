#include "trl/data/mixture.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/rng.h"
#include "trl/core/error.h"

namespace trl {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

std::string text_field(const json& e, const char* key, const std::string& where) {
  if (!e.contains(key) || e[key].is_null()) return "";
  if (!e[key].is_string()) fail("{}: '{}' must be text, got {}", where, key, e[key].dump());
  return e[key].get<std::string>();
}

std::vector<std::string> patterns(const json& v, const std::string& where) {
  if (v.is_string()) return {v.get<std::string>()};
  std::vector<std::string> out;
  if (v.is_array())
    for (const json& p : v) {
      if (!p.is_string()) fail("{}: data_files must be paths (text), got {}", where, p.dump());
      out.push_back(p.get<std::string>());
    }
  if (out.empty()) fail("{}: data_files must be a path, a list of paths, or a mapping of split: paths; got {}", where, v.dump());
  return out;
}

DatasetMixtureEntry parse_entry(const json& e, const std::string& where) {
  if (!e.is_object()) fail("{}: each dataset is a mapping with a path (and name, data_dir, data_files, split, columns, fraction), got {}", where, e.dump());
  for (auto it = e.begin(); it != e.end(); ++it) {
    static const char* known[] = {"path", "name", "data_dir", "data_files", "split", "columns", "fraction"};
    const std::string& key = it.key();
    if (std::find_if(std::begin(known), std::end(known), [&](const char* k) { return key == k; }) == std::end(known))
      fail("{}: unknown field '{}' (TRL's DatasetConfig has path, name, data_dir, data_files, split, columns, fraction)", where, key);
  }
  DatasetMixtureEntry d;
  d.path = text_field(e, "path", where);
  if (d.path.empty()) fail("{}: 'path' is required (a Hub id, a folder or a file)", where);
  d.name = text_field(e, "name", where);
  d.data_dir = text_field(e, "data_dir", where);
  if (e.contains("split") && !e["split"].is_null()) d.split = text_field(e, "split", where);
  if (e.contains("data_files") && !e["data_files"].is_null()) {
    const json& f = e["data_files"];
    if (f.is_object()) {
      for (const auto& [split, v] : f.items()) d.data_files.emplace_back(split, patterns(v, where));
    } else {
      d.data_files.emplace_back("train", patterns(f, where));
    }
  }
  if (e.contains("columns") && !e["columns"].is_null()) {
    const json& c = e["columns"];
    std::vector<std::string> cols;
    if (c.is_string()) cols.push_back(c.get<std::string>());
    else if (c.is_array())
      for (const json& x : c) {
        if (!x.is_string()) fail("{}: columns must be column names, got {}", where, x.dump());
        cols.push_back(x.get<std::string>());
      }
    else fail("{}: columns must be a list of column names, got {}", where, c.dump());
    if (cols.empty()) fail("{}: columns is empty: name the columns to keep, or leave columns out to keep them all", where);
    for (size_t i = 0; i < cols.size(); ++i)
      if (std::find(cols.begin(), cols.begin() + static_cast<std::ptrdiff_t>(i), cols[i]) != cols.begin() + static_cast<std::ptrdiff_t>(i))
        fail("{}: column '{}' is listed twice in columns", where, cols[i]);
    d.columns = cols;
  }
  if (e.contains("fraction") && !e["fraction"].is_null()) {
    const json& f = e["fraction"];
    if (!f.is_number() || !std::isfinite(f.get<double>()) || f.get<double>() < 0)
      fail("{}: fraction must be a number >= 0 (a share of the mixture), got {}", where, f.dump());
    d.fraction = f.get<double>();
  }
  return d;
}

// The rows [0, n) of `d`, with only `columns` (all when unset); a missing column names the dataset and the row.
Dataset take(const Dataset& d, size_t n, const std::optional<std::vector<std::string>>& columns, const std::string& where) {
  Dataset out;
  out.rows.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    ojson row = d.row(i);
    if (columns) {
      ojson kept = ojson::object();
      for (const std::string& c : *columns) {
        if (!row.contains(c))
          fail("{}: column '{}' is not in {} (its columns: {})", where, c, d.location(i), fmt::join([&] {
                 std::vector<std::string> names;
                 for (const auto& [k, v] : row.items()) names.push_back(k);
                 return names;
               }(), ", "));
        kept[c] = std::move(row[c]);
      }
      row = std::move(kept);
    }
    out.rows.push_back(std::move(row));
    out.where.push_back(d.location(i));
  }
  return out;
}

void append(Dataset& to, Dataset&& from) {
  for (size_t i = 0; i < from.rows.size(); ++i) {
    to.rows.push_back(std::move(from.rows[i]));
    to.where.push_back(std::move(from.where[i]));
  }
}

}  // namespace

DatasetMixture parse_dataset_mixture(const json& datasets, const std::string& where) {
  if (!datasets.is_array() || datasets.empty())
    fail("{}: datasets must be a list of datasets (each a mapping with a path), got {}", where, datasets.dump());
  DatasetMixture m;
  for (size_t i = 0; i < datasets.size(); ++i) m.datasets.push_back(parse_entry(datasets[i], fmt::format("{}: datasets[{}]", where, i)));
  const size_t with_fraction = static_cast<size_t>(std::count_if(m.datasets.begin(), m.datasets.end(), [](const auto& d) { return d.fraction.has_value(); }));
  if (with_fraction != 0 && with_fraction != m.datasets.size())
    fail("{}: fraction must be set for either all datasets in the mixture or none of them ({} of {} have one)", where, with_fraction, m.datasets.size());
  if (with_fraction != 0) {
    double largest = 0;
    for (const auto& d : m.datasets) largest = std::max(largest, *d.fraction);
    if (!(largest > 0)) fail("{}: the fractions sum to 0; at least one dataset needs a share above 0", where);
  }
  return m;
}

std::map<std::string, Dataset> load_dataset_mixture(const DatasetMixture& m, uint64_t seed, const std::string& revision) {
  if (m.streaming && m.datasets.front().fraction) fail("datasets: a dataset fraction is not supported with streaming: true (as in TRL)");
  std::vector<Dataset> loaded;
  for (const auto& d : m.datasets) {
    if (!d.data_dir.empty() || !d.data_files.empty()) {
      if (!d.name.empty()) fail("datasets: {}: give name, or data_dir/data_files, not both", d.path);
      loaded.push_back(load_dataset_files(d.path, d.split, d.data_dir, d.data_files, revision));
    } else {
      loaded.push_back(load_dataset(d.path, d.split, d.name, revision));
    }
  }
  // TRL's shares: weights normalised; total = the largest mixture in which no dataset gives more rows than it has.
  // The fractions are scaled by the largest first, so that huge ones (1e308) cannot overflow their sum.
  std::vector<size_t> keep(loaded.size());
  for (size_t i = 0; i < loaded.size(); ++i) keep[i] = loaded[i].size();
  if (m.datasets.front().fraction) {
    double largest = 0, sum = 0, total = std::numeric_limits<double>::infinity();
    for (const auto& d : m.datasets) largest = std::max(largest, *d.fraction);
    std::vector<double> w;
    for (const auto& d : m.datasets) w.push_back(*d.fraction / largest), sum += w.back();
    for (size_t i = 0; i < loaded.size(); ++i) {
      w[i] /= sum;
      if (w[i] > 0) total = std::min(total, static_cast<double>(loaded[i].size()) / w[i]);
    }
    for (size_t i = 0; i < loaded.size(); ++i)
      keep[i] = std::min(loaded[i].size(), static_cast<size_t>(std::nearbyint(w[i] * total)));  // Python's round: half to even
  }
  Dataset all;
  for (size_t i = 0; i < loaded.size(); ++i)
    append(all, take(loaded[i], std::min(keep[i], loaded[i].size()), m.datasets[i].columns, "datasets: " + m.datasets[i].path));
  if (all.empty()) fail("datasets: the mixture has no rows");
  std::map<std::string, Dataset> splits;
  if (!m.test_split_size) {
    splits["train"] = std::move(all);
    return splits;
  }
  const double t = *m.test_split_size;
  const size_t n = all.size();
  size_t n_test = 0;
  if (t > 0 && t < 1) n_test = static_cast<size_t>(std::ceil(t * static_cast<double>(n)));
  else if (t >= 1 && t == std::floor(t)) n_test = t < static_cast<double>(n) ? static_cast<size_t>(t) : n;
  if (t >= 1 && t != std::floor(t)) fail("datasets: test_split_size {} is neither a fraction in (0, 1) nor a whole number of rows", t);
  if (n_test == 0 || n_test >= n)
    fail("datasets: test_split_size {} makes a test split of {} of the mixture's {} rows, leaving {} for train: both need at least one", t,
         std::min(n_test, n), n, n - std::min(n_test, n));
  // A seeded Fisher-Yates shuffle (datasets' train_test_split shuffles with a random seed unless given one).
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  SplitMix64 rng(seed * 0x9E3779B97F4A7C15ull + 0x243F6A8885A308D3ull);
  for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng.next() % i]);
  Dataset train, test;
  for (size_t k = 0; k < n; ++k) {
    Dataset& to = k < n - n_test ? train : test;
    to.rows.push_back(all.rows[order[k]]);
    to.where.push_back(all.where[order[k]]);
  }
  splits["train"] = std::move(train);
  splits["test"] = std::move(test);
  return splits;
}

}  // namespace trl
