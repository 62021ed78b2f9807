// Where the tests find the checkout's reference files and the build's programs, given at run
// time by one source the build generates (tests/test_paths.cpp.in). Not compile definitions:
// a clone's absolute paths in every test object's preprocessed text would keep ccache from
// reusing the objects another clone of the same commit compiled (CI builds a fresh clone).
#pragma once

namespace largo::test_paths {

// The checkout's tests/ folder: baselines, reference scripts, and ../configs, ../docs.
const char* data_dir();
// The build folder, where the `largo` program is.
const char* binary_dir();

} // namespace largo::test_paths
