// Large fresh outputs: glibc serves blocks above its mmap threshold (at most
// 32 MiB) straight from mmap, and Paddle's CPU allocator hands them out as is,
// so the first write to every 4 KiB page of a big output takes a page fault.
// For an 800 MB table gradient that is 200k faults, most of the op's time.
// Asking for transparent huge pages cuts the faults 512-fold; the kernel
// ignores the advice where THP is off, so it is always safe to give.
#pragma once

#include <cstddef>

namespace paddle_ext {

void advise_huge_pages(void* data, std::size_t bytes);

}  // namespace paddle_ext
