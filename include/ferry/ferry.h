// The whole public API of ferry in one include.
#pragma once

#include "ferry/error.h"
#include "ferry/file.h"
#include "ferry/memory.h"
#include "ferry/route.h"
#include "ferry/settings.h"
#include "ferry/stats.h"
