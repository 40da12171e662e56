// Parquet's flat schema (a depth-first list of elements) as a tree of the values rows hold (docs/PARQUET.md):
// structs, lists (LIST-annotated groups in their three-level, two-level and legacy forms, and bare repeated fields),
// maps, and leaves (one per column chunk). Each node carries the definition level at which it is present, and lists
// the repetition level of their elements, which is all record assembly needs.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/parquet/encoding.h"
#include "data/parquet/metadata.h"

namespace trl::parquet {

struct Node {
  enum class Kind { Leaf, Struct, List, Map };
  Kind kind = Kind::Struct;
  std::string name;
  int def = 0;           // the definition level at which this value is not null
  int nonempty_def = 0;  // List / Map: the level at which it has elements
  int elem_rep = 0;      // List / Map: the repetition level of its elements
  std::vector<Node> children;  // Struct: fields; List: {element}; Map: {a struct of key and value}
  int leaf = -1;               // Leaf: index of its column chunk
};

struct Leaf {
  const SchemaElement* element = nullptr;
  std::string path;  // dotted, as in path_in_schema
  int max_def = 0, max_rep = 0;
  std::vector<const Node*> chain;  // root .. this leaf
};

struct Schema {
  Node root;
  std::vector<Leaf> leaves;  // their chains point into `root`: a Schema is built in place and not moved
  Schema() = default;
  Schema(const Schema&) = delete;
  Schema& operator=(const Schema&) = delete;
};

// Builds the tree from FileMetaData.schema into `out`; a malformed schema throws DecodeError.
void build_schema(const std::vector<SchemaElement>& elements, Schema& out);

// "string", "list<struct<content: string, role: string>>", ...
std::string type_string(const Node& node, const std::vector<Leaf>& leaves);

// The JSON value of decoded value i of a leaf column (its logical type applied).
nlohmann::ordered_json leaf_value(const SchemaElement& e, const Values& values, size_t i);

}  // namespace trl::parquet
