// The random number generator of an ember device.
//
// Random ops run as delegated CPU kernels, and those only accept a CPU
// generator. So each ember generator owns a CPU generator, its "engine",
// that holds the whole state; the delegation layer hands the engine to the
// CPU kernel. The ember generator and the process's CPU generator never
// share state, so ember random streams are independent of torch.manual_seed
// on CPU unless the user seeds both.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace ember {

class EmberGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit EmberGeneratorImpl(c10::DeviceIndex device,
                              uint64_t seed = c10::default_rng_seed_val);

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // The CPU generator delegated kernels draw from.
  at::Generator engine() const { return at::Generator(engine_); }
  // The lock CPU kernels take while drawing from the engine.
  std::mutex& engine_mutex() const { return engine_->mutex_; }

 private:
  EmberGeneratorImpl* clone_impl() const override;
  c10::intrusive_ptr<at::CPUGeneratorImpl> engine_;
};

// One default generator per device, created on first use.
const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);

// The CPU engine to pass to a delegated kernel for `generator`: the engine of
// the given ember generator, or of the device's default generator when none
// is given. A CPU generator passed to an ember op is rejected as on CUDA.
at::Generator engine_for(const std::optional<at::Generator>& generator,
                         c10::DeviceIndex device);

}  // namespace ember
