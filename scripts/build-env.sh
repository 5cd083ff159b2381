# Sourced by scripts/setup, scripts/test and scripts/reliability: what every build of ferry in CI
# shares. docs/ci.md says what each setting saves.
# - ccache (where installed; FERRY_CCACHE=0 turns it off): CMake takes the launcher from these
#   variables when it first configures a tree, so build/, the pip build, build-nocuda/ and the
#   sanitizer and fuzz trees all compile through it. The same sources built with the same flags
#   in two trees (build/ and build-nocuda/; build/ and the pip tree, three levels deeper) then
#   compile once: ccache sees absolute paths (no CCACHE_BASEDIR, unless the caller sets one, which
#   would make them relative to trees of different depths) and leaves the working directory out
#   of the hash (CCACHE_NOHASHDIR; only the DW_AT_comp_dir of -g objects can then name the other
#   tree).
# - lld (where installed): FERRY_LINKER_FLAG is what scripts pass to CMake to link with it.
if [ "${FERRY_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}
  export CMAKE_C_COMPILER_LAUNCHER=${CMAKE_C_COMPILER_LAUNCHER:-ccache}
  export CCACHE_BASEDIR=${CCACHE_BASEDIR-}
  export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
fi
export FERRY_LINKER_FLAG=
if command -v ld.lld >/dev/null; then
  FERRY_LINKER_FLAG=-DFERRY_USE_LLD=ON
fi
