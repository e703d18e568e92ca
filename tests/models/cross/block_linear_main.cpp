// A block linear on files, for the kernels cross-compiled to another architecture and run under
// an emulator (tests/models/test_other_arch_levels.py): reads cases from argv[1], writes their
// outputs to argv[2], through the same C entry points the Python layer calls.
//
// Input: int64 count, then per case int64 format, N, K, M and the raw bytes' size, the raw
// bytes (N rows of the format's GGUF blocks, as in the file; F16 / BF16: already packed, as
// layers/block_linear.py's pack writes them) and x [M, K] float32; argv[3], the IQ types'
// codebooks (kernels/tile_grids.py's table).
// Output: per case y [M, N] float32.

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

extern "C" {
struct BlockPart {
  int64_t format;
  const uint8_t* packed;
  int64_t n;
  const float* bias;
};
int rs_init(int want_amx);
const char* rs_level();
int64_t rs_block_packed_bytes(int64_t format, int64_t N, int64_t K);
int rs_block_pack(int64_t format, const uint8_t* raw, int64_t N, int64_t K, uint8_t* out);
int rs_block_linear(const float* x, int64_t M, int64_t K, const BlockPart* parts, int64_t nparts,
                    float* y, int64_t ldy);
void rs_tile_grids(const int8_t* all);
}

// formats 8, 9: F16, BF16 (layers/block_linear.py FORMATS); from 10 on the tile formats
constexpr int64_t kF16 = 8, kBF16 = 9;

namespace {

int64_t read_i64(FILE* f) {
  int64_t v = 0;
  if (fread(&v, sizeof v, 1, f) != 1) {
    fprintf(stderr, "short input\n");
    exit(2);
  }
  return v;
}

template <typename T>
std::vector<T> read_vec(FILE* f, int64_t n) {
  std::vector<T> v((size_t)n);
  if (n && fread(v.data(), sizeof(T), (size_t)n, f) != (size_t)n) {
    fprintf(stderr, "short input\n");
    exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s CASES OUT GRIDS\n", argv[0]);
    return 2;
  }
  FILE* in = fopen(argv[1], "rb");
  FILE* out = fopen(argv[2], "wb");
  FILE* grids = fopen(argv[3], "rb");
  if (!in || !out || !grids) return 2;
  fseek(grids, 0, SEEK_END);
  const long grid_bytes = ftell(grids);
  fseek(grids, 0, SEEK_SET);
  rs_tile_grids((const int8_t*)read_vec<uint8_t>(grids, grid_bytes).data());
  rs_init(0);
  fprintf(stderr, "level %s\n", rs_level());
  const int64_t cases = read_i64(in);
  for (int64_t c = 0; c < cases; ++c) {
    const int64_t format = read_i64(in), N = read_i64(in), K = read_i64(in), M = read_i64(in);
    const std::vector<uint8_t> raw = read_vec<uint8_t>(in, read_i64(in));
    const std::vector<float> x = read_vec<float>(in, M * K);
    std::vector<uint8_t> packed((size_t)rs_block_packed_bytes(format, N, K));
    if (format == kF16 || format == kBF16) {  // 16-bit parts arrive packed (the layout is Python's)
      if (raw.size() != packed.size()) return 3;
      packed = raw;
    } else if (packed.empty() || rs_block_pack(format, raw.data(), N, K, packed.data())) {
      return 3;
    }
    const BlockPart part = {format, packed.data(), N, nullptr};
    std::vector<float> y((size_t)(M * N));
    if (rs_block_linear(x.data(), M, K, &part, 1, y.data(), N)) return 4;
    fwrite(y.data(), sizeof(float), y.size(), out);
  }
  fclose(out);
  return 0;
}
