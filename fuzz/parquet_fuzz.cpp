// libFuzzer target: the Parquet reader on arbitrary bytes (docs/TESTING.md, "Fuzzing"). Reading must end in rows
// or in a trl::Error; any other exception (std::bad_alloc, std::length_error, a JSON type error), a crash, a
// sanitizer report, a leak, a time-out or more than libFuzzer's memory limit is a finding.
//   bash fuzz/run.sh [seconds]        # builds with clang (-fsanitize=fuzzer,address,undefined) and runs
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "trl/core/error.h"
#include "trl/data/parquet.h"

TRL_FUZZ_TARGET(parquet) {
  trl::parquet::ReadLimits limits;
  limits.max_page_bytes = int64_t{1} << 22;            // small limits: a finding is a bug, not a big allocation
  limits.max_values_per_row_group = int64_t{1} << 18;
  limits.max_bytes_per_row_group = int64_t{1} << 26;
  try {
    const trl::parquet::File f = trl::parquet::File::from_bytes(std::string(reinterpret_cast<const char*>(data), size), "fuzz.parquet", limits);
    (void)f.columns();
    for (int g = 0; g < f.num_row_groups(); ++g) {
      for (const auto& row : f.read_row_group(g)) (void)row.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    }
  } catch (const trl::Error&) {
  }
  return 0;
}
