# Included from tests/CMakeLists.txt when the gateway is built (see the comment there).
foreach(_label deploy soak)
  thermocline_add_tests(${_label})
  file(GLOB _srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${_label}/*_test.cc)
  foreach(src ${_srcs})
    get_filename_component(name ${src} NAME_WE)
    target_link_libraries(${name} PRIVATE thermocline_proto thermocline_e2e_proto)
    # They serve stories260K (deploy_cli_test checks per test: most of it needs no model).
    if(NOT name STREQUAL "deploy_cli_test")
      target_sources(${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/require_shared_data.cc)
    endif()
    add_dependencies(${name} thermocline-gateway thermocline-gpu-worker thermocline-cpu-worker
                     thermocline)
  endforeach()
endforeach()
# deploy_cli_test reads deploy/ and docs/ from the source tree.
# It also runs gateway_wire_test without ../shared (the skip-or-fail rule).
if(TARGET deploy_cli_test)
  target_compile_definitions(deploy_cli_test PRIVATE THERMOCLINE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  if(TARGET gateway_wire_test)
    add_dependencies(deploy_cli_test gateway_wire_test)
  endif()
endif()

find_program(SYSTEMD_ANALYZE systemd-analyze)
if(SYSTEMD_ANALYZE)
  add_test(NAME deploy_units_verify
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/deploy/verify_units.sh
                   ${CMAKE_COMMAND} ${CMAKE_BINARY_DIR} ${SYSTEMD_ANALYZE})
  set_tests_properties(deploy_units_verify PROPERTIES LABELS deploy TIMEOUT 300)
else()
  message(STATUS "systemd-analyze not found: deploy_units_verify is not registered")
endif()
