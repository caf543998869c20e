// Zero-copy sharing of ember storages between processes (the C++ half of
// torch_ember/ember/ipc.py). ember segments are memory files (runtime
// segment_memory.h): the sender hands the receiver a descriptor of the
// block's segment file and the block's place in it; the receiver maps that
// range and wraps it as an ember storage owned by the mapping.
//
// Lifetime, as CUDA's IPC ref-counter files: the sender keeps the storage
// (so its block is not reused) together with a counter in a small shared
// memory file, set to 1. The receiver's storage decrements it when it dies;
// the sender drops storages whose counter reached 0 at its next share or at
// ipc_collect(). Each share is meant to be received once (as an mp.Queue
// item is); a receiver that never rebuilds it or never frees it keeps the
// block held in the sender until the sender exits.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace ember {

// What travels to the receiver. The descriptors stay owned by the sender
// (open while the share is held), so they can be passed by fd passing at
// any time before the receiver releases the share.
struct SharedStorageHandle {
  int segment_fd = -1;
  std::size_t segment_size = 0;
  std::size_t offset = 0;  // of the storage's bytes in the segment file
  std::size_t nbytes = 0;
  int device = 0;
  int counter_fd = -1;
  std::size_t counter_offset = 0;
};

// Shares an ember storage, or nullopt when its memory cannot be shared
// without a copy (not from an ember pool, or in a segment without a memory
// file). Drops the storages of earlier shares whose receivers are done.
std::optional<SharedStorageHandle> share_storage(const c10::Storage& storage);

// Drops the storages of shares every receiver has released; returns how
// many shares are still held (torch.ember.ipc_collect).
std::size_t collect_shared_storages();

// In the receiver: maps a share and returns a uint8 ember tensor over the
// whole storage (its own storage, not resizable, freed by unmapping). The
// descriptors are not taken over (the caller closes them).
at::Tensor open_shared_storage(const SharedStorageHandle& handle);

struct IpcStats {
  std::int64_t shares_held = 0;      // sender: storages kept for receivers
  std::int64_t shares_sent = 0;      // sender: zero-copy shares, total
  std::int64_t mappings_open = 0;    // receiver: received storages alive
  std::int64_t mapped_bytes = 0;     // receiver: their bytes
  std::int64_t mappings_opened = 0;  // receiver: total
};
IpcStats ipc_stats();

}  // namespace ember
