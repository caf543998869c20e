// The runtime's threads carry names (`ember-worker`, `ember-chunks`), so a
// thread listing (/proc/<pid>/task/*/comm, `top -H`) tells them from
// libgomp's, which keep the process's name.
#pragma once

#include <pthread.h>

#include <thread>
#include <utility>

namespace ember::runtime {

// Starts fn on a new thread, named before this returns: a listing taken
// after the call never sees the thread under the process's name.
// (`name`: at most 15 characters, the kernel's limit.)
template <class Fn>
std::thread start_named_thread(const char* name, Fn&& fn) {
  std::thread thread(std::forward<Fn>(fn));
  pthread_setname_np(thread.native_handle(), name);
  return thread;
}

}  // namespace ember::runtime
