// Record assembly (docs/PARQUET.md): a leaf column's (repetition, definition, value) triplets written into a row
// group's rows along the leaf's chain of nodes; then maps with string keys turned into objects.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/parquet/column_reader.h"
#include "data/parquet/schema.h"

namespace trl::parquet {

using ojson = nlohmann::ordered_json;

class Assembler {
 public:
  // The first column of a row group creates its rows (up to num_rows); the others fill them. Every row, object,
  // array and value is charged to the budget (ReadLimits::max_bytes_per_row_group).
  Assembler(const Leaf& leaf, std::vector<ojson>& rows, int64_t num_rows, size_t row_fields, bool creates_rows, RowGroupBudget& budget)
      : leaf_(leaf), rows_(rows), num_rows_(num_rows), row_fields_(row_fields), creates_rows_(creates_rows), budget_(budget),
        index_(static_cast<size_t>(leaf.max_rep) + 1, 0) {}

  void add(const Page& p) {
    size_t vi = 0;
    for (size_t i = 0; i < p.num_levels; ++i) {
      const int r = p.rep.empty() ? 0 : static_cast<int>(p.rep[i]);
      const int d = p.def.empty() ? leaf_.max_def : static_cast<int>(p.def[i]);
      if (r == 0) {
        ++row_;
        if (creates_rows_) {
          if (row_ >= num_rows_) decode_error("the column holds more rows than the row group's {}", num_rows_);
          budget_.take_bytes(64 + 48 * static_cast<int64_t>(row_fields_));
          rows_.emplace_back(ojson::object()).get_ref<ojson::object_t&>().reserve(row_fields_);
        } else if (row_ >= static_cast<int64_t>(rows_.size())) {
          decode_error("the column holds more rows than the row group's first column ({})", rows_.size());
        }
      } else if (row_ < 0) {
        decode_error("the column's first entry continues a row (repetition level {})", r);
      }
      place(r, d, p, i, vi);
    }
    if (vi != p.values.size()) decode_error("{} values for {} present entries", p.values.size(), vi);
  }

  int64_t rows_seen() const { return row_ + 1; }

 private:
  static ojson& field(ojson& object, const std::string& name) {
    auto& obj = object.get_ref<ojson::object_t&>();
    return obj.emplace(name, nullptr).first->second;
  }

  [[noreturn]] void disagree(const Node& n) const {
    decode_error("row {}: the column disagrees with an earlier column on the shape of '{}'", row_, n.name);
  }

  // The elements of the list that starts at entry i of the page (at repetition level `rep`), as far as the page
  // holds them: arrays get their size before they fill (no regrowth; a list that goes on in the next page grows).
  static size_t elements_ahead(const Page& p, size_t i, int rep) {
    size_t n = 1;
    const auto level = static_cast<uint32_t>(rep);
    for (size_t j = i + 1; j < p.num_levels && p.rep[j] >= level; ++j) n += p.rep[j] == level;
    return n;
  }

  // Writes entry i of page p, (r, d, value), into rows_[row_] along the leaf's chain.
  void place(int r, int d, const Page& p, size_t i, size_t& vi) {
    const Values& values = p.values;
    ojson* slot = &rows_[static_cast<size_t>(row_)];
    if (slot->is_null()) *slot = ojson::object();
    const auto& chain = leaf_.chain;
    for (size_t k = 1; k < chain.size(); ++k) {
      const Node& parent = *chain[k - 1];
      const Node& n = *chain[k];
      if (parent.kind == Node::Kind::Struct) {
        slot = &field(*slot, n.name);
      } else {  // an element of a list or map: which one, from the repetition level
        size_t& idx = index_[static_cast<size_t>(parent.elem_rep)];
        if (r < parent.elem_rep) idx = 0;
        else if (r == parent.elem_rep) ++idx;
        auto& arr = slot->get_ref<ojson::array_t&>();
        if (idx == arr.size()) budget_.take_bytes(16), arr.emplace_back(nullptr);
        else if (idx > arr.size()) decode_error("row {}: list '{}' skips from {} to element {}", row_, parent.name, arr.size(), idx);
        slot = &arr[idx];
      }
      if (d < n.def) {  // null here
        if (!slot->is_null()) disagree(n);
        return;
      }
      switch (n.kind) {
        case Node::Kind::Leaf:
          if (vi >= values.size()) decode_error("more present entries than the page's {} values", values.size());
          budget_.take_bytes(16 + (values.bytes.empty() ? 0 : 32 + static_cast<int64_t>(values.bytes[vi].size())));
          *slot = leaf_value(*leaf_.element, values, vi++);
          return;
        case Node::Kind::Struct:
          if (slot->is_null()) {
            budget_.take_bytes(64 + 48 * static_cast<int64_t>(n.children.size()));
            *slot = ojson::object();
            slot->get_ref<ojson::object_t&>().reserve(n.children.size());  // no regrowth: keys are copied when it moves
          } else if (!slot->is_object()) {
            disagree(n);
          }
          break;
        case Node::Kind::List:
        case Node::Kind::Map:
          if (slot->is_null()) {
            *slot = ojson::array();
            if (d >= n.nonempty_def && !p.rep.empty()) slot->get_ref<ojson::array_t&>().reserve(elements_ahead(p, i, n.elem_rep));
          } else if (!slot->is_array()) {
            disagree(n);
          }
          if (d < n.nonempty_def) return;  // an empty list
          break;
      }
    }
  }

  const Leaf& leaf_;
  std::vector<ojson>& rows_;
  int64_t num_rows_;
  size_t row_fields_;
  bool creates_rows_;
  RowGroupBudget& budget_;
  std::vector<size_t> index_;  // per repetition level: the element being written
  int64_t row_ = -1;
};

// Maps were assembled as arrays of {key, value}: string-keyed ones become JSON objects (as `datasets` gives dicts).
inline void convert_maps(const Node& n, ojson& v) {
  if (v.is_null()) return;
  switch (n.kind) {
    case Node::Kind::Leaf: return;
    case Node::Kind::Struct:
      for (const Node& c : n.children)
        if (auto it = v.find(c.name); it != v.end()) convert_maps(c, *it);
      return;
    case Node::Kind::List:
      for (ojson& e : v) convert_maps(n.children[0], e);
      return;
    case Node::Kind::Map: {
      const Node& key = n.children[0].children[0];
      const Node& value = n.children[0].children[1];
      bool string_keys = true;
      for (ojson& e : v) {
        if (!e.is_object()) return;
        if (auto it = e.find(value.name); it != e.end()) convert_maps(value, *it);
        auto k = e.find(key.name);
        string_keys = string_keys && k != e.end() && k->is_string();
      }
      if (!string_keys) return;  // other keys stay a list of {key, value} objects
      ojson obj = ojson::object();
      for (ojson& e : v) {
        auto it = e.find(value.name);
        obj[e[key.name].get<std::string>()] = it == e.end() ? ojson() : std::move(*it);
      }
      v = std::move(obj);
      return;
    }
  }
}

inline bool has_map(const Node& n) {
  if (n.kind == Node::Kind::Map) return true;
  for (const Node& c : n.children)
    if (has_map(c)) return true;
  return false;
}

}  // namespace trl::parquet
