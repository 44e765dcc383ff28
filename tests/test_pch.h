// Headers nearly every test binary includes, compiled once into a precompiled header that every
// test target reuses (tests/CMakeLists.txt): parsing GoogleTest alone took a third of a test
// file's compile time. System and third-party headers only, so that editing the project's own
// headers never rebuilds the header.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
