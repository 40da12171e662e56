// libFuzzer target: safetensors files and a sharded checkpoint's index (docs/TESTING.md, "Fuzzing"). The first byte
// picks the reader: even, the bytes are model.safetensors (header, offsets, dtypes, shapes; every tensor read);
// odd, the rest is model.safetensors.index.json beside one valid shard. Anything but tensors or a trl::Error is a
// finding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "trl/core/error.h"
#include "trl/io/safetensors.h"

namespace {

// A valid one-tensor shard the index may name (written once).
void write_shard(const std::string& dir) {
  static bool done = false;
  if (done) return;
  trl::TensorMap t;
  const std::vector<float> values = {1, 2, 3, 4};
  t["a.weight"] = trl::Tensor::from_f32(values, {2, 2});
  trl::save_safetensors(dir + "/model-00001-of-00001.safetensors", t);
  done = true;
}

}  // namespace

TRL_FUZZ_TARGET(safetensors) {
  if (size == 0) return 0;
  const bool index = data[0] & 1;
  try {
    if (!index) {
      const trl::SafeTensorsFile f = trl::SafeTensorsFile::open(trl::fuzz::write("model.safetensors", data + 1, size - 1));
      double sum = 0;
      for (const std::string& name : f.names()) {
        const trl::Tensor t = f.get(name);
        if (t.numel() > 0 && t.nbytes() > 0) sum += static_cast<double>(reinterpret_cast<const uint8_t*>(t.data())[t.nbytes() - 1]);
      }
      (void)sum;
    } else {
      const std::string dir = trl::fuzz::scratch() + "/sharded";
      write_shard(dir);
      trl::fuzz::write("sharded/model.safetensors.index.json", data + 1, size - 1);
      const trl::Checkpoint c = trl::Checkpoint::open(dir);
      for (const std::string& name : c.names()) (void)c.get(name).numel();
    }
  } catch (const trl::Error&) {
  }
  return 0;
}
