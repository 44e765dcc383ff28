# thermocline_gateway_support: the gateway's pieces that need no gRPC (text streaming with stop
# strings, Prometheus metrics served by cpp-httplib). Included once from the
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
  ${CMAKE_CURRENT_LIST_DIR}/listen_address.cc)
thermocline_target_options(thermocline_gateway_support)
target_include_directories(thermocline_gateway_support SYSTEM PUBLIC ${HTTPLIB_INCLUDE_DIR})
# The macros Debian's libcpp-httplib was built with (its cpp-httplib.pc Cflags): they change
# the layout of httplib::Request and declare SSLServer, so every includer must see the same
# ones as the compiled library (the HTTP API's TLS uses SSLServer).
target_compile_definitions(thermocline_gateway_support PUBLIC
  CPPHTTPLIB_OPENSSL_SUPPORT CPPHTTPLIB_ZLIB_SUPPORT CPPHTTPLIB_BROTLI_SUPPORT)
target_link_libraries(thermocline_gateway_support PUBLIC
  thermocline_shared prometheus-cpp::core ${HTTPLIB_LIBRARY} Threads::Threads)
