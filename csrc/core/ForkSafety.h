// Glue mutexes that fork() never leaves held in the child: the forking thread
// locks them before fork() and unlocks them in parent and child
// (pthread_atfork), as the runtime does for its own locks
// (ember/runtime/device.h, install_fork_handlers).
#pragma once

#include <mutex>

namespace ember {

// A std::mutex held across every fork() after its construction. The prepare
// step takes these after the runtime's locks (device creation, allocators,
// stream pools, pinned memory), in construction order, with the GIL held
// (os.fork): use one as a leaf or under runtime locks, never held while
// taking a runtime lock or the GIL, or fork() itself deadlocks. Never
// destroyed (namespace scope, or in an object never freed), and constructed
// by a thread holding no ForkHeldMutex.
class ForkHeldMutex : public std::mutex {
 public:
  ForkHeldMutex();
};

}  // namespace ember
