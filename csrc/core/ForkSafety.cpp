#include "core/ForkSafety.h"

#include <pthread.h>

#include <system_error>
#include <vector>

namespace ember {
namespace {

struct HeldMutexes {
  std::mutex registry;               // guards `mutexes`; held across fork()
  std::vector<std::mutex*> mutexes;  // in the order prepare takes them
};

// Never destroyed: fork() from an exit handler still finds them.
HeldMutexes& held() {
  static auto* list = new HeldMutexes();
  return *list;
}

void lock_before_fork() {
  HeldMutexes& list = held();
  list.registry.lock();
  for (std::mutex* mutex : list.mutexes) mutex->lock();
}

// In the parent and in the child, where the forking thread (the one that
// took the locks) is the only thread.
void unlock_after_fork() {
  HeldMutexes& list = held();
  for (auto it = list.mutexes.rbegin(); it != list.mutexes.rend(); ++it) {
    (*it)->unlock();
  }
  list.registry.unlock();
}

// POSIX runs prepare handlers in reverse registration order, so these are
// registered before the runtime's, which the runtime registers from a static
// initializer of this same library (it is linked in statically): a
// constructor with a priority runs before every initializer without one.
int handlers_installed = -1;
__attribute__((constructor(101))) void install_handlers() {
  (void)held();  // built now, not first in a prepare step
  handlers_installed =
      pthread_atfork(lock_before_fork, unlock_after_fork, unlock_after_fork);
}

}  // namespace

ForkHeldMutex::ForkHeldMutex() {
  if (handlers_installed != 0) {
    throw std::system_error(handlers_installed, std::generic_category(),
                            "ember: pthread_atfork");
  }
  HeldMutexes& list = held();
  std::lock_guard<std::mutex> lock(list.registry);
  list.mutexes.push_back(this);
}

}  // namespace ember
