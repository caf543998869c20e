#include "core/EmberGenerator.h"

#include <c10/util/Exception.h>
#include <pthread.h>

#include <deque>
#include <mutex>

#include "core/RuntimeErrors.h"
#include "ember/runtime/device.h"

namespace ember {

EmberGeneratorImpl::EmberGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      engine_(c10::make_intrusive<at::CPUGeneratorImpl>(seed)) {}

void EmberGeneratorImpl::set_current_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(engine_->mutex_);
  engine_->set_current_seed(seed);
}

void EmberGeneratorImpl::set_offset(uint64_t offset) {
  std::lock_guard<std::mutex> lock(engine_->mutex_);
  engine_->set_offset(offset);
}

uint64_t EmberGeneratorImpl::get_offset() const {
  std::lock_guard<std::mutex> lock(engine_->mutex_);
  return engine_->get_offset();
}

uint64_t EmberGeneratorImpl::current_seed() const {
  std::lock_guard<std::mutex> lock(engine_->mutex_);
  return engine_->current_seed();
}

uint64_t EmberGeneratorImpl::seed() {
  std::lock_guard<std::mutex> lock(engine_->mutex_);
  return engine_->seed();
}

void EmberGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  std::lock_guard<std::mutex> lock(engine_->mutex_);
  engine_->set_state(new_state);
}

c10::intrusive_ptr<c10::TensorImpl> EmberGeneratorImpl::get_state() const {
  std::lock_guard<std::mutex> lock(engine_->mutex_);
  return engine_->get_state();
}

EmberGeneratorImpl* EmberGeneratorImpl::clone_impl() const {
  auto* copy = new EmberGeneratorImpl(device().index());
  std::lock_guard<std::mutex> lock(engine_->mutex_);
  auto state = engine_->get_state();
  copy->engine_->set_state(*state);
  return copy;
}

namespace {

// The default generators, one per device, created on first use.
std::mutex generators_mutex;  // constant-initialized
std::deque<at::Generator>& generators() {
  static std::deque<at::Generator> all;  // stable addresses
  return all;
}

// fork(): a child must not inherit an engine lock held by a thread it does
// not have (a random op running on another thread). Random kernels take
// the engine lock and then allocate (runtime locks), so these handlers are
// registered after the runtime's: their prepare step runs first.
// Generators created with torch.Generator("ember") are not tracked.
void lock_before_fork() {
  generators_mutex.lock();
  // Python's generator methods hold the generator's own lock, then the
  // engine's; the same order here.
  for (const at::Generator& generator : generators()) {
    auto* impl =
        static_cast<EmberGeneratorImpl*>(generator.unsafeGetGeneratorImpl());
    impl->mutex_.lock();
    impl->engine_mutex().lock();
  }
}

void unlock_after_fork() {
  auto& all = generators();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    auto* impl = static_cast<EmberGeneratorImpl*>(it->unsafeGetGeneratorImpl());
    impl->engine_mutex().unlock();
    impl->mutex_.unlock();
  }
  generators_mutex.unlock();
}

void install_fork_handlers() {
  static const bool installed = [] {
    runtime::install_fork_handlers();
    TORCH_CHECK(pthread_atfork(lock_before_fork, unlock_after_fork,
                               unlock_after_fork) == 0,
                "ember: pthread_atfork failed");
    return true;
  }();
  (void)installed;
}

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex device) {
  translate_runtime_errors([&] { runtime::check_device_index(device); });
  install_fork_handlers();
  std::lock_guard<std::mutex> lock(generators_mutex);
  auto& generators = ember::generators();
  while (generators.size() < static_cast<size_t>(runtime::device_count())) {
    const auto index = static_cast<c10::DeviceIndex>(generators.size());
    generators.push_back(at::make_generator<EmberGeneratorImpl>(index));
  }
  return generators[device];
}

at::Generator new_generator(c10::DeviceIndex device) {
  if (device < 0)
    device = static_cast<c10::DeviceIndex>(runtime::current_device());
  translate_runtime_errors([&] { runtime::check_device_index(device); });
  return at::make_generator<EmberGeneratorImpl>(device);
}

at::Generator engine_for(const std::optional<at::Generator>& generator,
                         c10::DeviceIndex device) {
  if (!generator.has_value() || !generator->defined()) {
    return static_cast<EmberGeneratorImpl*>(
               default_generator(device).unsafeGetGeneratorImpl())
        ->engine();
  }
  TORCH_CHECK(generator->device().type() == c10::DeviceType::PrivateUse1,
              "Expected a 'ember' device type for generator but found '",
              generator->device().type(), "'");
  return static_cast<EmberGeneratorImpl*>(generator->unsafeGetGeneratorImpl())
      ->engine();
}

}  // namespace ember
