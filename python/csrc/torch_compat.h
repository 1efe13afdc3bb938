// The one place that knows which PyTorch we build against. One source serves torch 2.1+;
// differences between versions are expressed here as macros.
#pragma once

#include <torch/version.h>

#define SMDDP_TORCH_VERSION (TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR)
#define SMDDP_TORCH_AT_LEAST(major, minor) (SMDDP_TORCH_VERSION >= ((major) * 100 + (minor)))

static_assert(SMDDP_TORCH_AT_LEAST(2, 1), "smddp needs PyTorch 2.1 or newer");
