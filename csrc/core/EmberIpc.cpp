#include "core/EmberIpc.h"

#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/EmberAllocator.h"
#include "core/RuntimeErrors.h"
#include "ember/runtime/device.h"

namespace ember {
namespace {

namespace rt = ember::runtime;

std::size_t page_size() {
  static const auto size = static_cast<std::size_t>(sysconf(_SC_PAGE_SIZE));
  return size;
}

// Counters a receiver decrements when it releases a share: slots of
// kSlotsPerArea 8-byte counters in shared memory files, one file more
// whenever every slot is taken.
constexpr std::size_t kSlotsPerArea = 4096;

struct CounterArea {
  int fd = -1;
  std::int64_t* counters = nullptr;
};

struct SentShare {
  c10::Storage storage;  // keeps the block allocated
  int segment_fd = -1;   // our duplicate of the segment's file
  std::size_t area = 0;
  std::size_t slot = 0;
};

struct Sender {
  std::mutex mutex;
  std::vector<CounterArea> areas;
  std::vector<std::pair<std::size_t, std::size_t>> free_slots;
  std::vector<SentShare> held;
  std::int64_t sent = 0;

  std::atomic_ref<std::int64_t> counter(std::size_t area, std::size_t slot) {
    return std::atomic_ref<std::int64_t>(areas[area].counters[slot]);
  }

  // Caller holds mutex. Throws if no file can be made.
  std::pair<std::size_t, std::size_t> take_slot() {
    if (free_slots.empty()) {
      const std::size_t bytes = kSlotsPerArea * sizeof(std::int64_t);
      const int fd = memfd_create("ember-ipc-counters", MFD_CLOEXEC);
      TORCH_CHECK(fd >= 0,
                  "ember IPC: memfd_create failed: ", std::strerror(errno));
      void* counters = MAP_FAILED;
      if (ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
        counters =
            mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      }
      if (counters == MAP_FAILED) {
        close(fd);
        TORCH_CHECK(false, "ember IPC: cannot map a counter file: ",
                    std::strerror(errno));
      }
      areas.push_back({fd, static_cast<std::int64_t*>(counters)});
      for (std::size_t slot = kSlotsPerArea; slot-- > 0;) {
        free_slots.emplace_back(areas.size() - 1, slot);
      }
    }
    const auto slot = free_slots.back();
    free_slots.pop_back();
    return slot;
  }

  // Caller holds mutex: moves the released shares out (their storages are
  // freed by the caller, outside the lock).
  std::vector<SentShare> take_released() {
    std::vector<SentShare> released;
    std::size_t kept = 0;
    for (std::size_t i = 0; i < held.size(); ++i) {
      SentShare& share = held[i];
      if (counter(share.area, share.slot).load() <= 0) {
        free_slots.emplace_back(share.area, share.slot);
        close(share.segment_fd);
        released.push_back(std::move(share));
      } else {
        held[kept++] = std::move(share);
      }
    }
    held.resize(kept);
    return released;
  }
};

// Never destroyed: it outlives every static destructor.
std::atomic<Sender*> sender_instance{new Sender()};

Sender& sender() { return *sender_instance.load(std::memory_order_acquire); }

// A forked child starts with no shares of its own: the parent's counter
// files are shared with it (the same slots would be handed out twice), and
// the storages they hold are the child's private copies. The inherited
// registry is left behind (its mutex may be held by a thread that does not
// exist in the child).
void reset_sender_in_child() {
  sender_instance.store(new Sender(), std::memory_order_release);
}
const bool fork_handler_installed =
    (pthread_atfork(nullptr, nullptr, reset_sender_in_child), true);

std::atomic<std::int64_t> mappings_open{0};
std::atomic<std::int64_t> mapped_bytes{0};
std::atomic<std::int64_t> mappings_opened{0};

// A received storage's memory: its mapping of the segment file, and the
// sender's counter to decrement when it goes.
struct ReceivedMapping {
  void* base = nullptr;
  std::size_t length = 0;
  void* counter_page = nullptr;
  std::int64_t* counter = nullptr;
  std::size_t nbytes = 0;
};

void release_mapping(void* context) {
  auto* mapping = static_cast<ReceivedMapping*>(context);
  munmap(mapping->base, mapping->length);
  std::atomic_ref<std::int64_t>(*mapping->counter).fetch_sub(1);
  munmap(mapping->counter_page, page_size());
  mappings_open.fetch_sub(1);
  mapped_bytes.fetch_sub(static_cast<std::int64_t>(mapping->nbytes));
  delete mapping;
}

}  // namespace

std::optional<SharedStorageHandle> share_storage(const c10::Storage& storage) {
  const c10::DataPtr& data = storage.data_ptr();
  if (storage.nbytes() == 0 || data.get() == nullptr) return std::nullopt;
  const std::optional<c10::DeviceIndex> device = pool_device_of(data);
  if (!device) return std::nullopt;
  const rt::SharedSpan span = translate_runtime_errors(
      [&] { return rt::device(*device).allocator().shared_span(data.get()); });
  if (span.fd < 0) return std::nullopt;

  Sender& s = sender();
  std::vector<SentShare> released;
  SharedStorageHandle handle;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    released = s.take_released();
    std::pair<std::size_t, std::size_t> slot;
    try {
      slot = s.take_slot();
    } catch (...) {
      close(span.fd);
      throw;
    }
    s.counter(slot.first, slot.second).store(1);
    s.held.push_back({storage, span.fd, slot.first, slot.second});
    ++s.sent;
    handle.segment_fd = span.fd;
    handle.segment_size = span.segment_size;
    handle.offset = span.offset;
    handle.nbytes = storage.nbytes();
    handle.device = *device;
    handle.counter_fd = s.areas[slot.first].fd;
    handle.counter_offset = slot.second * sizeof(std::int64_t);
  }
  return handle;  // `released` storages are freed here, outside the lock
}

std::size_t collect_shared_storages() {
  Sender& s = sender();
  std::vector<SentShare> released;
  std::lock_guard<std::mutex> lock(s.mutex);
  released = s.take_released();
  return s.held.size();
}

at::Tensor open_shared_storage(const SharedStorageHandle& handle) {
  const int count = translate_runtime_errors([] { return rt::device_count(); });
  TORCH_CHECK(handle.device >= 0 && handle.device < count,
              "ember IPC: the tensor was on ember:", handle.device,
              " but this process has ", count, " ember device(s)");
  TORCH_CHECK(handle.offset + handle.nbytes <= handle.segment_size,
              "ember IPC: share out of its segment's bounds");
  const std::size_t page = page_size();
  const std::size_t begin = handle.offset / page * page;
  const std::size_t end =
      (handle.offset + handle.nbytes + page - 1) / page * page;
  void* base = mmap(nullptr, end - begin, PROT_READ | PROT_WRITE, MAP_SHARED,
                    handle.segment_fd, static_cast<off_t>(begin));
  TORCH_CHECK(base != MAP_FAILED, "ember IPC: cannot map the shared segment: ",
              std::strerror(errno));
  const std::size_t counter_begin = handle.counter_offset / page * page;
  void* counter_page =
      mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, handle.counter_fd,
           static_cast<off_t>(counter_begin));
  if (counter_page == MAP_FAILED) {
    munmap(base, end - begin);
    TORCH_CHECK(false, "ember IPC: cannot map the sender's counter file: ",
                std::strerror(errno));
  }
  auto* mapping = new ReceivedMapping{
      base, end - begin, counter_page,
      reinterpret_cast<std::int64_t*>(static_cast<char*>(counter_page) +
                                      (handle.counter_offset - counter_begin)),
      handle.nbytes};
  mappings_open.fetch_add(1);
  mappings_opened.fetch_add(1);
  mapped_bytes.fetch_add(static_cast<std::int64_t>(handle.nbytes));
  void* data = static_cast<char*>(base) + (handle.offset - begin);
  const c10::Device device(c10::DeviceType::PrivateUse1,
                           static_cast<c10::DeviceIndex>(handle.device));
  c10::Storage storage(c10::Storage::use_byte_size_t(), handle.nbytes,
                       c10::DataPtr(data, mapping, &release_mapping, device),
                       /*allocator=*/nullptr, /*resizable=*/false);
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      caffe2::TypeMeta::Make<uint8_t>());
  impl->set_sizes_contiguous({static_cast<int64_t>(handle.nbytes)});
  return at::Tensor(std::move(impl));
}

IpcStats ipc_stats() {
  IpcStats stats;
  {
    Sender& s = sender();
    std::lock_guard<std::mutex> lock(s.mutex);
    stats.shares_held = static_cast<std::int64_t>(s.held.size());
    stats.shares_sent = s.sent;
  }
  stats.mappings_open = mappings_open.load();
  stats.mapped_bytes = mapped_bytes.load();
  stats.mappings_opened = mappings_opened.load();
  return stats;
}

}  // namespace ember
