// The headers nearly every glue translation unit parses, compiled once per
// target into a precompiled header (CMakeLists.txt: target_precompile_headers).
// ATen/core/Tensor.h alone declares every operator's method form (~2000
// headers): on 2 cores parsing it in each of ~80 files was a third of a full
// build. Sources still include what they use; this only saves parsing.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>
