// torch.backends.ember.verbose: level 1 logs every op executed on ember
// (name, argument shapes and dtypes, execution path, time in microseconds)
// to stderr; level 2 adds allocator events. Built on RecordFunction: the
// callback is installed only while the level is above 0, so "off" costs
// nothing.
#pragma once

#include <cstddef>

namespace ember::observe {

// Installs or removes the op callback to match flags::verbose_level().
void sync_op_log();

// Level-2 allocator events (called by the allocator glue).
void log_allocation(int device, size_t bytes, const void* ptr);
void log_free(int device, const void* ptr);

}  // namespace ember::observe
