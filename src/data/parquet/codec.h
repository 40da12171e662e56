// Page decompression (codec.cpp): out holds exactly `expected` bytes afterwards, or DecodeError says why not.
#pragma once

#include <cstring>
#include <vector>

#include "data/parquet/encoding.h"

namespace trl::parquet {

void decompress(Codec codec, Bytes in, size_t expected, std::vector<uint8_t>& out);

}  // namespace trl::parquet
