// How the op being executed ran on ember, for torch.backends.ember.verbose:
// kernels mark it on the calling thread, the op log reads it when the op
// ends. A thread-local store: free enough to do unconditionally.
#pragma once

namespace ember::observe {

enum class ExecutionPath : unsigned char {
  kUnmarked,   // ember's own registered kernel, or a composite of other ops
  kNative,     // ember's own kernel (engine path, details in route)
  kDelegated,  // CPU's kernel on aliases of ember memory, zero-copy
  kCopied,     // CPU's kernel, with a result copied back (counted fallback)
};

inline thread_local ExecutionPath t_path = ExecutionPath::kUnmarked;
inline thread_local const char* t_route = nullptr;  // e.g. "onednn/bf16"
// The op running on this thread (a static name), for heap checks and the
// queue waits launch_stats() counts. Set through CurrentOpScope only.
inline thread_local const char* t_current_op = nullptr;

// Names the op running on this thread while it lives, then restores the
// name it found: a wait after the op (a copy, a synchronous kernel that is
// no delegated op) is not counted under the last delegated op's name.
class CurrentOpScope {
 public:
  explicit CurrentOpScope(const char* op) : previous_(t_current_op) {
    t_current_op = op;
  }
  ~CurrentOpScope() { t_current_op = previous_; }
  CurrentOpScope(const CurrentOpScope&) = delete;
  CurrentOpScope& operator=(const CurrentOpScope&) = delete;

 private:
  const char* previous_;
};

inline void mark_path(ExecutionPath path, const char* route = nullptr) {
  // A copy is the most telling fact about a call: never downgrade it.
  if (t_path == ExecutionPath::kCopied) return;
  t_path = path;
  if (route != nullptr) t_route = route;
}

}  // namespace ember::observe
