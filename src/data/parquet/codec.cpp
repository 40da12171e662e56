// Page decompression with Debian's codec libraries: libsnappy (SNAPPY), libzstd (ZSTD), zlib (GZIP). The size a
// page header declares is checked before anything is allocated for it (the caller caps it) and after decoding: a
// page that decompresses to another size is an error, as is a codec this reader does not have.
#include "data/parquet/codec.h"

#include <snappy-c.h>
#include <zlib.h>
#include <zstd.h>

#include <fmt/format.h>

namespace trl::parquet {

namespace {

void gunzip(Bytes in, size_t expected, std::vector<uint8_t>& out) {
  z_stream z{};
  // 32 + MAX_WBITS: a gzip or a zlib header, whichever is there.
  if (inflateInit2(&z, 32 + MAX_WBITS) != Z_OK) throw DecodeError("GZIP: zlib could not start");
  z.next_in = const_cast<Bytef*>(in.data);
  z.avail_in = static_cast<uInt>(in.size);
  uint8_t none = 0;  // an empty page: zlib wants somewhere to write even nothing
  z.next_out = expected ? out.data() : &none;
  z.avail_out = static_cast<uInt>(expected);
  int rc = Z_OK;
  // A GZIP page may hold several gzip members one after another.
  while (true) {
    rc = inflate(&z, Z_FINISH);
    if (rc == Z_STREAM_END && z.avail_in > 0 && z.avail_out > 0) {
      inflateReset(&z);
      continue;
    }
    break;
  }
  const size_t produced = expected - z.avail_out;
  const bool more_input = z.avail_in > 0;
  inflateEnd(&z);
  if (rc != Z_STREAM_END) {
    if (rc == Z_BUF_ERROR && z.avail_out == 0) throw DecodeError(fmt::format("GZIP: the page holds more than the {} bytes its header declares", expected));
    throw DecodeError(fmt::format("GZIP: corrupt data (zlib error {}) after {} of {} bytes", rc, produced, expected));
  }
  if (produced != expected || more_input)
    throw DecodeError(fmt::format("GZIP: the page decompresses to {} bytes, its header declares {}", produced, expected));
}

}  // namespace

void decompress(Codec codec, Bytes in, size_t expected, std::vector<uint8_t>& out) {
  out.resize(expected);
  switch (codec) {
    case Codec::Uncompressed:
      if (in.size != expected) throw DecodeError(fmt::format("an uncompressed page of {} bytes declares {} bytes", in.size, expected));
      if (expected) std::memcpy(out.data(), in.data, expected);
      return;
    case Codec::Snappy: {
      size_t n = 0;
      if (snappy_uncompressed_length(reinterpret_cast<const char*>(in.data), in.size, &n) != SNAPPY_OK)
        throw DecodeError("SNAPPY: corrupt data (no valid length header)");
      if (n != expected) throw DecodeError(fmt::format("SNAPPY: the page decompresses to {} bytes, its header declares {}", n, expected));
      size_t got = expected;
      if (snappy_uncompress(reinterpret_cast<const char*>(in.data), in.size, reinterpret_cast<char*>(out.data()), &got) != SNAPPY_OK || got != expected)
        throw DecodeError("SNAPPY: corrupt data");
      return;
    }
    case Codec::Zstd: {
      // Into exactly the declared size: more is zstd's dstSize_tooSmall, less is caught below; a page may hold several
      // frames, so no single frame's content size is compared.
      const size_t got = ZSTD_decompress(out.data(), expected, in.data, in.size);
      if (ZSTD_isError(got)) throw DecodeError(fmt::format("ZSTD: {}", ZSTD_getErrorName(got)));
      if (got != expected) throw DecodeError(fmt::format("ZSTD: the page decompresses to {} bytes, its header declares {}", got, expected));
      return;
    }
    case Codec::Gzip: return gunzip(in, expected, out);
    default: break;
  }
  throw DecodeError(fmt::format("pages compressed with {} are not supported (SNAPPY, ZSTD, GZIP and UNCOMPRESSED are)", codec_name(codec)));
}

}  // namespace trl::parquet
