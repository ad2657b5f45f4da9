#include "core/options.h"

#include <sstream>
#include <stdexcept>
#include <string>

namespace paddle_ext::runtime {

void validate(const AllocatorOptions& o) {
  const auto pow2 = [](std::size_t v) { return v != 0 && (v & (v - 1)) == 0; };
  if (!pow2(o.alignment) || o.alignment < kMinAlignment || o.alignment > kMaxAlignment)
    throw std::invalid_argument("alignment must be a power of two in [" + std::to_string(kMinAlignment) + ", " +
                                std::to_string(kMaxAlignment) + "], got " + std::to_string(o.alignment));
  if (o.chunk_size > kMaxChunkSize)
    throw std::invalid_argument("chunk_size must be in [0, " + std::to_string(kMaxChunkSize) + "] bytes, got " +
                                std::to_string(o.chunk_size));
  if (!(o.reuse_waste >= 0.0 && o.reuse_waste <= kMaxReuseWaste))  // NaN fails both
  {
    std::ostringstream text;  // 1.5, not to_string's 1.500000
    text << "reuse_waste must be a fraction in [0, " << kMaxReuseWaste << "], got " << o.reuse_waste;
    throw std::invalid_argument(text.str());
  }
  if (o.spare_events > 4096)
    throw std::invalid_argument("spare_events must be in [0, 4096], got " + std::to_string(o.spare_events));
  if (o.debug.fill_value < -1 || o.debug.fill_value > 255)
    throw std::invalid_argument("fill_value must be -1 (off) or a byte value in [0, 255], got " +
                                std::to_string(o.debug.fill_value));
}

}  // namespace paddle_ext::runtime
