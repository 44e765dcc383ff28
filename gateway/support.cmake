# thermocline_gateway_support: the gateway's pieces that need no gRPC (text streaming with stop
# strings, Prometheus metrics served by cpp-httplib, structured logs). Included once from the
# root CMakeLists.txt (the guard makes a second include() harmless), so that the gateway, the
# tools and the tests can all link it.
include_guard(GLOBAL)
# Core only: prometheus-cpp's pull (its civetweb web server) crashes next to OpenBLAS/cuBLAS
# thread-locals (DESIGN.md), so /metrics is served by cpp-httplib.
find_package(prometheus-cpp CONFIG REQUIRED COMPONENTS core)
# Debian builds cpp-httplib as a shared library (the header only declares): link it.
find_path(HTTPLIB_INCLUDE_DIR httplib.h REQUIRED)
find_library(HTTPLIB_LIBRARY cpp-httplib REQUIRED)
add_library(thermocline_gateway_support STATIC
  ${CMAKE_CURRENT_LIST_DIR}/text_stream.cc
  ${CMAKE_CURRENT_LIST_DIR}/metrics.cc
  ${CMAKE_CURRENT_LIST_DIR}/log.cc)
thermocline_target_options(thermocline_gateway_support)
target_include_directories(thermocline_gateway_support SYSTEM PUBLIC ${HTTPLIB_INCLUDE_DIR})
target_link_libraries(thermocline_gateway_support PUBLIC
  thermocline_shared prometheus-cpp::core ${HTTPLIB_LIBRARY} Threads::Threads)
