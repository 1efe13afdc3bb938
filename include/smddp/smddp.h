// Umbrella header of the smddp C++ API.
#pragma once

#include "smddp/communicator.h"
#include "smddp/errors.h"
#include "smddp/store.h"
#include "smddp/types.h"
#include "smddp/version.h"
