// temp_dir.h: the tests' scratch directory (scratch_dir.h), as the transport tests name it.
#pragma once

#include "scratch_dir.h"

namespace cleave::transport::testing {

using cleave::test::TempDir;

}  // namespace cleave::transport::testing
