#include "train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "trl/core/error.h"

namespace trl {

namespace {

// The reflected Castagnoli polynomial, one table of 256 entries.
constexpr std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32c = crc32c_table();

uint32_t masked_crc(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// Protobuf's wire format, for the few fields written here.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void key(std::string& out, int field, int wire_type) { varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type)); }
void bytes_field(std::string& out, int field, const std::string& bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out += bytes;
}
template <class T>
void fixed_field(std::string& out, int field, T value) {  // double: wire type 1; float: wire type 5 (little-endian)
  key(out, field, sizeof(T) == 8 ? 1 : 5);
  char b[sizeof(T)];
  std::memcpy(b, &value, sizeof(T));
  out.append(b, sizeof(T));
}

// Event {wall_time = 1, step = 2, summary = 5} around one Summary.Value.
std::string event_with_value(double wall_time, int64_t step, const std::string& value) {
  std::string summary, event;
  bytes_field(summary, 1, value);  // Summary.value
  fixed_field(event, 1, wall_time);
  key(event, 2, 0);
  varint(event, static_cast<uint64_t>(step));
  bytes_field(event, 5, summary);
  return event;
}

void le(std::string& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = kCrc32c[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::string tensorboard_tag(const std::string& key) {
  for (const char* prefix : {"eval_", "test_"}) {
    const std::string p = prefix;
    if (key.rfind(p, 0) == 0) return p.substr(0, p.size() - 1) + "/" + key.substr(p.size());
  }
  return "train/" + key;
}

std::string TensorBoardWriter::file_name(double wall_time, int n) {
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  return fmt::format("events.out.tfevents.{}.{}.{}.{}", static_cast<int64_t>(wall_time), host, static_cast<long>(::getpid()), n);
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, double wall_time) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("--logging_dir {}: cannot create the folder for TensorBoard's event files: {}", dir, ec.message());
  for (int n = 0; path_.empty() || std::filesystem::exists(path_, ec); ++n) path_ = (std::filesystem::path(dir) / file_name(wall_time, n)).string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) fail("{}: cannot create TensorBoard's event file: {}", path_, std::strerror(errno));
  std::string event;
  fixed_field(event, 1, wall_time);
  bytes_field(event, 3, "brain.Event:2");  // Event.file_version
  write_event(event);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::write_event(const std::string& event) {
  std::string record;
  le(record, event.size(), 8);
  le(record, masked_crc(record.data(), 8), 4);
  record += event;
  le(record, masked_crc(event.data(), event.size()), 4);
  // A whole record per write, flushed: TensorBoard reads the file while it grows, and a reader stops cleanly at a
  // record cut short by a crash.
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0)
    fail("{}: writing a TensorBoard event failed: {}", path_, std::strerror(errno));
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step, double wall_time) {
  std::string v;
  bytes_field(v, 1, tag);                              // Summary.Value.tag
  fixed_field(v, 2, static_cast<float>(value));        // Summary.Value.simple_value
  write_event(event_with_value(wall_time, step, v));
}

void TensorBoardWriter::add_text(const std::string& tag, const std::string& text, int64_t step, double wall_time) {
  std::string plugin, metadata, dim, shape, tensor, v;
  bytes_field(plugin, 1, "text");  // PluginData.plugin_name (content: the text plugin's data, version 0, is empty)
  bytes_field(metadata, 1, plugin);  // SummaryMetadata.plugin_data
  key(dim, 1, 0);
  varint(dim, 1);                    // TensorShapeProto.Dim.size = 1
  bytes_field(shape, 2, dim);        // TensorShapeProto.dim
  key(tensor, 1, 0);
  varint(tensor, 7);                 // TensorProto.dtype = DT_STRING
  bytes_field(tensor, 2, shape);     // TensorProto.tensor_shape
  bytes_field(tensor, 8, text);      // TensorProto.string_val
  bytes_field(v, 1, tag + "/text_summary");
  bytes_field(v, 9, metadata);       // Summary.Value.metadata
  bytes_field(v, 8, tensor);         // Summary.Value.tensor
  write_event(event_with_value(wall_time, step, v));
}

void TensorBoardWriter::add_log_entry(const nlohmann::ordered_json& entry, double wall_time) {
  const int64_t step = entry.value("step", int64_t{0});
  for (const auto& [name, value] : entry.items()) {
    if (name == "step" || !value.is_number()) continue;
    add_scalar(tensorboard_tag(name), value.get<double>(), step, wall_time);  // NaN and inf too, as torch writes them
  }
}

}  // namespace trl
