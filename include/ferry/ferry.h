// The whole public API of ferry in one include.
#pragma once

#include "ferry/checkpoint.h"
#include "ferry/checkpoint_writer.h"
#include "ferry/cufile.h"
#include "ferry/error.h"
#include "ferry/explain.h"
#include "ferry/file.h"
#include "ferry/memory.h"
#include "ferry/nvfs_stats.h"
#include "ferry/page_cache.h"
#include "ferry/plan.h"
#include "ferry/platform.h"
#include "ferry/route.h"
#include "ferry/runtime.h"
#include "ferry/settings.h"
#include "ferry/stats.h"
#include "ferry/warm_up.h"
