"""Helpers shared by the asynchronous-engine tests."""

import time

import torch

import torch_ember
from torch_ember import _C

# Long enough that "returned before its work ran" is observable on a loaded
# machine, short enough to keep the tests quick.
SLEEP = 0.3


def sleep_on_stream(seconds=SLEEP, stream=None):
    """Queue a sleep on `stream` (the current one by default): work launched
    after it has not run until the sleep is over."""
    stream = stream or torch.ember.current_stream()
    _C._engine_enqueue_sleep(stream.device_index, stream.stream_id, seconds)


def returned_before_the_sleep_ended(begin):
    """Whether a call that began at `begin` (time.monotonic) returned before a
    sleep_on_stream(SLEEP) queued just ahead of it could have ended: one that
    waited for the queue takes the whole sleep. The margin (a fifth of the
    sleep) is for a host stalled on a loaded machine (a GC pass, another
    test process on the core), not for any part of the wait."""
    return time.monotonic() - begin < SLEEP * 0.8


def launched_count(op):
    """How many calls of `op` were launched since the last reset."""
    return torch_ember.launch_stats().get(op, {}).get("launched", 0)
