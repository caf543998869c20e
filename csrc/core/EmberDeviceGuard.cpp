#include "core/EmberDeviceGuard.h"

#include <c10/util/Exception.h>

#include <stdexcept>

#include "core/RuntimeErrors.h"
#include "ember/runtime/device.h"
#include "ember/runtime/stream.h"

namespace ember {
namespace {

namespace rt = ember::runtime;

void check_ember(c10::Device device) {
  TORCH_CHECK(device.type() == c10::DeviceType::PrivateUse1,
              "expected an ember device, got ", device);
}

c10::Stream to_c10(const rt::Stream& stream) {
  return c10::Stream(
      c10::Stream::UNSAFE,
      c10::Device(c10::DeviceType::PrivateUse1,
                  static_cast<c10::DeviceIndex>(stream.device_index())),
      stream.id());
}

rt::Stream& from_c10(const c10::Stream& stream) {
  check_ember(stream.device());
  return translate_runtime_errors([&]() -> rt::Stream& {
    try {
      return rt::device(stream.device_index()).streams().get(stream.id());
    } catch (const std::out_of_range&) {
      TORCH_CHECK(false, "unknown ember stream id ", stream.id(), " on ",
                  stream.device());
    }
  });
}

c10::DeviceIndex index_or_current(c10::Device device) {
  return device.has_index()
             ? device.index()
             : static_cast<c10::DeviceIndex>(rt::current_device());
}

}  // namespace

c10::Device EmberDeviceGuardImpl::exchangeDevice(c10::Device device) const {
  const c10::Device previous = getDevice();
  if (device.index() != previous.index()) setDevice(device);
  return previous;
}

c10::Device EmberDeviceGuardImpl::getDevice() const {
  return c10::Device(static_type,
                     static_cast<c10::DeviceIndex>(rt::current_device()));
}

void EmberDeviceGuardImpl::setDevice(c10::Device device) const {
  check_ember(device);
  translate_runtime_errors([&] { rt::set_current_device(device.index()); });
}

void EmberDeviceGuardImpl::uncheckedSetDevice(
    c10::Device device) const noexcept {
  try {
    rt::set_current_device(device.index());
  } catch (...) {
  }
}

c10::DeviceIndex EmberDeviceGuardImpl::deviceCount() const noexcept {
  try {
    return static_cast<c10::DeviceIndex>(rt::device_count());
  } catch (...) {
    return 0;  // a bad EMBER_DEVICES is reported at import, not here
  }
}

c10::Stream EmberDeviceGuardImpl::getStream(c10::Device device) const {
  return translate_runtime_errors([&] {
    return to_c10(rt::device(index_or_current(device)).streams().current());
  });
}

c10::Stream EmberDeviceGuardImpl::getDefaultStream(c10::Device device) const {
  return translate_runtime_errors([&] {
    return to_c10(
        rt::device(index_or_current(device)).streams().default_stream());
  });
}

c10::Stream EmberDeviceGuardImpl::getStreamFromGlobalPool(
    c10::Device device, bool high_priority) const {
  return getNewStream(device, high_priority ? -1 : 0);
}

c10::Stream EmberDeviceGuardImpl::getNewStream(c10::Device device,
                                               int priority) const {
  return translate_runtime_errors([&] {
    return to_c10(
        rt::device(index_or_current(device)).streams().create(priority));
  });
}

c10::Stream EmberDeviceGuardImpl::exchangeStream(c10::Stream stream) const {
  rt::Stream& next = from_c10(stream);
  auto& pool = rt::device(next.device_index()).streams();
  const c10::Stream previous = to_c10(pool.current());
  pool.set_current(next.id());
  return previous;
}

bool EmberDeviceGuardImpl::queryStream(const c10::Stream& stream) const {
  rt::Stream& target = from_c10(stream);
  // Held work counts as unfinished: submitted, so that a host polling
  // query() sees it finish.
  translate_runtime_errors([&] { target.submit_held(); });
  return target.query();
}

void EmberDeviceGuardImpl::synchronizeStream(const c10::Stream& stream) const {
  rt::Stream& target = from_c10(stream);
  translate_runtime_errors([&] { target.synchronize(); });
}

c10::DeviceCapability EmberDeviceGuardImpl::getDeviceCapability(
    c10::Device device) const {
  translate_runtime_errors([&] {
    if (device.index() >= 0) rt::device(device.index());
  });
  c10::DeviceCapability capability;  // all dtypes
  auto& types = capability.capability_data.supported_scalar_types;
  types.has_QInt8 = types.has_QUInt8 = types.has_QInt32 = false;
  types.has_QUInt4x2 = types.has_QUInt2x4 = false;
  return capability;
}

void EmberDeviceGuardImpl::synchronizeDevice(
    c10::DeviceIndex device_index) const {
  translate_runtime_errors([&] {
    const int index = device_index < 0 ? rt::current_device() : device_index;
    rt::device(index).synchronize();
  });
}

void EmberDeviceGuardImpl::record(void** event, const c10::Stream& stream,
                                  c10::DeviceIndex device_index,
                                  c10::EventFlag flag) const {
  TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
              "Event device index ", device_index,
              " does not match recording stream's device index ",
              stream.device_index(), ".");
  rt::Stream& target = from_c10(stream);
  auto* ember_event = static_cast<rt::Event*>(*event);
  if (ember_event == nullptr) {
    // BACKEND_DEFAULT is what torch.Event(enable_timing=True) asks for.
    ember_event = new rt::Event(flag == c10::EventFlag::BACKEND_DEFAULT);
    *event = ember_event;
  }
  translate_runtime_errors([&] { ember_event->record(target); });
}

void EmberDeviceGuardImpl::block(void* event, const c10::Stream& stream) const {
  if (event == nullptr) return;  // never recorded: nothing to wait for
  rt::Stream& target = from_c10(stream);
  translate_runtime_errors(
      [&] { static_cast<rt::Event*>(event)->block(target); });
}

bool EmberDeviceGuardImpl::queryEvent(void* event) const {
  return event == nullptr || static_cast<rt::Event*>(event)->query();
}

void EmberDeviceGuardImpl::synchronizeEvent(void* event) const {
  if (event == nullptr) return;
  translate_runtime_errors(
      [&] { static_cast<rt::Event*>(event)->synchronize(); });
}

double EmberDeviceGuardImpl::elapsedTime(void* start, void* end,
                                         c10::DeviceIndex) const {
  TORCH_CHECK(start != nullptr && end != nullptr,
              "Both events must be recorded before calculating elapsed time.");
  try {
    return static_cast<rt::Event*>(start)->elapsed_ms(
        *static_cast<rt::Event*>(end));
  } catch (const std::logic_error& e) {
    TORCH_CHECK(false, e.what());
  }
}

void EmberDeviceGuardImpl::destroyEvent(void* event,
                                        c10::DeviceIndex) const noexcept {
  delete static_cast<rt::Event*>(event);
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, EmberDeviceGuardImpl);

}  // namespace ember
