#include "core/EmberGenerator.h"

#include <c10/util/Exception.h>

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

const at::Generator& default_generator(c10::DeviceIndex device) {
  static std::mutex mutex;
  static std::deque<at::Generator> generators;  // stable addresses
  translate_runtime_errors([&] { runtime::check_device_index(device); });
  std::lock_guard<std::mutex> lock(mutex);
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
